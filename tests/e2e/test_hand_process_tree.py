"""A run's whole process tree ends with the run, end to end (DESIGN §8).

A real ``halfpi mind --no-local-hand`` and a real ``halfpi hand``; tool calls
through the scripted agent and the approval flow, as a user drives them
(the set-up of tests/e2e/test_hands.py). Every command marks itself and
all it starts (tests/support/procs.py), and ``ps`` is asked, once the Face
has the run's terminal state, whether anything of it still runs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_hands import (
    HAND,
    World,
    chat_approved,
    is_progress,
    wait_for_hand,
)
from tests.support.cli import hand_add
from tests.support.client import FaceClient
from tests.support.escapes import ESCAPES
from tests.support.mind import MindProcess
from tests.support.procs import Marks
from tests.support.stream import is_event

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(sys.platform != "linux", reason="process trees are read in /proc"),
]

# Grandchildren that each announce themselves once in place, then let go of the pipes.
IGNORES_TERM = "(trap '' TERM; echo ready-ignorer; exec sleep 1000 >/dev/null 2>&1) & "
SETSID = "setsid sh -c 'echo ready-setsid; exec sleep 1000 >/dev/null 2>&1' & "
DAEMON = ("(setsid sh -c 'trap \"\" TERM; echo ready-daemon; exec sleep 1000 >/dev/null 2>&1' &); ")
READY = ("ready-ignorer", "ready-setsid", "ready-daemon")


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    w.hand_token = (await hand_add(w.home, HAND)).token
    try:
        yield w
    finally:
        await w.close()


async def started(world: World) -> tuple[FaceClient, str]:
    world.start_mind()
    world.spawn_hand()
    op = await world.face()
    await wait_for_hand(op, lambda h: h["connected"])
    cid = await op.create_conversation("trees")
    await op.subscribe(cid, detail_mode="transparent")
    return op, cid


def exec_message(command: str, **extra: Any) -> str:
    return "/tool exec_command " + json.dumps({"command": command, "hand": HAND, **extra})


async def all_ready(op: FaceClient, request_id: str) -> None:
    """Until the run's progress (however it was cut in frames) shows every READY word."""

    def text() -> str:
        return "".join(f["payload"]["data"] for f in op.seen if is_progress(f, request_id))

    while not all(word in text() for word in READY):
        await op.expect(lambda f: is_progress(f, request_id), 15)


async def completed(op: FaceClient, request_id: str, timeout: float = 20) -> dict[str, Any]:
    frame = await op.expect(lambda f: is_event(f, "chat.tool_completed", request_id), timeout)
    return dict(frame["payload"]["data"])


async def test_run_cancel_leaves_no_process_of_the_run(world: World, marks: Marks) -> None:
    op, cid = await started(world)
    command = marks.export() + IGNORES_TERM + SETSID + DAEMON + "sleep 1000"
    request_id = await chat_approved(op, cid, exec_message(command))
    await all_ready(op, request_id)
    assert len(marks.ps()) >= 4, "the tree runs (so the test can fail)"
    running = await op.expect(lambda f: is_event(f, "run.changed")
                              and f["payload"]["data"]["status"] == "running")
    cancel = await op.command("face.run.cancel", run_id=running["payload"]["data"]["run_id"])
    assert (await op.reply(cancel, ("face.accepted", "face.result", "face.error")))[
        "type"] != "face.error"

    done = await completed(op, request_id)
    assert done["status"] == "cancelled"
    assert marks.ps() == []


async def test_timeout_leaves_no_process_of_the_run(world: World, marks: Marks) -> None:
    op, cid = await started(world)
    command = marks.export() + IGNORES_TERM + SETSID + DAEMON + "sleep 1000"
    request_id = await chat_approved(op, cid, exec_message(command, timeout_s=2))
    await all_ready(op, request_id)

    done = await completed(op, request_id)
    assert done["status"] == "timed_out"
    assert marks.ps() == []


async def test_what_a_finished_command_left_running_ends_with_its_run(
    world: World, marks: Marks,
) -> None:
    op, cid = await started(world)
    command = marks.export() + IGNORES_TERM + SETSID + DAEMON + "sleep 0.5; echo bye"
    request_id = await chat_approved(op, cid, exec_message(command))

    done = await completed(op, request_id)
    assert done["status"] == "succeeded" and done["result"]["exit_code"] == 0
    assert done["result"]["stdout"].endswith("bye\n")
    assert marks.ps() == []


async def test_a_command_cannot_read_the_hands_token(world: World, marks: Marks) -> None:
    op, cid = await started(world)
    (hand,) = world.hands
    # The path is built as the command runs: the tool policy refuses a command
    # line that names another process's environment, so this proves the
    # layers under it (the scrubbed environment, the Hand's own concealment).
    environ = f"/$d/{hand.proc.pid}/environ"
    command = (marks.export() + 'd=pro; d="${d}c"; echo "env:[$HALFPI_HAND_TOKEN]"; '
               f"tr '\\0' '\\n' < {environ} | grep -c '^HALFPI_HAND_TOKEN=hph_'")
    request_id = await chat_approved(op, cid, exec_message(command))
    done = await completed(op, request_id)
    assert done["result"]["stdout"].splitlines() == ["env:[]", "0"], done
    assert world.hand_token not in json.dumps(done)


async def test_no_escape_shape_outlives_a_command_that_exits_normally(
    world: World, marks: Marks,
) -> None:
    """Issue 23's five shapes, each leaving a process that ignores SIGTERM
    as its command exits: once the Face has the run's terminal state, ``ps``
    shows none of them."""
    op, cid = await started(world)
    for name, shape in ESCAPES.items():
        command = marks.export(name) + shape + "echo bye; exit 0"
        request_id = await chat_approved(op, cid, exec_message(command))
        done = await completed(op, request_id)
        assert done["status"] == "succeeded" and done["result"]["exit_code"] == 0, done
        assert done["result"]["stdout"].endswith("bye\n")
        assert marks.ps(name) == [], name


async def test_a_command_of_the_local_hand_cannot_read_the_minds_process(
    tmp_path: Path, marks: Marks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real Mind with a secret in its environment (a name and value no
    redaction knows, so only the process boundary can keep it), its local
    Hand, and an approved command that builds ``/proc/<mind pid>/environ``
    as it runs: it gets an error (or another process), never the secret."""
    secret = "mind-only-" + os.urandom(16).hex()
    monkeypatch.setenv("PROVIDER_SECRET", secret)
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()  # with its local Hand
    assert mind.proc is not None
    face = await FaceClient.connect(mind.url, mind.token)
    try:
        await wait_for_hand(face, lambda h: h["connected"], hand_id="local")
        cid = await face.create_conversation("proc")
        await face.subscribe(cid, detail_mode="transparent")
        where = f'd=pro; d="${{d}}c"; f="/$d/{mind.proc.pid}"; '
        command = (marks.export() + where
                   + 'tr "\\0" "\\n" < "$f/environ" && echo read-environ || echo no-environ; '
                   + 'tr "\\0" " " < "$f/cmdline"; echo')
        message = "/tool exec_command " + json.dumps({"command": command, "hand": "local"})
        done = await completed(face, await chat_approved(face, cid, message))
        result = done["result"]
        assert "no-environ" in result["stdout"], result
        assert "PROVIDER_SECRET" not in result["stdout"]
        assert secret not in json.dumps(face.seen)
    finally:
        await face.close()
        mind.kill()
