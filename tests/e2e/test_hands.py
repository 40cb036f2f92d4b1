"""Hands end to end (DESIGN §6, §7, §8; I9, I10, I11), with real processes.

A ``halfpi mind --no-local-hand`` subprocess, a separate ``halfpi hand``
subprocess that connects out to it over ``/v1/hand``, and Faces over
WebSocket. Tool calls go through the scripted agent (``/tool NAME JSON``)
and the approval flow, exactly as a user drives them.

Commands that outlive the test's interest write their shell's pid (which is
their process group, the Hand starts each one in its own session) to a file,
so the test can tell whether the group still runs and can always clean it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import platform
import shlex
import signal
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import websockets

from halfpi import __version__
from halfpi.core.backoff import backoff
from halfpi.core.hand_wire import HAND_PROTOCOL
from halfpi.face.client import ConnectionLost, Transport, websocket_connector
from halfpi.gateway.hand_session import PONG_WAIT_S
from halfpi.hand.node import HandNode
from tests.support.cli import face_add, hand_add
from tests.support.client import FaceClient, connect_new_credential
from tests.support.hand import HandProcess
from tests.support.mind import MindProcess
from tests.support.procs import MARK, marked
from tests.support.stream import is_event, is_terminal_event

pytestmark = pytest.mark.e2e

Frame = dict[str, Any]
HAND = "laptop"
HAND_TOOLS = ["exec_command", "read_file"]
TOOL_EVENTS = (
    "chat.tool_called",
    "chat.tool_completed",
    "run.changed",
    "approval.requested",
    "approval.resolved",
)
TICKS = "for i in $(seq 1 20); do echo tick$i; sleep 0.05; done"
TICKS_STDOUT = "".join(f"tick{i}\n" for i in range(1, 21)).encode()


# -- processes ----------------------------------------------------------------------


class World:
    """One Mind home with a Hand credential, and everything started in it."""

    def __init__(self, tmp_path: Path, server: str = "native") -> None:
        self.tmp = tmp_path
        self.server = server  # halfpi mind --server
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.hand_token = ""
        self.mind: MindProcess | None = None
        self.hands: list[HandProcess] = []
        self.faces: list[FaceClient] = []
        self.groups: list[Path] = []

    def start_mind(self, port: int = 0) -> MindProcess:
        self.mind = MindProcess(self.home, port=port, extra_args=("--no-local-hand",),
                                server=self.server)
        return self.mind.start()

    @property
    def url(self) -> str:
        assert self.mind is not None
        return self.mind.url

    @property
    def hand_url(self) -> str:
        return self.url.removesuffix("/v1/face") + "/v1/hand"

    def spawn_hand(self, url: str | None = None, token: str | None = None,
                   hand_id: str = HAND, extra_args: tuple[str, ...] = ()) -> HandProcess:
        log_path = self.tmp / f"hand-{len(self.hands)}.log"
        hand = HandProcess(url or self.hand_url, token or self.hand_token, hand_id, log_path,
                           extra_args)
        self.hands.append(hand)
        return hand

    async def face(self, token: str | None = None) -> FaceClient:
        assert self.mind is not None
        face = await FaceClient.connect(self.url, token or self.mind.token)
        self.faces.append(face)
        return face

    def pid_file(self, name: str) -> Path:
        path = self.work / f"{name}.pid"
        self.groups.append(path)
        return path

    async def close(self) -> None:
        for face in self.faces:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(face.close(), 2)
        for hand in self.hands:
            with contextlib.suppress(Exception):
                hand.kill()
        if self.mind is not None:
            with contextlib.suppress(Exception):
                self.mind.kill()
        for path in self.groups:
            for proc in marked(read_mark(path)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGKILL)


@pytest.fixture
async def world(tmp_path: Path, server_kind: str) -> AsyncIterator[World]:
    w = World(tmp_path, server_kind)
    # Before the Mind starts, so that it knows the credential from its first
    # read of the credential table (a Hand refused with 4001 gives up).
    w.hand_token = (await hand_add(w.home, HAND)).token
    try:
        yield w
    finally:
        await w.close()


# -- helpers ---------------------------------------------------------------------------


def read_mark(path: Path) -> str:
    """The mark a command carries (see :func:`long_command`)."""
    try:
        return path.read_text().strip() or "-"
    except OSError:
        return "-"


def command_alive(path: Path) -> bool:
    """Whether a process of the command marked in ``path`` still runs."""
    return bool(marked(read_mark(path)))


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)  # poll interval


async def list_hands(face: FaceClient) -> list[dict[str, Any]]:
    request_id = await face.command("face.hand.list")
    reply = await face.reply(request_id)
    assert reply["type"] == "face.result", reply
    assert reply["payload"]["status"] == "succeeded", reply
    return list(reply["payload"]["data"]["hands"])


async def wait_for_hand(face: FaceClient, predicate: Callable[[dict[str, Any]], bool],
                        timeout: float = 15.0, hand_id: str = HAND) -> dict[str, Any]:
    """Poll ``face.hand.list`` until the Hand matches ``predicate``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: list[dict[str, Any]] = []
    while loop.time() < deadline:
        last = await list_hands(face)
        for hand in last:
            if hand["hand_id"] == hand_id and predicate(hand):
                return hand
        await asyncio.sleep(0.05)  # poll interval
    raise AssertionError(f"Hand {hand_id!r} never matched within {timeout} s; last list: {last}")


def tool_message(command: str) -> str:
    return "/tool exec_command " + json.dumps({"command": command, "hand": HAND})


async def chat_approved(face: FaceClient, conversation_id: str, content: str) -> str:
    """Send a tool chat, approve its exec_command once; return the chat's request_id."""
    request_id = await face.command("face.chat", conversation_id=conversation_id,
                                    content=content)
    accepted = await face.reply(request_id, ("face.accepted", "face.error"))
    assert accepted["type"] == "face.accepted", accepted
    requested = await face.expect(lambda f: is_event(f, "approval.requested", request_id))
    resolve = await face.command("face.approval.resolve",
                                 approval_id=requested["payload"]["data"]["approval_id"],
                                 decision="allow_once")
    decided = await face.reply(resolve)
    assert decided["type"] == "face.result", decided
    assert decided["payload"]["status"] == "succeeded", decided
    assert decided["payload"]["data"]["outcome"] == "applied", decided
    return request_id


def progress_of(face: FaceClient, request_id: str) -> list[Frame]:
    return [f for f in face.seen if f["type"] == "face.chat.tool.progress"
            and f["payload"]["request_id"] == request_id]


def is_progress(frame: Frame, request_id: str, text: str = "") -> bool:
    return (frame["type"] == "face.chat.tool.progress"
            and frame["payload"]["request_id"] == request_id
            and text in frame["payload"]["data"])


def tool_events(face: FaceClient, conversation_id: str) -> list[dict[str, Any]]:
    """``{type, data}`` of every tool-related event the Face received."""
    return [{"type": f["payload"]["type"], "data": f["payload"]["data"]}
            for f in face.events(conversation_id)
            if f["type"] == "face.event" and f["payload"]["type"] in TOOL_EVENTS]


async def snapshot(face: FaceClient, conversation_id: str) -> dict[str, Any]:
    request_id = await face.command("face.conversation.snapshot",
                                    conversation_id=conversation_id)
    frame = await face.reply(request_id)
    assert frame["type"] == "face.snapshot", frame
    return dict(frame["payload"])


def long_command(world: World, name: str) -> str:
    """Marks itself and all it starts (the mark is recorded in its pid file:
    a pid it could print is its PID namespace's, not this machine's),
    counts its starts, runs long, marks its end."""
    tag = f"lc{os.urandom(6).hex()}-{name}"
    world.pid_file(name).write_text(tag)
    counter, marker = world.work / f"{name}.count", world.work / f"{name}.done"
    return (f"export {MARK}={tag}; echo run >> {shlex.quote(str(counter))}; "
            f"echo started; sleep 20; touch {shlex.quote(str(marker))}")


async def hand_hello(url: str, token: str, hand_id: str) -> str | int | None:
    """Say ``hand.hello`` on ``/v1/hand``: the close code, or the first answer's type."""
    async with websockets.connect(url, open_timeout=10) as ws:
        await ws.send(json.dumps({"type": "hand.hello", "payload": {
            "token": token,
            "hand_id": hand_id,
            "instance_id": os.urandom(8).hex(),
            "info": {"hostname": "h", "os": "o", "arch": "a", "version": "0"},
            "tools": [{"name": "exec_command"}],
            "protocol": HAND_PROTOCOL,
            "runs": [],
        }}))
        try:
            frame = await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd is not None else None
        return str(json.loads(frame)["type"])


# -- tests -------------------------------------------------------------------------------


async def test_long_exec_streams_to_transparent_face_summary_faces_see_only_facts(
    world: World,
) -> None:
    world.start_mind()
    hand = world.spawn_hand()
    op = await world.face()
    listed = await wait_for_hand(op, lambda h: h["connected"])
    assert listed["info"] == {"hostname": socket.gethostname(), "os": platform.system(),
                              "arch": platform.machine(), "version": __version__}
    assert listed["tools"] == HAND_TOOLS
    assert listed["disconnected_at"] is None

    cid = await op.create_conversation("hands")
    assert (await op.subscribe(cid, detail_mode="transparent"))["type"] == "face.accepted"
    summary_op = await world.face()
    assert (await summary_op.subscribe(cid, detail_mode="summary"))["type"] == "face.accepted"
    watcher = await face_add(world.home, "watcher", "--profile", "observer")
    observer = await connect_new_credential(world.url, watcher.token)
    world.faces.append(observer)
    assert (await observer.subscribe(cid))["type"] == "face.accepted"
    # The observer may list Hands too (face:hands:read).
    assert [h["hand_id"] for h in await list_hands(observer) if h["connected"]] == [HAND]

    loop = asyncio.get_running_loop()
    request_id = await chat_approved(op, cid, tool_message(TICKS))
    await op.expect(lambda f: is_progress(f, request_id), 15)
    first_progress_at = loop.time()
    completed = await op.expect(lambda f: is_event(f, "chat.tool_completed", request_id), 15)
    completed_at = loop.time()
    result = await op.reply(request_id, ("face.result", "face.error"), 15)
    assert result["type"] == "face.result", result
    assert result["payload"]["status"] == "succeeded", result
    assert "exec_command succeeded (exit 0)" in result["payload"]["content"]
    assert "tick20" in result["payload"]["content"]
    assert hand.alive(), hand.log()

    # Transparent: arguments, live progress, the full result.
    digest = "sha256:" + hashlib.sha256(TICKS_STDOUT).hexdigest()
    called = next(e["data"] for e in tool_events(op, cid) if e["type"] == "chat.tool_called")
    assert called["request_id"] == request_id
    assert called["tool"] == "exec_command" and called["hand"] == HAND
    assert called["args"] == {"command": TICKS}
    tool_call_id = called["tool_call_id"]
    progress = progress_of(op, request_id)
    assert len(progress) >= 2, progress
    assert all(p["payload"]["tool_call_id"] == tool_call_id for p in progress)
    assert all(p["payload"]["kind"] == "stdout" and not p["payload"]["gap"] for p in progress)
    assert [p["payload"]["call_seq"] for p in progress] == list(range(1, len(progress) + 1))
    assert "".join(p["payload"]["data"] for p in progress).encode() == TICKS_STDOUT
    assert all(len(p["payload"]["data"].encode()) <= 4096 for p in progress)
    # Streamed while the command ran (it takes about a second), not all at the end.
    assert completed_at - first_progress_at > 0.3, (first_progress_at, completed_at)
    done = completed["payload"]["data"]
    assert done["tool_call_id"] == tool_call_id
    assert done["status"] == "succeeded" and done["success"] is True
    assert done["output_bytes"] == len(TICKS_STDOUT)
    assert done["digest"] == digest
    assert done["truncated"] is False
    assert done["result"]["stdout"] == TICKS_STDOUT.decode()
    assert done["result"]["stderr"] == "" and done["result"]["exit_code"] == 0
    statuses = [e["data"]["status"] for e in tool_events(op, cid) if e["type"] == "run.changed"]
    assert "running" in statuses and statuses[-1] == "succeeded", statuses

    # Summary (an operator that asked for it, and an observer by default):
    # the facts, never the arguments, the output or the progress.
    for face in (summary_op, observer):
        await face.expect(lambda f: is_terminal_event(f, request_id), 15)
        assert not [f for f in face.seen if f["type"] == "face.chat.tool.progress"]
        events = tool_events(face, cid)
        kinds = {e["type"] for e in events}
        assert {"chat.tool_called", "run.changed", "chat.tool_completed"} <= kinds, kinds
        for event in events:
            assert "args" not in event["data"] and "result" not in event["data"], event
            text = json.dumps(event["data"])
            assert "tick" not in text and "seq 1 20" not in text, event
        s_called = next(e["data"] for e in events if e["type"] == "chat.tool_called")
        assert s_called["tool_call_id"] == tool_call_id
        assert s_called["args_digest"] == called["args_digest"]
        s_done = next(e["data"] for e in events if e["type"] == "chat.tool_completed")
        assert s_done["status"] == "succeeded" and s_done["success"] is True
        assert s_done["output_bytes"] == len(TICKS_STDOUT)
        assert s_done["digest"] == digest
        s_runs = [e["data"]["status"] for e in events if e["type"] == "run.changed"]
        assert s_runs[-1] == "succeeded", s_runs
        snap = await snapshot(face, cid)
        assert snap["detail_mode"] == "summary"
        [record] = [r for r in snap["tool_history"] if r["tool_call_id"] == tool_call_id]
        assert "args" not in record and "result" not in record, record
        assert record["status"] == "succeeded"
        assert record["output_bytes"] == len(TICKS_STDOUT) and record["digest"] == digest

    # The transparent snapshot keeps the stored display record.
    snap = await snapshot(op, cid)
    [record] = [r for r in snap["tool_history"] if r["tool_call_id"] == tool_call_id]
    assert record["args"] == {"command": TICKS}
    assert record["result"]["stdout"] == TICKS_STDOUT.decode()


async def test_face_token_refused_on_hand_endpoint_and_hand_token_on_face_endpoint(
    world: World,
) -> None:
    world.start_mind()
    assert world.mind is not None
    face_token = world.mind.token

    # A Face token on /v1/hand: refused, whatever the Hand calls itself.
    assert await hand_hello(world.hand_url, face_token, HAND) == 4001
    assert await hand_hello(world.hand_url, face_token, "local") == 4001
    # A Hand token under another name than its credential's label: refused.
    assert await hand_hello(world.hand_url, world.hand_token, "desktop") == 4001

    # A Hand token on /v1/face: refused.
    face = await FaceClient.connect(world.url, hello=False)
    world.faces.append(face)
    await face.send("face.hello", {"token": world.hand_token,
                                   "client": {"name": "test", "version": "0"}, "protocol": 3})
    assert await face.closed_with(10) == 4001

    # A real Hand given a Face token gives up instead of retrying forever.
    refused = world.spawn_hand(token=face_token)
    await until(lambda: not refused.alive(), 15, "the refused Hand to exit")
    op = await world.face()
    assert await list_hands(op) == []

    # The right pairing is welcome (the checks above can tell the difference).
    assert await hand_hello(world.hand_url, world.hand_token, HAND) == "hand.welcome"


async def test_I11_hand_restarted_mid_run_run_is_lost_and_never_rerun(world: World) -> None:
    world.start_mind()
    hand = world.spawn_hand()
    op = await world.face()
    first = await wait_for_hand(op, lambda h: h["connected"])
    cid = await op.create_conversation("hand dies")
    await op.subscribe(cid, detail_mode="transparent")
    command = long_command(world, "job")
    counter, marker = world.work / "job.count", world.work / "job.done"

    request_id = await chat_approved(op, cid, tool_message(command))
    await op.expect(lambda f: is_progress(f, request_id, "started"), 15)
    assert lines(counter) == ["run"]

    hand.kill()
    # A new process is a new instance: the Mind cannot know how the old
    # one's run ended, so the run is lost at once, and never sent again.
    world.spawn_hand()
    lost = await op.expect(lambda f: is_event(f, "run.changed")
                           and f["payload"]["data"]["status"] == "lost", 8)
    completed = await op.expect(lambda f: is_event(f, "chat.tool_completed", request_id), 15)
    done = completed["payload"]["data"]
    assert done["run_id"] == lost["payload"]["data"]["run_id"]
    assert done["status"] == "lost" and done["success"] is False
    assert done["error_category"] == "lost"
    result = await op.reply(request_id, ("face.result", "face.error"), 15)
    assert result["type"] == "face.result", result
    assert result["payload"]["status"] == "succeeded", result
    assert "exec_command lost: the Hand restarted" in result["payload"]["content"], result
    await wait_for_hand(op, lambda h: h["connected"] and h["generation"] > first["generation"])

    # The Hand is back and works; the command was started exactly once and
    # nobody finished it.
    check = await op.command("face.chat", conversation_id=cid, content="/tool read_file "
                             + json.dumps({"path": str(counter), "hand": HAND}))
    checked = await op.reply(check, ("face.result", "face.error"), 15)
    assert checked["payload"]["status"] == "succeeded", checked
    assert "read_file succeeded" in checked["payload"]["content"], checked
    assert lines(counter) == ["run"]
    assert not marker.exists()
    runs = [e["data"] for e in tool_events(op, cid)
            if e["type"] == "run.changed" and e["data"]["run_id"] == done["run_id"]]
    assert runs[-1]["status"] == "lost" and sum(r["status"] == "lost" for r in runs) == 1, runs
    snap = await snapshot(op, cid)
    [record] = [r for r in snap["tool_history"] if r["request_id"] == request_id]
    assert record["status"] == "lost"
    assert snap["active_runs"] == [] and snap["pending_chats"] == []


async def test_I11_restarted_hand_leaves_no_command_of_its_previous_instance(
    world: World,
) -> None:
    """A run declared ``lost`` must not go on producing its effects: once the
    Hand is back as a new instance, the old instance's command is gone."""
    world.start_mind()
    hand = world.spawn_hand()
    op = await world.face()
    await wait_for_hand(op, lambda h: h["connected"])
    cid = await op.create_conversation("leftover")
    await op.subscribe(cid, detail_mode="transparent")
    request_id = await chat_approved(op, cid, tool_message(long_command(world, "leftover")))
    await op.expect(lambda f: is_progress(f, request_id, "started"), 15)
    leftover = world.work / "leftover.pid"
    await until(lambda: command_alive(leftover), 5, "its sleep to run")  # (the shell is unmarked)

    hand.kill()
    world.spawn_hand()
    completed = await op.expect(lambda f: is_event(f, "chat.tool_completed", request_id), 8)
    assert completed["payload"]["data"]["status"] == "lost"
    await wait_for_hand(op, lambda h: h["connected"])
    await until(lambda: not command_alive(leftover), 3,
                "the command of the killed Hand to be stopped")
    assert not (world.work / "leftover.done").exists()


# The grace fired by a real process's scheduler; a killed Hand's disconnect
# under ASGI is proven by test_I11_hand_restarted_mid_run_run_is_lost_and_never_rerun.
@pytest.mark.servers("native")
async def test_I11_hand_away_past_grace_loses_its_run(world: World) -> None:
    # The grace's timing is proven on a fake clock (tests/mind/test_hand_runs.py);
    # this proves a real `halfpi mind` fires it by itself, on time, for a
    # Hand process that was killed. A short grace keeps it quick.
    grace = 1.0
    world.mind = MindProcess(world.home, extra_args=("--no-local-hand", "--hand-grace", str(grace)))
    world.mind.start()
    hand = world.spawn_hand()
    op = await world.face()
    await wait_for_hand(op, lambda h: h["connected"])
    cid = await op.create_conversation("hand away")
    await op.subscribe(cid, detail_mode="transparent")
    counter, marker = world.work / "away.count", world.work / "away.done"

    request_id = await chat_approved(op, cid, tool_message(long_command(world, "away")))
    await op.expect(lambda f: is_progress(f, request_id, "started"), 15)
    loop = asyncio.get_running_loop()
    killed_at = loop.time()  # before the kill: the Mind may see the drop before kill() returns
    hand.kill()
    away = await wait_for_hand(op, lambda h: not h["connected"], 5)
    assert away["disconnected_at"] is not None

    # Not before the grace, and not much after it.
    completed = await op.expect(lambda f: is_event(f, "chat.tool_completed", request_id), 10)
    waited = loop.time() - killed_at
    assert grace <= waited < grace + 5.0, waited
    assert completed["payload"]["data"]["status"] == "lost"
    result = await op.reply(request_id, ("face.result", "face.error"), 10)
    assert result["payload"]["status"] == "succeeded", result
    assert "stayed away too long" in result["payload"]["content"], result

    world.spawn_hand()
    await wait_for_hand(op, lambda h: h["connected"])
    check = await op.command("face.chat", conversation_id=cid, content="/tool read_file "
                             + json.dumps({"path": str(counter), "hand": HAND}))
    checked = await op.reply(check, ("face.result", "face.error"), 15)
    assert "read_file succeeded" in checked["payload"]["content"], checked
    assert lines(counter) == ["run"]
    assert not marker.exists()


async def test_I11_hand_survives_mind_restart_and_kills_abandoned_command(
    world: World,
) -> None:
    mind = world.start_mind()
    hand = world.spawn_hand()
    op = await world.face()
    await wait_for_hand(op, lambda h: h["connected"])
    cid = await op.create_conversation("mind dies")
    await op.subscribe(cid, detail_mode="transparent")
    command = long_command(world, "orphan")
    pid_file = world.work / "orphan.pid"
    counter, marker = world.work / "orphan.count", world.work / "orphan.done"
    content = tool_message(command)

    request_id = await chat_approved(op, cid, content)
    await op.expect(lambda f: is_progress(f, request_id, "started"), 15)
    await until(lambda: command_alive(pid_file), 5, "its sleep to run")  # (the shell is unmarked)

    mind.kill()
    mind.start()  # same home, same port
    op2 = await world.face()
    back = await wait_for_hand(op2, lambda h: h["connected"], 20)
    assert back["tools"] == HAND_TOOLS
    assert hand.alive(), hand.log()

    # The restarted Mind does not know the run: the Hand is told to abandon
    # it and kills it, so its end never happens.
    await until(lambda: not command_alive(pid_file), 10,
                "the Hand to kill the abandoned command")
    assert not marker.exists()
    assert lines(counter) == ["run"]

    snap = await snapshot(op2, cid)
    assert snap["pending_chats"] == [] and snap["active_runs"] == []
    assert snap["pending_approvals"] == []
    [record] = [r for r in snap["tool_history"] if r["request_id"] == request_id]
    assert record["status"] == "lost", record
    assert record["hand"] == HAND and record["tool"] == "exec_command"
    # Asking again with the same request converges on the recorded outcome.
    await op2.command("face.chat", request_id, conversation_id=cid, content=content)
    again = await op2.reply(request_id, ("face.result", "face.error"), 10)
    assert again["type"] == "face.result", again
    assert again["payload"]["status"] == "interrupted", again
    assert lines(counter) == ["run"]
    assert not marker.exists()


async def test_hand_started_before_mind_retries_with_backoff_then_connects(
    world: World,
) -> None:
    # Until the Mind is up, whatever listens on its port speaks no WebSocket:
    # every attempt the Hand makes is counted and dropped.
    attempts = 0

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    try:
        hand = world.spawn_hand(url=f"ws://127.0.0.1:{port}/v1/hand")
        await until(lambda: attempts >= 2, 10, "the Hand to try twice")
        assert hand.alive(), hand.log()
    finally:
        server.close()
        await server.wait_closed()

    world.start_mind(port=port)
    op = await world.face()
    connected = await wait_for_hand(op, lambda h: h["connected"], 20)
    assert connected["tools"] == HAND_TOOLS
    assert hand.alive(), hand.log()


async def test_hand_backoff_starts_over_after_a_successful_connection(world: World) -> None:
    """After a session that was welcomed, the next reconnect waits the
    first backoff step again — not the step after the failures that preceded
    that session. (Jitter off, sleeping recorded, against a real Mind.)"""
    mind = world.start_mind()
    failures = 3
    calls = 0
    slept: list[float] = []

    async def connector(url: str) -> Transport:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise ConnectionLost(None, "refused")
        return await websocket_connector(url)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if calls > failures:  # the wait after the welcomed session: enough seen
            await node.stop()
        await asyncio.sleep(0)

    node = HandNode(world.hand_url, world.hand_token, HAND, connector=connector, sleep=sleep,
                    delays=lambda: backoff(jitter=False))
    task = asyncio.create_task(node.run_forever())
    try:
        await asyncio.wait_for(node.connected.wait(), 15)
        assert slept == [0.25, 0.5, 1.0]
        mind.kill()
        await asyncio.wait_for(task, 15)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert slept[3] == 0.25, f"waited {slept[3]} s before reconnecting, not 0.25 s: {slept}"


def impostor(world: World) -> HandProcess:
    """A second ``halfpi hand`` with the first's token and id, started in a
    folder of its own, where ``whoami.txt`` says ``impostor`` (the first's
    says ``first``): a relative read tells which Hand answered."""
    folder = world.tmp / "impostor"
    folder.mkdir()
    (world.tmp / "whoami.txt").write_text("first\n")
    (folder / "whoami.txt").write_text("impostor\n")
    hand = HandProcess(world.hand_url, world.hand_token, HAND, folder / "hand.log")
    world.hands.append(hand)
    return hand


async def who_answers(face: FaceClient, conversation_id: str) -> str:
    """Which Hand ran a tool call: the ``whoami.txt`` of its folder."""
    request_id = await face.command("face.chat", conversation_id=conversation_id,
                                    content="/tool read_file "
                                    + json.dumps({"path": "whoami.txt", "hand": HAND}))
    result = await face.reply(request_id, ("face.result", "face.error"), 20)
    assert result["type"] == "face.result", result
    assert result["payload"]["status"] == "succeeded", result
    content = str(result["payload"]["content"])
    assert "read_file succeeded" in content, content
    return "impostor" if "impostor" in content else "first" if "first" in content else content


async def test_a_second_link_with_the_same_token_is_refused_while_the_first_lives(
    world: World,
) -> None:
    """Issue: with a stolen token an impostor Hand displaced the real one and
    answered its tool calls. Now it is refused (4029, audited with its
    address in the Mind's log and, where a run waits on the Hand, as a
    ``hand.link_refused`` event) while the first is connected, which keeps
    its tool calls; once the first is gone (kill -9) the second gets in."""
    world.start_mind()
    assert world.mind is not None
    first = world.spawn_hand()
    face = await world.face()
    generation = (await wait_for_hand(face, lambda h: h["connected"]))["generation"]
    cid = await face.create_conversation("displacement")
    assert (await face.subscribe(cid, detail_mode="transparent"))["type"] == "face.accepted"
    waiting = await chat_approved(face, cid, tool_message(long_command(world, "long")))
    await face.expect(lambda f: is_progress(f, waiting, "started"), 15)

    second = impostor(world)
    refused = await face.expect(lambda f: is_event(f, "hand.link_refused"), 20)
    assert refused["payload"]["data"] == {"hand_id": HAND, "address": "127.0.0.1", "count": 1}
    assert ("refused a second link for Hand 'laptop' from 127.0.0.1"
            in world.mind.log()), world.mind.log()
    await until(lambda: "4029" in second.log(), 10, "the refused Hand to say why")
    assert second.alive(), second.log()  # it retries, as told
    reads = await face.create_conversation("reads")
    for _ in range(2):
        assert await who_answers(face, reads) == "first"
    listed = await wait_for_hand(face, lambda h: h["connected"] and bool(h["refused"]))
    assert listed["generation"] == generation
    assert listed["refused"]["count"] >= 1
    assert listed["refused"]["address"] == "127.0.0.1"
    assert world.hand_token not in world.mind.log()

    first.kill()
    await wait_for_hand(face, lambda h: h["connected"] and h["generation"] > generation, 30)
    assert await who_answers(face, reads) == "impostor"


@pytest.mark.servers("native")  # under uvicorn the server's own ping timeout decides
async def test_a_hand_that_stops_answering_pings_is_replaced_by_its_next_link(
    world: World,
) -> None:
    """A first link that is still open but whose Hand no longer answers
    (SIGSTOP: the socket stays, the pongs stop) fails its liveness check
    within PONG_WAIT_S of the claim: the second link then takes its place,
    long before the 45 s after which silence alone would close it."""
    world.start_mind()
    first = world.spawn_hand()
    face = await world.face()
    generation = (await wait_for_hand(face, lambda h: h["connected"]))["generation"]
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        impostor(world)
        await wait_for_hand(face, lambda h: h["connected"] and h["generation"] > generation,
                            PONG_WAIT_S + 10)
        assert loop.time() - started < PONG_WAIT_S + 10
    finally:
        os.kill(first.proc.pid, signal.SIGKILL)
