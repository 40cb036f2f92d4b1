"""The Mind's home on disk: made usable before anything starts, and the
address file through which Faces and Hands find the Mind (DESIGN §12).

Why an address file: ``halfpi mind --port 0`` (or any port but the default)
listens where no Face could guess, and a second Mind on another home must
not be dialled by mistake. The Mind writes ``HOME/mind.json`` once it
listens — the URLs of the port it actually bound — and removes it when it
exits cleanly; ``halfpi face --home DIR`` and ``halfpi hand --home DIR``
read it. A file whose process is gone (a ``kill -9``) is stale and ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ADDRESS_FILE = "mind.json"


class CannotStart(Exception):
    """A user error that stops a command before it does anything (a home that
    cannot be used, a port that cannot be bound). Its message is one line
    for a person; the command line prints it and exits non-zero, never a
    traceback."""


class StaleAddress(Exception):
    """The address file exists but proves nothing: unreadable, or its Mind is gone."""


def prepare_home(home: Path) -> None:
    """Create the home (0700) if needed and prove it is a writable directory,
    or raise :class:`CannotStart` saying which path is in the way and why."""
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise CannotStart(f"the home {home} is a file, not a directory") from None
    except NotADirectoryError:
        blocker = next((p for p in home.parents if p.exists() and not p.is_dir()), home.parent)
        raise CannotStart(f"cannot create the home {home}: {blocker} is not a directory") from None
    except OSError as exc:
        raise CannotStart(f"cannot create the home {home}: {_reason(exc)}") from None
    try:
        with tempfile.TemporaryFile(dir=home, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise CannotStart(f"cannot write in the home {home}: {_reason(exc)}") from None


@dataclass(frozen=True, slots=True)
class Address:
    """Where a running Mind listens: what ``HOME/mind.json`` holds."""

    pid: int
    face_url: str
    hand_url: str
    started_at: float


def write_address(home: Path, address: Address) -> Path:
    """Write ``HOME/mind.json`` atomically (a reader sees the old file or the
    new one, never half of one), mode 0600 whatever the umask."""
    path = home / ADDRESS_FILE
    fd, tmp = tempfile.mkstemp(dir=home, prefix=".mind.json.")  # created 0600
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(address), out)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_address(home: Path, pid: int) -> None:
    """Remove the address file if it is this process's (never another Mind's)."""
    path = home / ADDRESS_FILE
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def read_address(home: Path) -> Address | None:
    """The address of the Mind running on ``home``; ``None`` when there is no
    address file; :class:`StaleAddress` (with a one-line reason) when the
    file is unreadable or the process that wrote it is gone."""
    path = home / ADDRESS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StaleAddress(f"ignoring {path}: {_reason(exc)}") from None
    try:
        raw = json.loads(text)
        address = Address(
            int(raw["pid"]), str(raw["face_url"]), str(raw["hand_url"]), float(raw["started_at"])
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StaleAddress(f"ignoring {path}: not a Mind address file ({exc})") from None
    if not pid_alive(address.pid):
        raise StaleAddress(f"ignoring {path}: its Mind (pid {address.pid}) is not running any more")
    return address


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, and someone else's
    return True


def _reason(exc: OSError) -> str:
    return exc.strerror.lower() if exc.strerror else str(exc)
