"""The Mind's own secrets never leave through a tool (DESIGN §8).

A Hand redacts the *shapes* of halfpi credentials from what its tools say
(``hand/redaction.py``); it does not know the Mind's secrets, and must not.
The Mind does: where tool output arrives (``mind/tools.py``: progress and
results; ``mind/tasks.py``: task logs and errors) it replaces the exact
values of

- the model provider's API key (``$OPENAI_API_KEY``, the key file),
- the metrics token (``--metrics-token-file``),
- the stream key (``HOME/stream.key``, as it is written: hex),
- in cluster mode, the passwords in its store and Redis URLs and
  ``$PGPASSWORD`` (a command line is anyone's to read: ``ps``)

— and the credential shapes again, for a Hand that did not — before
anything is stored, shown or given to the agent. Each redaction is counted
by kind (``halfpi_tool_output_redactions``, with the markers a Hand put in)
and logged in one line that names what and where, never the value.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from halfpi.config import Config
from halfpi.core.hand_wire import CHUNK_BYTES
from halfpi.core.redact import SHAPE_KINDS, Redactor, StreamRedactor, count_markers

log = logging.getLogger("halfpi.mind")

PROVIDER_KEY = "provider API key"
METRICS_TOKEN = "metrics token"
STREAM_KEY = "stream key"
DATABASE_PASSWORD = "database password"
PASSWORD_ENV = "PGPASSWORD"  # as asyncpg reads it
KEY_ENV = "OPENAI_API_KEY"  # as the provider reads it (agents/openai.py)
KEY_FILE = "openai.key"
STREAM_KEY_FILE = "stream.key"
# The markers a Hand may have put in: the shapes, and (the local Hand, which
# is given them) the Mind's own kinds.
HAND_KINDS = (*SHAPE_KINDS, PROVIDER_KEY, METRICS_TOKEN, STREAM_KEY, DATABASE_PASSWORD)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def configured_secrets(config: Config, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The values this Mind holds secret, as they are configured now (value → kind)."""
    found: dict[str, str] = {}
    key_file = config.model.api_key_file if config.model is not None else None
    path = Path(key_file).expanduser() if key_file else config.home / KEY_FILE
    if not path.is_absolute():
        path = config.home / path
    for value, kind in ((environ.get(KEY_ENV, "").strip(), PROVIDER_KEY),
                        (_read(path), PROVIDER_KEY),
                        (config.metrics_token, METRICS_TOKEN),
                        (_read(config.home / STREAM_KEY_FILE), STREAM_KEY)):
        if value:
            found[value] = kind
    # Cluster mode: the passwords of its store and Redis.
    for url in (config.store_url, config.redis_url):
        for value in _passwords(url):
            found[value] = DATABASE_PASSWORD
    if environ.get(PASSWORD_ENV):
        found[environ[PASSWORD_ENV]] = DATABASE_PASSWORD
    return found


def _passwords(url: str | None) -> list[str]:
    """The password a URL holds: after ``user:`` (as written and decoded),
    or as ``?password=``."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        raw = parts.password
    except ValueError:  # not a URL this Mind could use: it holds none
        return []
    found = [raw, unquote(raw)] if raw else []
    return found + [v for v in parse_qs(parts.query).get("password", []) if v]


class OutputRedaction:
    """What the Mind redacts from tool output, and how much it did."""

    def __init__(self, secrets: Callable[[], dict[str, str]]) -> None:
        self._secrets = secrets
        self._redactor = Redactor(secrets())
        self.counts: Counter[str] = Counter()

    @classmethod
    def of(cls, config: Config) -> OutputRedaction:
        return cls(lambda: configured_secrets(config))

    @property
    def redactor(self) -> Redactor:
        """The secrets as they are now: a stream key made after the start
        (on first use) is known from then on."""
        if not any(kind == STREAM_KEY for kind in self._redactor.values.values()):
            self._redactor = Redactor(self._secrets())
        return self._redactor

    def of_bytes(self) -> Redactor:
        """The same secrets, for text read from bytes as Latin-1 (one
        character a byte, so offsets in it are byte offsets: a task's log)."""
        redactor = self.redactor
        values = {v.encode().decode("latin-1"): k for v, k in redactor.values.items()}
        return Redactor(values, shapes=redactor.shapes)

    def stream(self) -> StreamRedactor:
        """One stream of a run's progress (a Face is given 4 KiB at most)."""
        return StreamRedactor(self.redactor, limit=CHUNK_BYTES)

    def result(self, result: dict[str, Any], where: str) -> dict[str, Any]:
        """A run's result with its ``stdout``, ``stderr`` and ``error`` redacted."""
        redacted, found = dict(result), Counter[str]()
        for key in ("stdout", "stderr", "error"):
            value = result.get(key)
            if isinstance(value, str) and value:
                found += count_markers(value, HAND_KINDS)  # what its Hand redacted
                # Its end may be a cut (1 MiB, ``max_bytes``, 4096 characters).
                redacted[key], mine = self.redactor.redact_end(value)
                if mine:
                    redacted["truncated"] = True  # not all the tool wrote is shown
                found += mine
        self.record(found, where)
        return redacted

    def text(self, text: str | None, where: str) -> str | None:
        if not text:
            return text
        shown, found = self.redactor.redact_end(text)
        self.record(found, where)
        return shown

    def record(self, found: Counter[str], where: str) -> None:
        """Count what was redacted, and say so once per output: what, where."""
        if not found:
            return
        self.counts += found
        what = ", ".join(f"{n} {kind}" for kind, n in sorted(found.items()))
        log.warning("tool output redacted: %s (%s)", what, where)
