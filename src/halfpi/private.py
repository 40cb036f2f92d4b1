"""Files halfpi writes are its owner's only (directories 0700, files 0600).

The home holds the database, tokens, logs and the Hand's records: nothing
in it is for other users. Every file is *created* with its final mode (no
window in which another user could open it), whatever the umask, and a
directory that already exists is narrowed to 0700.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) as 0700; narrow it if it exists."""
    if not path.is_dir():
        if not path.parent.exists():
            private_dir(path.parent)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=DIR_MODE)
    with contextlib.suppress(PermissionError):
        if path.stat().st_mode & 0o077:
            path.chmod(DIR_MODE)
    return path


def create_private(path: Path) -> Path:
    """Make sure ``path`` exists as a private file (for a log opened by name)."""
    private_dir(path.parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE))
    with contextlib.suppress(PermissionError):
        os.chmod(path, FILE_MODE)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically with ``data``, mode 0600 from the start."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # never write through something that was left (or planted) there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
