"""A HandNode applies its tool policy (DESIGN §8), driven through a scripted Mind.

The Mind's end of the connection is a queue pair (no sockets): the test
says what the Mind sends and reads what the Hand answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from halfpi.client.transport import Transport
from halfpi.core.policy import Rule
from halfpi.hand import node
from halfpi.hand.executor import TOOLS, Outcome, Progress
from halfpi.hand.node import HandNode, ToolFn
from halfpi.hand.policy import HandPolicy
from tests.hand.test_confinement import USER, python_for
from tests.support.scripted_mind import ScriptedMind

Frame = dict[str, Any]


@dataclass
class World:
    mind: ScriptedMind
    node: HandNode
    root: Path
    home: Path
    token: Path


@contextlib.asynccontextmanager
async def hand(tmp_path: Path, tools: dict[str, ToolFn] | None = None,
               protect: Sequence[str] = (), **rules: Rule) -> AsyncIterator[World]:
    root, home = tmp_path / "work", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    token = home / "hand.token"
    token.write_text("hph_secret\n")
    mind = ScriptedMind()

    async def connector(url: str) -> Transport:
        return mind

    async def stop_instead_of_retrying(seconds: float) -> None:
        await node.stop()

    node = HandNode("ws://mind/v1/hand", "hph_x", "dev", tools=tools, connector=connector,
                    sleep=stop_instead_of_retrying,
                    policy=HandPolicy([root], rules, [home]))
    task = asyncio.create_task(node.run_forever())
    await mind.expect("hand.hello")
    mind.tell("hand.welcome", hand_id="dev", generation=1, adopted=[], abandon=[],
              protect=list(protect))
    await asyncio.wait_for(node.connected.wait(), 10)
    try:
        yield World(mind, node, root, home, token)
    finally:
        await node.stop()
        await mind.close()
        await asyncio.wait_for(task, 10)


async def test_hello_advertises_the_roots_and_rules(tmp_path: Path) -> None:
    async with hand(tmp_path, read_file=Rule.ALWAYS) as w:
        hello = await w.mind.expect("hand.hello")
        assert hello["policy"] == {
            "roots": [str(w.root.resolve())],
            "rules": {"exec_command": "always", "read_file": "always"},
        }
        assert hello["tools"] == [{"name": "exec_command"}, {"name": "read_file"}]


@pytest.mark.parametrize(
    ("where", "verdict"),
    [("inside", "allow"), ("outside", "ask"), ("token", "deny")],
)
async def test_check_is_answered_with_the_hands_verdict(
    tmp_path: Path, where: str, verdict: str
) -> None:
    async with hand(tmp_path) as w:
        paths = {"inside": w.root / "a.txt", "outside": tmp_path / "b.txt", "token": w.token}
        w.mind.tell("hand.check", check_id="k1", tool="read_file",
                    args={"path": str(paths[where])})
        checked = await w.mind.expect("hand.checked", check_id="k1")
        assert checked["verdict"] == verdict, checked
        if verdict == "deny":
            assert checked["category"] == "forbidden_path"


async def run(w: World, run_id: str, tool: str, args: dict[str, Any],
              approved: bool) -> Frame:
    w.mind.tell("hand.run", run_id=run_id, generation=1, tool=tool, args=args,
                timeout_s=30, approved=approved)
    return await w.mind.expect("hand.result", run_id=run_id)


async def test_a_run_that_needs_approval_is_refused_unless_approved(tmp_path: Path) -> None:
    async with hand(tmp_path) as w:
        outside = tmp_path / "outside.txt"
        outside.write_text("far\n")
        refused = await run(w, "x_1", "read_file", {"path": str(outside)}, approved=False)
        assert refused["status"] == "failed"
        assert refused["error_category"] == "approval_required"
        allowed = await run(w, "x_2", "read_file", {"path": str(outside)}, approved=True)
        assert allowed["status"] == "succeeded" and allowed["stdout"] == "far\n"
        (w.root / "in.txt").write_text("in\n")
        inside = await run(w, "x_3", "read_file", {"path": str(w.root / "in.txt")},
                           approved=False)
        assert inside["status"] == "succeeded"


async def test_the_token_is_refused_even_when_approved(tmp_path: Path) -> None:
    async with hand(tmp_path, read_file=Rule.NEVER, exec_command=Rule.NEVER) as w:
        link = w.root / "t"
        link.symlink_to(w.token)
        for n, args in enumerate([{"path": str(w.token)}, {"path": str(link)}]):
            result = await run(w, f"x_{n}", "read_file", args, approved=True)
            assert result["error_category"] == "forbidden_path", result
            assert "hph_secret" not in json.dumps(result)
        result = await run(w, "x_9", "exec_command", {"argv": ["cat", str(w.token)]},
                           approved=True)
        assert result["error_category"] == "forbidden_path", result


async def test_the_minds_home_named_at_welcome_is_protected(tmp_path: Path) -> None:
    mind_home = tmp_path / "mind-home"
    mind_home.mkdir()
    (mind_home / "notes").write_text("x")
    (tmp_path / "plain").write_text("y")
    async with hand(tmp_path, protect=[str(mind_home)], read_file=Rule.NEVER) as w:
        for check_id, path, verdict in (("k1", mind_home / "notes", "deny"),
                                        ("k2", tmp_path / "plain", "allow")):
            w.mind.tell("hand.check", check_id=check_id, tool="read_file",
                        args={"path": str(path)})
            assert (await w.mind.expect("hand.checked", check_id=check_id))["verdict"] == verdict


@pytest.mark.parametrize(
    ("type_", "payload"),
    [
        ("hand.run", {"run_id": "x_1", "tool": "read_file"}),  # no generation
        ("hand.check", {"check_id": "k0", "tool": "read_file", "args": "/etc/hosts"}),
        ("hand.task.log", {"task_id": "t_1", "offset": 0, "page": 2}),  # unknown field
        ("hand.explode", {}),
    ],
    ids=["missing-field", "wrong-type", "unknown-field", "unknown-type"],
)
async def test_a_malformed_message_of_the_mind_is_refused_and_the_hand_serves_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, type_: str, payload: Frame
) -> None:
    """Said once in the log with its stable code; nothing of it runs, and
    the next message is answered on the same link."""
    async with hand(tmp_path) as w:
        w.mind.tell(type_, **payload)
        w.mind.tell("hand.check", check_id="k1", tool="read_file",
                    args={"path": str(w.root / "a.txt")})
        assert (await w.mind.expect("hand.checked", check_id="k1"))["verdict"] == "allow"
        assert w.node.connected.is_set() and w.node.runs == {}
        assert [f["type"] for f in w.mind.from_hand] == ["hand.hello", "hand.checked"]
    refused = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("refused a message from the Mind")]
    assert len(refused) == 1 and "(invalid_request)" in refused[0], refused


async def test_exec_command_is_given_the_protected_paths_to_confine_it(
    tmp_path: Path,
) -> None:
    """When exec_command takes ``deny_paths`` (a kernel-level confinement),
    the Hand passes its protected paths."""
    given: list[Sequence[str]] = []

    async def confined_exec(args: dict[str, Any], progress: Progress,
                            cancelled: asyncio.Event, spawned: Any = None, *,
                            deny_paths: Sequence[str] = ()) -> Outcome:
        given.append(tuple(deny_paths))
        return Outcome("succeeded")

    async with hand(tmp_path, tools={**TOOLS, "exec_command": confined_exec}) as w:
        result = await run(w, "x_1", "exec_command", {"argv": ["true"]}, approved=True)
        assert result["status"] == "succeeded", result
        assert given and str(w.home.resolve()) in given[0]
        assert f"/proc/{os.getpid()}" in given[0]


async def test_exec_command_children_never_see_the_hands_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALFPI_HAND_TOKEN", "hph_must_not_leak")
    monkeypatch.setenv("DEPLOY_PASSWORD", "pw_must_not_leak")
    async with hand(tmp_path) as w:
        for n, args in enumerate([{"command": "env; cat /proc/$$/environ"},
                                  {"argv": ["env"]}]):
            result = await run(w, f"x_{n}", "exec_command", args, approved=True)
            assert result["status"] == "succeeded", result
            assert "PATH=" in result["stdout"]
            assert "must_not_leak" not in result["stdout"], result["stdout"]


UNDUMPABLE_HAND = """
import asyncio, ctypes, os, sys
from pathlib import Path
from halfpi.hand import node
from halfpi.undumpable import is_dumpable

async def serve(self):
    with open("/proc/self/stat", "rb") as handle:  # where exec put the environment
        raw = handle.read()
    fields = raw[raw.rindex(b")") + 2 :].split()
    start, end = int(fields[47]), int(fields[48])
    shown = ctypes.string_at(start, end - start)
    print("dumpable" if is_dumpable() else "non-dumpable",
          "token-shown" if os.environ["HALFPI_HAND_TOKEN"].encode() in shown else "concealed")
    return True

node.HandNode.run_forever = serve
asyncio.run(node.run_hand("ws://127.0.0.1:9/v1/hand", os.environ["HALFPI_HAND_TOKEN"], "h",
                          Path(sys.argv[1])))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl")
def test_a_standalone_hand_is_non_dumpable_before_it_serves(tmp_path: Path) -> None:
    """Its memory holds its token: a command of its user, where no PID
    namespace hides the Hand, must not read ``/proc/<hand>/mem``. The token
    is concealed first (an ordinary user's non-dumpable process cannot read
    its own ``environ``): run as an ordinary user where the test can."""
    src = str(Path(node.__file__).resolve().parents[2])
    python, setpriv = python_for(USER), shutil.which("setpriv")
    state = tmp_path / "state"
    as_user: list[str] = []
    if python is not None and setpriv is not None:
        as_user = [setpriv, f"--reuid={USER}", f"--regid={USER}", "--clear-groups"]
        tmp_path.chmod(0o777)
    done = subprocess.run(
        [*as_user, python or sys.executable, "-c", UNDUMPABLE_HAND, str(state)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([src, sysconfig.get_paths()["purelib"]]),
             "HALFPI_HAND_TOKEN": "hph_" + "s3cret" * 4})
    assert done.stdout.split() == ["non-dumpable", "concealed"], (done.stdout, done.stderr)


async def test_the_start_check_of_confinement_does_not_delay_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Hand says at its start how its commands are confined (a run of
    ``true``, tens of milliseconds); it dials meanwhile, and a check still
    running when it stops is ended with it."""
    checking, ended = asyncio.Event(), asyncio.Event()

    async def slow_check(deny_paths: Sequence[str]) -> None:
        checking.set()
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            ended.set()

    monkeypatch.setattr(node, "announce_confinement", slow_check)
    mind = ScriptedMind()

    async def connector(url: str) -> Transport:
        return mind

    async def stop_instead_of_retrying(seconds: float) -> None:
        await hand_node.stop()

    hand_node = HandNode("ws://mind/v1/hand", "hph_x", "dev", connector=connector,
                         sleep=stop_instead_of_retrying, policy=HandPolicy([tmp_path]))
    hand_node.announce = True
    task = asyncio.create_task(hand_node.run_forever())
    await asyncio.wait_for(mind.expect("hand.hello"), 10)
    assert checking.is_set() and not ended.is_set()
    await hand_node.stop()
    await mind.close()
    await asyncio.wait_for(task, 10)
    assert ended.is_set()
