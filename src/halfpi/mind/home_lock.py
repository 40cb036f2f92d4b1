"""One Mind owns a home (DESIGN §12).

Two Minds on one home would both write its log: each assigns ``seq``s and
ends "orphaned" chats the other is still running. So a Mind takes an
exclusive ``flock`` on ``HOME/mind.lock`` before it opens the store or
writes anything, and holds it for its lifetime; the kernel releases it when
the process ends, however it ends (``kill -9`` included), so there is no
stale lock to clean up. The file's content (pid, host, start time) is only
informational, for the one line a second Mind prints: the flock is the
truth. The file is never deleted (unlinking a lock file lets two processes
lock two different files).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

from halfpi.errors import HomeInUse

LOCK_NAME = "mind.lock"


class HomeLock:
    """The held lock of one home. Release it with :meth:`release` (or let the
    process end); it is also released when the object is collected."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def take(cls, home: Path) -> HomeLock:
        """Lock ``home`` or raise :class:`HomeInUse` naming the holder."""
        path = home / LOCK_NAME
        # Not inheritable (O_CLOEXEC): a child process (a tool run) must not
        # keep the lock after the Mind is gone.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise HomeInUse(
                f"the home {home} is in use by another Mind ({holder}); stop it first,"
                " or give this one another --home"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": started}
        with contextlib.suppress(OSError):  # informational only
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
        return cls(path, fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # also at interpreter exit
            self.release()


def _read(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(info: dict[str, object]) -> str:
    parts = []
    if info.get("pid"):
        parts.append(f"pid {info['pid']}")
    if info.get("host"):
        parts.append(f"on {info['host']}")
    if info.get("started_at"):
        parts.append(f"since {info['started_at']}")
    return " ".join(parts) if parts else "holder unknown"
