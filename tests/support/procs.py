"""Processes a test starts, marked so that none outlives the test.

A test gives every process it starts (commands, Hands) an environment
variable ``HALFPI_TEST_MARK=<mark>-<name>``; a command can also ``export``
it itself (:meth:`Marks.export`), and everything it starts inherits it. The
``marks`` fixture (``tests/conftest.py``) kills every process still carrying
the test's mark when the test ends, passed or failed, so a failing test
never leaves strays behind for the next one.

The environment of a process is what it was given at ``exec`` (Linux shows
it in ``/proc/PID/environ`` and in ``ps e``), so the mark survives
``setsid``, double forks and re-parenting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support import programs

MARK = "HALFPI_TEST_MARK"
PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    state: str
    tag: str

    def __str__(self) -> str:
        return f"pid {self.pid} (ppid {self.ppid}, sid {self.sid}, {self.state}, {self.tag})"


def _stat(pid: int) -> tuple[str, int, int] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[3])


def _tag(pid: int, prefix: bytes) -> str | None:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(MARK) + 1 :].decode(errors="replace")
    return None


def marked(prefix: str) -> list[Proc]:
    """Live processes (zombies excluded) whose mark starts with ``prefix``."""
    wanted = f"{MARK}={prefix}".encode()
    found = []
    for entry in os.listdir(PROC):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        tag = _tag(pid, wanted)
        stat = _stat(pid)
        if tag is not None and stat is not None and stat[0] not in ("Z", "X"):
            found.append(Proc(pid, stat[1], stat[2], stat[0], tag))
    return found


class Marks:
    """One test's mark, and what carries it."""

    def __init__(self) -> None:
        self.mark = "t" + os.urandom(6).hex()

    def tag(self, name: str) -> str:
        return f"{self.mark}-{name}"

    def export(self, name: str = "cmd") -> str:
        """Shell text that marks the command and everything it starts."""
        return f"export {MARK}={self.tag(name)}; "

    def env(self, name: str, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), MARK: self.tag(name)}

    def alive(self, name: str = "") -> list[Proc]:
        return marked(self.tag(name) if name else self.mark)

    def ps(self, name: str = "") -> list[str]:
        """``ps`` lines (with the environment) of live processes carrying the mark."""
        out = subprocess.run(
            [programs.require("ps"), "axeww", "-o", "pid=,stat=,args="],
            capture_output=True, text=True, check=True,
        ).stdout
        needle = f"{MARK}={self.tag(name) if name else self.mark}"
        return [
            line for line in out.splitlines()
            if needle in line and not line.split(None, 2)[1].startswith("Z")
        ]

    async def until_gone(self, name: str = "", timeout: float = 10.0) -> None:
        await until(lambda: not self.alive(name), timeout,
                    f"no process marked {name or 'by this test'} to remain")

    def kill_all(self) -> list[Proc]:
        """SIGKILL every marked process (stopped ones too); return what was found."""
        killed: list[Proc] = []
        for _ in range(50):
            left = self.alive()
            if not left:
                break
            killed += left
            for proc in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGKILL)
        return killed


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)  # poll interval
