"""A real ``halfpi mind`` whose wall clock is stepped an hour either way
keeps every timer on time (issue 23, item 4; docs/operations.md "Clocks").

The Mind runs under libfaketime with a clock file it re-reads at every
call: the test writes ``-1h`` or ``+1h`` into it and the Mind's wall clock
(``time.time``) jumps while its monotonic clock (the event loop's, the
scheduler's) runs on, as when an operator or NTP sets the system time.
Revocation is polled by the maintenance round: a revoked Face closed at
once proves the rounds still run; a Face kept open through a step forward
proves liveness is not measured on the wall clock; its first ``face.ping``
after ``heartbeat_s`` proves the heartbeat's timer.
"""

from __future__ import annotations

import glob
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfpi.config import Config
from halfpi.errors import CloseCode
from tests.support.cli import face_add, face_revoke
from tests.support.client import FaceClient
from tests.support.mind import MindProcess
from tests.support.programs import require, skip_missing


@pytest.fixture
def stepped_mind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[
        tuple[MindProcess, Path]]:
    """A ``halfpi mind`` under libfaketime; the clock file that steps its wall clock."""
    require("faketime")
    libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not libs:
        skip_missing("faketime", "libfaketime.so.1 is not installed (apt-get install faketime)")
    step = tmp_path / "wall-step"
    step.write_text("+0\n")
    (tmp_path / "home").mkdir()
    with monkeypatch.context() as env:  # the Mind only, not the CLI runs of the test
        env.setenv("LD_PRELOAD", libs[0])
        env.setenv("FAKETIME_TIMESTAMP_FILE", str(step))
        env.setenv("FAKETIME_NO_CACHE", "1")
        env.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        mind = MindProcess(tmp_path / "home").start()
    try:
        yield mind, step
    finally:
        mind.kill()


async def revoked_at_once(mind: MindProcess, label: str) -> float:
    """A Face of ``label`` connected, then revoked: how long until its close."""
    added = await face_add(mind.home, label)
    face = await FaceClient.connect(mind.url, added.token)
    started = time.monotonic()
    await face_revoke(mind.home, label)
    assert await face.closed_with(timeout=5.0) == CloseCode.REVOKED
    return time.monotonic() - started


async def test_a_real_mind_keeps_its_timers_when_the_wall_clock_steps(
    stepped_mind: tuple[MindProcess, Path],
) -> None:
    mind, step = stepped_mind
    heartbeat = Config(home=mind.home).heartbeat_s
    owner = await FaceClient.connect(mind.url, mind.token)
    connected = time.monotonic()

    # An hour forward: nobody is presumed dead (liveness counts monotonic time).
    step.write_text("+1h\n")
    assert await revoked_at_once(mind, "tablet") < 2.0  # the rounds run on
    pong = await owner.command("face.ping")
    assert (await owner.reply(pong, ("face.pong",)))["type"] == "face.pong"

    # An hour back: the rounds and the heartbeat keep their pace.
    step.write_text("-1h\n")
    assert await revoked_at_once(mind, "phone") < 2.0
    ping = await owner.expect(lambda f: f["type"] == "face.ping", timeout=heartbeat + 5.0)
    assert ping["type"] == "face.ping"
    assert time.monotonic() - connected < heartbeat + 2.0
    await owner.close()
