"""A small filesystem a test can fill: a tmpfs of a few MiB mounted on a
directory of its own, so that "the disk is full" is real (ENOSPC from the
kernel) and ends when the test frees what it wrote.

Mounting needs the right to mount (root, or a user namespace that allows
it); where there is none the test is skipped with a line that says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_filesystem(where: Path, size: str = "2M") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``where`` (made if missing), unmounted
    on the way out — lazily if a process the test started still holds it."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True, text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=True)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until the filesystem has no page left;
    the file's path (remove it to give the space back)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            os.write(fd, bytes(64 * 1024))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    try:  # the last partial page
        while True:
            os.write(fd, bytes(512))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler
