"""A run's whole process tree ends with the run (DESIGN §8, Tool policy).

Real commands through ``exec_command``: every process a command starts
carries the test's mark (tests/support/procs.py), so after the run the test
looks in ``/proc`` for anything left. Each grandchild announces itself on
stdout once it is in place (after ``setsid``, after its trap) and then lets
go of the output pipe, so that the run cannot wait for it by accident.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from halfpi.hand import cgroup, executor, tree
from halfpi.hand.executor import KILL_GRACE_S, Outcome, ToolError, exec_command
from tests.support.escapes import ESCAPES, QUIET
from tests.support.procs import Marks, until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process trees are read in /proc")

# Grandchildren, each announcing itself once in place, then off the pipes.
IGNORES_TERM = "(trap '' TERM; echo ready-ignorer; exec sleep 1000 >/dev/null 2>&1) &"
SETSID = "setsid sh -c 'echo ready-setsid; exec sleep 1000 >/dev/null 2>&1' &"
DAEMON = ("(setsid sh -c 'trap \"\" TERM; echo ready-daemon; exec sleep 1000 >/dev/null 2>&1' &)"
          "; ")


class Seen:
    """Progress of one run; cancels it once every expected word was printed."""

    def __init__(self, cancel_after: Sequence[str] = ()) -> None:
        self.text = ""
        self.cancel_after = list(cancel_after)
        self.cancelled = asyncio.Event()

    def __call__(self, kind: str, text: str, gap: bool) -> None:
        self.text += text
        if self.cancel_after and all(word in self.text for word in self.cancel_after):
            self.cancelled.set()


async def run(args: dict[str, Any], cancel_after: Sequence[str] = (),
              deny_paths: Sequence[str] = (),
              spawned: Callable[[int], None] | None = None) -> tuple[Outcome, float]:
    seen = Seen(cancel_after)
    loop = asyncio.get_running_loop()
    started = loop.time()
    confine: dict[str, Any] = {"deny_paths": deny_paths} if deny_paths else {}
    outcome = await asyncio.wait_for(
        exec_command(args, seen, seen.cancelled, spawned, **confine), 60)
    return outcome, loop.time() - started


def none_left(marks: Marks) -> None:
    left = marks.alive()
    assert not left, "survived the run: " + "; ".join(map(str, left))


async def test_cancel_ends_children_and_grandchildren(marks: Marks) -> None:
    command = (marks.export() + "sleep 1000 & (sleep 1000; true) & "
               "sh -c 'echo ready-nested; sleep 1000' & wait")
    outcome, _ = await run({"command": command}, ["ready-nested"])
    assert outcome.status == "cancelled"
    none_left(marks)


async def test_cancel_kills_a_grandchild_that_ignores_sigterm(marks: Marks) -> None:
    command = marks.export() + IGNORES_TERM + " sleep 1000"
    outcome, took = await run({"command": command}, ["ready-ignorer"])
    assert outcome.status == "cancelled"
    none_left(marks)
    # SIGTERM first, SIGKILL only after the grace.
    assert KILL_GRACE_S * 0.9 <= took < KILL_GRACE_S + 5, took


async def test_cancel_kills_a_grandchild_that_called_setsid(marks: Marks) -> None:
    command = marks.export() + SETSID + " sleep 1000"
    outcome, _ = await run({"command": command}, ["ready-setsid"])
    assert outcome.status == "cancelled"
    none_left(marks)


async def test_cancel_kills_a_double_forked_daemon_that_ignores_sigterm(marks: Marks) -> None:
    command = marks.export() + DAEMON + "sleep 1000"
    outcome, _ = await run({"command": command}, ["ready-daemon"])
    assert outcome.status == "cancelled"
    none_left(marks)


async def test_timeout_kills_every_kind_of_descendant(marks: Marks) -> None:
    command = (marks.export() + IGNORES_TERM + " " + SETSID + " " + DAEMON
               + "echo ready-all; sleep 1000")
    outcome, took = await run({"command": command, "timeout_s": 1.5})
    assert outcome.status == "timed_out"
    assert outcome.error_category == "timeout"
    assert b"ready-ignorer" in outcome.stdout and b"ready-daemon" in outcome.stdout
    none_left(marks)
    assert took < 1.5 + KILL_GRACE_S + 5, took


async def test_descendants_still_running_when_the_command_exits_are_ended(
    marks: Marks,
) -> None:
    """The decision for a command that exits normally: what it left running
    is ended too (SIGTERM, then SIGKILL after the grace); the run keeps the
    command's own exit status."""
    command = marks.export() + IGNORES_TERM + " " + SETSID + " " + DAEMON + "echo bye"
    outcome, took = await run({"command": command})
    assert outcome.status == "succeeded", outcome
    assert outcome.exit_code == 0
    assert outcome.stdout.endswith(b"bye\n") or b"bye\n" in outcome.stdout
    none_left(marks)
    assert took < KILL_GRACE_S + 5, took


async def test_a_fork_storm_is_ended_completely(marks: Marks) -> None:
    """Processes that keep forking while they are being killed (the tree is
    frozen until it stops growing, so none is missed)."""
    command = (marks.export()
               + "i=0; while [ $i -lt 400 ]; do "
               "(trap '' TERM; exec sleep 1000) >/dev/null 2>&1 & "
               "i=$((i+1)); if [ $i = 30 ]; then echo ready-storm; fi; done; wait")
    outcome, _ = await run({"command": command}, ["ready-storm"])
    assert outcome.status == "cancelled"
    none_left(marks)


async def test_a_process_that_forks_when_terminated_is_killed_with_its_new_children(
    marks: Marks,
) -> None:
    command = (marks.export()
               + "trap '(trap \"\" TERM; exec sleep 1000) >/dev/null 2>&1 &' TERM; "
               "echo ready-respawn; while :; do sleep 0.05; done")
    outcome, _ = await run({"command": command}, ["ready-respawn"])
    assert outcome.status == "cancelled"
    none_left(marks)


async def test_exit_status_is_reported_precisely(marks: Marks) -> None:
    failed, _ = await run({"command": marks.export() + "echo out; echo err >&2; exit 7"})
    assert (failed.status, failed.exit_code, failed.error_category) == (
        "failed", 7, "nonzero_exit")
    assert (failed.stdout, failed.stderr) == (b"out\n", b"err\n")
    killed, _ = await run({"argv": ["sh", "-c", marks.export() + "kill -KILL $$"]})
    assert (killed.status, killed.exit_code) == ("failed", -9)
    ok, _ = await run({"argv": ["true"]})
    assert (ok.status, ok.exit_code) == ("succeeded", 0)
    none_left(marks)


async def test_a_command_that_kills_its_supervisor_leaves_nothing_behind(
    marks: Marks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Hand notices that the run's supervisor died before it reported
    and ends what the run left by itself (its cgroup, its session, its
    mark). Without a PID namespace (forced off): in one, a command cannot
    see its supervisor."""
    monkeypatch.setenv("HALFPI_PIDNS", "off")
    # (Never this test's own process, should the command be its child.)
    command = (marks.export() + SETSID + " " + DAEMON
               + f"sleep 0.3; [ $PPID = {os.getpid()} ] || kill -KILL $PPID; sleep 1000")
    supervisors: list[int] = []
    outcome, _ = await run({"command": command}, spawned=supervisors.append)
    assert outcome.status == "failed"
    assert outcome.error_category == "supervisor_died"
    none_left(marks)
    base = cgroup.run_base()
    if base is not None:  # and its cgroup is removed
        assert [name for name in os.listdir(base)
                if name.startswith(f"{cgroup.PREFIX}{supervisors[0]}-")] == []


async def test_a_command_that_cannot_start_is_a_spawn_failure(tmp_path: Any) -> None:
    with pytest.raises(ToolError) as caught:
        await run({"argv": [str(tmp_path / "no-such-program")]})
    assert caught.value.category == "spawn_failed"
    assert "no-such-program" in str(caught.value)


async def test_the_command_does_not_inherit_the_hand_token(
    marks: Marks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HALFPI_HAND_TOKEN", "hph_secret")
    outcome, _ = await run({"command": marks.export() + 'echo "[$HALFPI_HAND_TOKEN]"; env'})
    assert outcome.status == "succeeded"
    assert outcome.stdout.startswith(b"[]\n")
    assert b"hph_secret" not in outcome.stdout


async def test_output_is_streamed_while_the_command_runs(marks: Marks) -> None:
    seen = Seen()
    cancelled = asyncio.Event()
    task = asyncio.create_task(exec_command(
        {"command": marks.export() + "echo one; sleep 0.5; echo two"}, seen, cancelled))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while "one" not in seen.text:
        assert loop.time() < deadline and not task.done(), seen.text
        await asyncio.sleep(0.01)
    assert "two" not in seen.text
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.stdout == b"one\ntwo\n"
    assert os.environ.get("HALFPI_TEST_MARK") is None  # the mark stays in the command


async def test_without_a_supervisor_the_process_group_is_ended_best_effort(
    marks: Marks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Elsewhere than Linux (here forced): the command's process group gets
    SIGTERM, then SIGKILL after the grace — also when the command itself
    exits first; a process that left the group is out of reach."""
    monkeypatch.setattr(tree, "SUPERVISED", False)
    outcome, took = await run({"command": marks.export() + IGNORES_TERM + " sleep 1000"},
                              ["ready-ignorer"])
    assert outcome.status == "cancelled"
    assert KILL_GRACE_S * 0.9 <= took < KILL_GRACE_S + 5, took
    none_left(marks)
    exited, _ = await run({"command": marks.export() + IGNORES_TERM + " echo bye; exit 3"})
    assert (exited.status, exited.exit_code) == ("failed", 3)
    none_left(marks)
    confined, _ = await run({"argv": ["true"]}, deny_paths=["/nonexistent"])
    assert confined.extra == {"confined": False, "confinement": "none"}


# -- A command that exits normally: what it left running ends with the run ---------------
# (the shapes: tests/support/escapes.py)

TRACKING = ("cgroup", "subreaper")
ESCAPE_RUNS = 20


@pytest.fixture(params=TRACKING)
def tracking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the run's processes are tracked: a cgroup of its own, where the
    Hand can make one (forced off for the other case), or the subreaper."""
    if request.param == "cgroup":
        if not cgroup_usable():
            pytest.skip("no cgroup v2 here that this process can make a child of")
        monkeypatch.delenv("HALFPI_CGROUP", raising=False)
    else:
        monkeypatch.setenv("HALFPI_CGROUP", "off")
    # A short grace (every shape ignores SIGTERM, so each run waits it out).
    monkeypatch.setattr(executor, "KILL_GRACE_S", 0.3)
    return str(request.param)


def cgroup_usable() -> bool:
    return cgroup.run_base() is not None


async def test_each_escape_shape_really_outlives_a_plain_command(marks: Marks) -> None:
    """Without a Hand (a plain ``sh -c``), each shape leaves a process
    behind: the tests below can fail."""
    for name, shape in ESCAPES.items():
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", marks.export(name) + shape + "exit 0",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        assert await proc.wait() == 0
        await until(lambda name=name: bool(marks.ps(name)), 10, f"{name} to leave a process")
    marks.kill_all()


@pytest.mark.parametrize("shape", list(ESCAPES))
async def test_nothing_a_command_left_outlives_its_normal_exit(
    marks: Marks, tracking: str, shape: str,
) -> None:
    # The command names the run cgroup that holds it, if one does.
    where = f'grep -lx "$$" {cgroup.run_base() or "/nonexistent"}/halfpi-run-*/cgroup.procs; '
    for attempt in range(ESCAPE_RUNS):
        command = marks.export(f"{shape}{attempt}") + where + ESCAPES[shape]
        outcome, _ = await run({"command": command + "exit 0"})
        assert (outcome.status, outcome.exit_code) == ("succeeded", 0), outcome
        in_own_cgroup = b"/halfpi-run-" in outcome.stdout
        assert in_own_cgroup == (tracking == "cgroup"), outcome.stdout
        assert marks.ps() == [], f"attempt {attempt}: {marks.ps()}"


@pytest.mark.skipif(os.geteuid() != 0, reason="a command of an ordinary user has no capability")
@pytest.mark.parametrize("confined", [False, True], ids=["nothing-denied", "paths-denied"])
async def test_a_root_command_has_no_capability_that_reads_another_process(
    marks: Marks, tmp_path: Any, confined: bool,
) -> None:
    """CAP_SYS_PTRACE, CAP_SYS_ADMIN and CAP_PERFMON each read a
    non-dumpable process's ``/proc/<pid>/environ`` (the Mind's): none is in
    a command's bounding set, however it is confined."""
    outcome, _ = await run({"command": marks.export() + "grep CapBnd /proc/self/status"},
                           deny_paths=[str(tmp_path / "denied")] if confined else [])
    bounding = int(outcome.stdout.split()[1], 16)
    for cap in (19, 21, 38):  # CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON
        assert not bounding & (1 << cap), (cap, hex(bounding))
    assert bounding & (1 << 0), "CAP_CHOWN stays: only those are dropped"


@pytest.mark.skipif(not cgroup_usable(), reason="no run cgroup here")
async def test_a_daemon_moved_out_of_the_runs_cgroup_is_still_ended(marks: Marks) -> None:
    """A root command may move itself to another cgroup (where the hierarchy
    is not mounted with nsdelegate, its cgroup namespace does not stop it):
    it is still a descendant of the supervisor, and the sweep ends it."""
    base = cgroup.run_base()
    escape = ('f="$(mktemp -u)"; mkfifo "$f"; '
              f"(setsid sh -c 'echo $$ > {base}/cgroup.procs && echo moved; echo > \"$0\"; "
              f"trap \"\" TERM; exec sleep 1000 {QUIET}' \"$f\" &); "
              'read moved < "$f"; rm -f "$f"; ')  # once it has moved
    outcome, _ = await run({"command": marks.export() + escape + "exit 0"})
    assert outcome.status == "succeeded", outcome
    assert b"moved" in outcome.stdout, "it did leave the cgroup (so the test can fail)"
    assert marks.ps() == []


async def test_a_command_sees_only_its_own_runs_processes(marks: Marks, tmp_path: Any) -> None:
    """In its PID namespace a command's ``/proc`` holds its run alone (the
    namespace's init, itself, its children): not this process, not its
    supervisor, which it can neither see nor signal (its parent is 0)."""
    probe = (marks.export() + f"[ -e /proc/{os.getpid()} ] && echo sees-the-hand; "
             'echo "ppid=$PPID"; ls /proc | grep -c "^[0-9]"')
    for deny in ([], [str(tmp_path / "denied")]):
        outcome, _ = await run({"command": probe}, deny_paths=deny)
        assert outcome.stdout.decode().split() == ["ppid=0", "4"], outcome  # init, sh, ls, grep
