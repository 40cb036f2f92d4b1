"""A Hand killed with ``kill -9`` leaves nothing running (DESIGN §8, I11).

A Hand instance here is a real process that runs one command through
``exec_command`` and records it in its leftovers file, as ``HandNode`` does.
When it dies, the run's supervisor ends the tree by itself (it asked the
kernel for a signal when its parent dies); when the supervisor could not —
killed too, or stopped — the next instance ends what the record points to.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from halfpi.hand import cgroup, proctree
from halfpi.hand.executor import KILL_GRACE_S
from halfpi.hand.leftovers import Leftovers
from tests.support.procs import Marks, until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process trees are read in /proc")

HAND = """
import asyncio, sys
from pathlib import Path
from halfpi.hand.executor import exec_command
from halfpi.hand.leftovers import Leftovers

async def main() -> None:
    leftovers = Leftovers(Path(sys.argv[1]))
    def progress(kind: str, text: str, gap: bool) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
    await exec_command({"command": sys.argv[2]}, progress, asyncio.Event(),
                       lambda pid: leftovers.spawned("run-1", pid))

asyncio.run(main())
"""

TREE = ("(trap '' TERM; echo ready-ignorer; exec sleep 1000 >/dev/null 2>&1) & "
        "setsid sh -c 'echo ready-setsid; exec sleep 1000 >/dev/null 2>&1' & "
        "(setsid sh -c 'trap \"\" TERM; echo ready-daemon; exec sleep 1000 >/dev/null 2>&1' &); "
        "sleep 1000")
READY = ("ready-ignorer", "ready-setsid", "ready-daemon")


class HandInstance:
    def __init__(self, proc: asyncio.subprocess.Process, record: Path) -> None:
        self.proc = proc
        self.record = record

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        seen = ""
        while not all(word in seen for word in READY):
            line = await asyncio.wait_for(self.proc.stdout.readline(), 15)
            assert line, f"the Hand instance ended early; it printed {seen!r}"
            seen += line.decode()

    def supervisor(self) -> int:
        (run,) = json.loads(self.record.read_text()).values()
        return int(run["supervisor"])

    async def kill(self) -> None:
        """``kill -9``: no cleanup of its own."""
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()


async def start_hand(tmp_path: Path, marks: Marks, pidns: bool) -> HandInstance:
    record = tmp_path / "hands" / "dev.runs.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HAND, str(record), marks.export("cmd") + TREE,
        env=marks.env("hand", {**os.environ, "HALFPI_PIDNS": "on" if pidns else "off"}),
        stdout=subprocess.PIPE)
    instance = HandInstance(proc, record)
    await instance.ready()
    # The words are printed before each ``exec sleep``, and the last
    # ``sleep 1000`` starts after them: wait until all four run.
    await until(lambda: len(marks.alive("cmd")) >= 4, 15, "the whole tree to run")
    return instance


@pytest.fixture
async def hand(tmp_path: Path, marks: Marks) -> AsyncIterator[HandInstance]:
    """A Hand whose runs have no PID namespace (forced off): what the
    leftovers are for. (In one, the run dies with its supervisor: below.)"""
    instance = await start_hand(tmp_path, marks, pidns=False)
    try:
        yield instance
    finally:
        if instance.proc.returncode is None:
            await instance.kill()


async def test_hand_killed_mid_run_its_supervisor_ends_the_tree(
    hand: HandInstance, marks: Marks,
) -> None:
    assert len(marks.alive("cmd")) >= 4
    await hand.kill()
    # SIGTERM at once, SIGKILL after the grace to those that ignore it.
    await marks.until_gone("cmd", KILL_GRACE_S + 5)
    await marks.until_gone("hand", 5)  # the supervisor too


async def test_a_new_hand_instance_ends_what_a_dead_supervisor_left(
    hand: HandInstance, marks: Marks,
) -> None:
    os.kill(hand.supervisor(), signal.SIGKILL)
    await hand.kill()
    left = marks.alive("cmd")
    assert len(left) >= 4, "nothing ended the tree: the next instance must"
    assert any(p.sid != left[0].sid for p in left), "one of them is in a session of its own"

    group = json.loads(hand.record.read_text())["run-1"].get("cgroup")
    if cgroup.run_base() is not None:  # the run had a cgroup of its own: it goes too
        assert group and os.path.isdir(group), group

    killed = await Leftovers(hand.record).kill_all()
    assert killed == 1
    assert marks.alive("cmd") == []
    assert json.loads(hand.record.read_text()) == {}
    assert await Leftovers(hand.record).kill_all() == 0
    assert group is None or not os.path.exists(group)


async def test_in_a_pid_namespace_the_run_dies_with_its_supervisor(
    tmp_path: Path, marks: Marks,
) -> None:
    """Its supervisor and its Hand killed outright: the namespace's init
    dies with the supervisor, and every process of the run with the init —
    nothing is left for the next instance."""
    instance = await start_hand(tmp_path, marks, pidns=True)
    try:
        os.kill(instance.supervisor(), signal.SIGKILL)
        await instance.kill()
        await marks.until_gone("cmd", 5)
        # The next instance has nothing left to end (the namespace's init may
        # still be exiting); it removes the run's cgroup.
        record = json.loads(instance.record.read_text())["run-1"]
        await Leftovers(instance.record).kill_all()
        assert proctree.run_members(record["supervisor"], record["started"],
                                    proctree.table()) == set()
        assert record["cgroup"] is None or not os.path.exists(record["cgroup"])
    finally:
        if instance.proc.returncode is None:
            await instance.kill()


async def test_a_new_hand_instance_ends_a_stuck_supervisor_and_its_tree(
    hand: HandInstance, marks: Marks,
) -> None:
    supervisor = hand.supervisor()
    os.kill(supervisor, signal.SIGSTOP)  # cannot act on the Hand's death
    await hand.kill()
    assert len(marks.alive("cmd")) >= 4

    assert await Leftovers(hand.record).kill_all() == 1
    assert marks.alive("cmd") == []
    assert [p for p in marks.alive("hand") if p.pid == supervisor] == []


async def test_a_record_of_an_earlier_version_still_ends_its_process_group(
    tmp_path: Path, marks: Marks,
) -> None:
    """Before supervisors, the record held each command's process group."""
    proc = subprocess.Popen(["sh", "-c", marks.export("old") + "sleep 1000 & sleep 1000"],
                            start_new_session=True)
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
        started = int(stat[stat.rindex(")") + 2 :].split()[19])
        record = tmp_path / "dev.runs.json"
        record.write_text(json.dumps({"run-1": [proc.pid, started]}))
        await marks_appear(marks, "old", 2)
        assert await Leftovers(record).kill_all() == 1
        assert marks.alive("old") == []
    finally:
        proc.kill()
        proc.wait()


async def marks_appear(marks: Marks, name: str, count: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while len(marks.alive(name)) < count:
        assert loop.time() < deadline, marks.alive(name)
        await asyncio.sleep(0.02)
