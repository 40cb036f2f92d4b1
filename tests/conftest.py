from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support import programs
from tests.support.mind import LocalMind, MindProcess, local_mind
from tests.support.procs import Marks
from tests.support.proxy import FaultProxy


@pytest.fixture
async def lmind(tmp_path: Path) -> AsyncIterator[LocalMind]:
    async with local_mind(tmp_path / "home") as m:
        yield m


@pytest.fixture
def mind_proc(tmp_path: Path) -> Iterator[MindProcess]:
    proc = MindProcess(tmp_path / "home")
    (tmp_path / "home").mkdir()
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def proxy_to(mind_proc: MindProcess) -> AsyncIterator[FaultProxy]:
    proxy = await FaultProxy(mind_proc.port).start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.fixture
def marks() -> Iterator[Marks]:
    """A mark for the processes this test starts; whatever still carries it
    when the test ends is killed (see tests/support/procs.py)."""
    m = Marks()
    try:
        yield m
    finally:
        m.kill_all()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """ONE line at the end of a run that skipped tests for a missing system
    program, naming what to install (tests/support/programs.py); after the
    short summary's list of skips, so it is not lost above them."""
    yield
    skipped = terminalreporter.stats.get("skipped", [])
    line = programs.summary([str(report.longrepr) for report in skipped])
    if line is not None:
        terminalreporter.write_line(line, yellow=True, bold=True)
