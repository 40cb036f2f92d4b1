"""No log line of a test's processes holds a secret (docs/operations.md,
"Logs"; DESIGN §11).

``logs_hold_no_secret`` is an autouse fixture of the end-to-end, cluster
and chaos suites: after each test it reads every ``*.log`` file under the
test's ``tmp_path`` (the Minds', Hands' and cluster nodes' stderr) and every
line the ``halfpi`` loggers wrote in the test process (an in-process Mind,
at debug level for the test), and fails the test if one holds a Face or
Hand token or a stream ticket (by their prefixes, whoever made them), the
stream key of a home under ``tmp_path``, or the text of a ``*.token`` file
there. ``session_logs_hold_no_secret`` does the same once the session ends
over every folder the session made (Minds a whole module shares).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

# A Face token, a Hand token, a stream ticket (mind/auth.py, mind/tickets.py):
# prefix + at least 20 characters of token_urlsafe.
TOKEN_RE = re.compile(r"\bhp[fhs]_[A-Za-z0-9_-]{20,}")
SECRET_FILES = ("*.token", "*.key")  # Face/Hand tokens, the stream key, a provider API key
MAX_SECRET_FILE = 4096
MIN_SECRET = 16  # shorter files (a test's empty or bad token file) are no secret


class Lines(logging.Handler):
    """Every record the halfpi loggers emit in this process, formatted."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def secrets_under(root: Path) -> set[str]:
    """The texts of the secret files under ``root`` (a token, the stream
    key as it is stored and as hex)."""
    found: set[str] = set()
    for pattern in SECRET_FILES:
        for path in root.rglob(pattern):
            if not path.is_file() or path.stat().st_size > MAX_SECRET_FILE:
                continue
            data = path.read_bytes()
            text = data.decode(errors="ignore").strip()
            if len(data) >= MIN_SECRET and len(text) >= MIN_SECRET:
                found.add(text)
            if len(data) >= MIN_SECRET:  # a short file's hex is in many a line
                found.add(data.hex())
    return found


def leaks(lines: list[str], secrets: set[str]) -> list[str]:
    """The lines that hold a token-shaped string or one of ``secrets``."""
    return [line for line in lines
            if TOKEN_RE.search(line) or any(secret in line for secret in secrets)]


def log_lines(root: Path) -> list[str]:
    lines: list[str] = []
    for path in sorted(root.rglob("*.log")):
        if path.is_file():
            lines.extend(f"{path.name}: {line}"
                         for line in path.read_text(errors="replace").splitlines())
    return lines


@pytest.fixture(autouse=True)
def logs_hold_no_secret(tmp_path: Path) -> Iterator[None]:
    handler = Lines()
    logger = logging.getLogger("halfpi")
    level = logger.level
    logger.setLevel(logging.DEBUG)  # an in-process Mind's every line, as at --log-level debug
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    found = leaks(handler.lines + log_lines(tmp_path), secrets_under(tmp_path))
    assert not found, "a log line holds a secret:\n" + "\n".join(found[:5])


@pytest.fixture(autouse=True, scope="session")
def session_logs_hold_no_secret(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same check once the session ends, over every folder it made: the
    logs of Minds a whole module shares (``tmp_path_factory``) too."""
    yield
    root = tmp_path_factory.getbasetemp()
    found = leaks(log_lines(root), secrets_under(root))
    assert not found, "a log line holds a secret:\n" + "\n".join(found[:5])
