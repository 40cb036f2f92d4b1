"""Regression tests for defects found in review, each of which once failed.

Each pins the behaviour the contract (DESIGN.md, docs/) asks for at a place
where the code used to break it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from halfpi.core.scopes import scopes_for
from halfpi.face.view import ConversationView
from halfpi.gateway.session import FaceSession
from halfpi.mind.auth import make_credential
from halfpi.store.base import TxOutcome, WriteTx
from tests.support.client import FaceClient
from tests.support.frames import event, events_of
from tests.support.mind import LocalMind, hand_ready, local_mind
from tests.support.store import HeldCommits

# -- helpers ---------------------------------------------------------------------------


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition of the in-process Mind (polled, bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not reached in time")
        await asyncio.sleep(0.01)


async def approve_next(face: FaceClient, chat_id: str) -> None:
    requested = await face.expect(event("approval.requested", request_id=chat_id))
    resolve_id = await face.command(
        "face.approval.resolve",
        approval_id=requested["payload"]["data"]["approval_id"],
        decision="allow_once",
    )
    reply = await face.reply(resolve_id)
    assert reply["payload"]["data"]["outcome"] == "applied", reply


# -- 1. a cancel that lands while the chat's admission commits is lost -----------------


async def test_cancel_during_admission_commit_cancels_the_chat(lmind: LocalMind) -> None:
    asker = await FaceClient.connect(lmind.url, lmind.token)
    other = await FaceClient.connect(lmind.url, lmind.token)  # the same principal elsewhere
    cid = await asker.create_conversation()
    held = HeldCommits(
        lmind.mind.store, lambda tx: tx.admit is not None and tx.admit.type == "face.chat"
    )
    lmind.mind.store = held  # type: ignore[assignment]
    chat_id = await asker.command("face.chat", conversation_id=cid, content="hello world")
    await asyncio.wait_for(held.arrived.wait(), 10)
    cancel_id = await other.command(
        "face.chat.cancel", conversation_id=cid, target_request_id=chat_id
    )
    accepted = await other.reply(cancel_id, ("face.accepted", "face.error"))
    assert accepted["type"] == "face.accepted", accepted  # the Mind took the cancel
    await held.release()
    lmind.mind.store = held.inner

    result = await asker.reply(chat_id, ("face.result", "face.error"))
    cancel = await other.reply(cancel_id)
    # The agent was never told to stop: the reply ran to its end.
    assert result["payload"]["status"] == "cancelled", result
    assert cancel["payload"]["data"]["outcome"] == "cancelled", cancel
    await asker.close()
    await other.close()


# -- 2. a second cancel while a tool run is being cancelled leaves the call open -------

STUBBORN = '/tool exec_command {"command": "trap \'\' TERM; echo ready; sleep 30"}'


async def test_second_cancel_during_tool_cancel_still_completes_the_call(
    lmind: LocalMind,
) -> None:
    await hand_ready(lmind)
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    chat_id = await face.command("face.chat", conversation_id=cid, content=STUBBORN)
    await approve_next(face, chat_id)
    await face.expect(
        lambda f: f["type"] == "face.chat.tool.progress" and "ready" in f["payload"]["data"]
    )
    # An impatient person presses cancel twice (or two Faces cancel at once).
    first = await face.command("face.chat.cancel", conversation_id=cid, target_request_id=chat_id)
    await face.reply(first, ("face.accepted",))
    second = await face.command("face.chat.cancel", conversation_id=cid, target_request_id=chat_id)
    await face.reply(second, ("face.accepted",))
    ended = await face.expect(event("chat.cancelled", request_id=chat_id), timeout=20)
    (called,) = events_of(face.seen, "chat.tool_called", request_id=chat_id)
    tool_call_id = called["payload"]["data"]["tool_call_id"]
    completed = [
        f
        for f in events_of(face.seen, "chat.tool_completed", tool_call_id=tool_call_id)
        if f["payload"]["seq"] < ended["payload"]["seq"]
    ]
    # Let the Hand finish killing the command before looking at the record.
    await face.expect(event("run.changed", status="cancelled"), timeout=20)
    snap_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    snap = await face.reply(snap_id)
    statuses = [r["status"] for r in snap["payload"]["tool_history"]]
    assert completed, "the chat ended with its tool call still open"
    assert statuses == ["cancelled"], statuses
    await face.close()


# -- 3. a tool argument of the wrong type crashes the call and leaves it open ----------


async def test_bad_timeout_argument_completes_the_call_as_failed(
    lmind: LocalMind, tmp_path: Path
) -> None:
    await hand_ready(lmind)
    target = tmp_path / "notes.txt"
    target.write_text("body\n")
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    content = "/tool read_file " + json.dumps({"path": str(target), "timeout_s": "soon"})
    result = await face.chat_to_end(cid, content)
    chat_id = result["payload"]["request_id"]
    (called,) = events_of(face.seen, "chat.tool_called", request_id=chat_id)
    tool_call_id = called["payload"]["data"]["tool_call_id"]
    completed = events_of(face.seen, "chat.tool_completed", tool_call_id=tool_call_id)
    snap_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    snap = await face.reply(snap_id)
    statuses = [r["status"] for r in snap["payload"]["tool_history"]]
    assert result["payload"].get("error_code") != "internal_error", result
    assert completed, "the tool call was never completed"
    assert statuses != ["running"], statuses
    await face.close()


# -- 4. a subscription installed after its connection closed is never removed ----------


class HeldReads:
    """Wraps the Mind's store: ``messages`` (the snapshot's page read) waits
    for :attr:`gate` so the test can close a connection mid-command."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.arrived = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def messages(self, *args: Any, **kwargs: Any) -> Any:
        self.arrived.set()
        await self.gate.wait()
        return await self.inner.messages(*args, **kwargs)


async def test_subscribe_finishing_after_disconnect_leaves_no_subscriber(
    lmind: LocalMind,
) -> None:
    mind = lmind.mind
    owner = await FaceClient.connect(lmind.url, lmind.token)
    cid = await owner.create_conversation()
    actor = await mind.actor(cid)
    before = set(mind.sessions)
    leaving = await FaceClient.connect(lmind.url, lmind.token)
    (session,) = [s for s in mind.sessions - before if isinstance(s, FaceSession)]
    held = HeldReads(mind.store)
    mind.store = held  # type: ignore[assignment]
    await leaving.command("face.subscribe", conversation_ids=[cid], snapshot=True)
    await asyncio.wait_for(held.arrived.wait(), 10)
    await leaving.close()  # the network drops while the snapshot is read
    await until(lambda: session.closed)
    mind.store = held.inner
    held.gate.set()
    await until(lambda: session._worker is None)
    # The conversation keeps a dead connection as a subscriber for ever.
    assert session not in actor.subscribers
    await owner.close()


# -- 5. a TCP connection that never finishes the WebSocket handshake is kept for ever --


async def test_connection_without_handshake_is_closed_after_the_hello_timeout(
    tmp_path: Path,
) -> None:
    async with local_mind(tmp_path / "home", hello_timeout_s=0.2, local_hand=False) as lmind:
        port = lmind.server.port
        # Control: an upgraded connection that never says hello is closed (4010).
        ws = await FaceClient.connect(lmind.url, hello=False)
        assert await ws.closed_with(timeout=5) == 4010
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/face HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(), 3.0)
        except TimeoutError:
            data = None
        finally:
            writer.close()
        assert data is not None, "the Mind still holds a connection that never upgraded"


# -- 6. run.cancel in the window between a run's end and its commit -------------------

RUN_TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "lost"}


class SlowCommits:
    """Wraps the Mind's store: writes matching ``holds`` reach the database only
    on :meth:`release` (a slow fsync, stretched for as long as the test needs)."""

    def __init__(self, inner: Any, holds: Callable[[WriteTx], bool]) -> None:
        self.inner = inner
        self.holds = holds
        self.held: list[tuple[WriteTx, asyncio.Future[TxOutcome]]] = []
        self.arrived = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        if not self.holds(tx):
            return self.inner.write(tx)
        told: asyncio.Future[TxOutcome] = asyncio.get_running_loop().create_future()
        self.held.append((tx, told))
        self.arrived.set()
        return told

    async def release(self) -> None:
        for tx, told in self.held:
            told.set_result(await self.inner.write(tx))


async def test_run_cancel_right_after_the_result_reports_a_terminal_status(
    lmind: LocalMind,
) -> None:
    await hand_ready(lmind)
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    held = SlowCommits(
        lmind.mind.store,
        lambda tx: any(r.status in RUN_TERMINAL for r in tx.tool_runs),
    )
    lmind.mind.store = held  # type: ignore[assignment]
    chat_id = await face.command(
        "face.chat", conversation_id=cid, content='/tool exec_command {"argv": ["true"]}'
    )
    await approve_next(face, chat_id)
    queued = await face.expect(event("run.changed", status="queued"))
    run_id = queued["payload"]["data"]["run_id"]
    await asyncio.wait_for(held.arrived.wait(), 10)  # the run ended; its commit is in flight
    cancel_id = await face.command("face.run.cancel", run_id=run_id)
    reply = await face.reply(cancel_id)
    await held.release()
    lmind.mind.store = held.inner
    await face.reply(chat_id)
    data = reply["payload"]["data"]
    assert data["target_status"] in RUN_TERMINAL, data
    await face.close()


# -- 7. streamed tool output is cut inside UTF-8 characters ----------------------------

EURO_PROGRAM = "import sys; sys.stdout.buffer.write(('\\u20ac' * 6000).encode())"


async def test_progress_does_not_corrupt_multibyte_output(lmind: LocalMind) -> None:
    await hand_ready(lmind)
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    args = {"argv": [sys.executable, "-c", EURO_PROGRAM]}
    chat_id = await face.command(
        "face.chat", conversation_id=cid, content="/tool exec_command " + json.dumps(args)
    )
    await approve_next(face, chat_id)
    done = await face.expect(event("chat.tool_completed", request_id=chat_id), timeout=20)
    assert done["payload"]["data"]["result"]["stdout"] == "\u20ac" * 6000  # the result is right
    streamed = "".join(
        f["payload"]["data"] for f in face.seen if f["type"] == "face.chat.tool.progress"
    )
    assert "\ufffd" not in streamed
    assert streamed == "\u20ac" * 6000
    await face.reply(chat_id)
    await face.close()


# -- 8. a live tool card and a snapshot disagree on how a call ended -------------------


def test_view_tool_card_keeps_the_status_the_mind_reports() -> None:
    live = ConversationView("c_1")
    live.apply_snapshot({"cursor": "e.0", "messages": []})
    called = {"request_id": "q1", "tool_call_id": "t_1", "tool": "exec_command"}
    live.apply(
        "face.event",
        {
            "conversation_id": "c_1",
            "seq": 1,
            "cursor": "e.1",
            "type": "chat.tool_called",
            "data": called,
        },
    )
    live.apply(
        "face.event",
        {
            "conversation_id": "c_1",
            "seq": 2,
            "cursor": "e.2",
            "type": "chat.tool_completed",
            "data": {**called, "status": "denied", "success": False, "error_category": "denied"},
        },
    )
    resynced = ConversationView("c_1")
    resynced.apply_snapshot(
        {
            "cursor": "e.2",
            "messages": [],
            "tool_history": [{**called, "status": "denied", "success": False}],
        }
    )
    assert live.tool_cards["t_1"].status == resynced.tool_cards["t_1"].status


# -- 9. the database with every conversation and tool output is world-readable ---------


def private(path: Path) -> bool:
    return path.stat().st_mode & 0o077 == 0


async def test_stored_tool_output_is_not_readable_by_other_users(tmp_path: Path) -> None:
    secret = tmp_path / "id_key"
    secret.write_text("PRIVATE-KEY-MATERIAL\n")
    secret.chmod(0o600)
    home = tmp_path / "home"
    old = os.umask(0o022)  # the usual default
    try:
        async with local_mind(home) as lmind:
            await hand_ready(lmind)
            face = await FaceClient.connect(lmind.url, lmind.token)
            cid = await face.create_conversation()
            content = "/tool read_file " + json.dumps({"path": str(secret)})
            result = await face.chat_to_end(cid, content)
            assert result["payload"]["status"] == "succeeded"
            await face.close()
            stored = [p for p in sorted(home.glob("halfpi.db*"))]
            assert any(b"PRIVATE-KEY-MATERIAL" in p.read_bytes() for p in stored)
            exposed = [p.name for p in stored if not private(p)]
            assert private(home) or not exposed, f"{exposed} readable by others"
    finally:
        os.umask(old)


# -- 10. a cancel names a request_id of its own principal, but hits another's chat -----


async def second_operator(lmind: LocalMind, label: str) -> FaceClient:
    mind = lmind.mind
    credential, token = make_credential(
        "face", label, "operator", scopes_for("operator"), mind.now()
    )
    await mind.store.add_credential(credential)
    await mind.refresh_credentials()
    return await FaceClient.connect(lmind.url, token)


async def test_chat_cancel_targets_the_callers_own_request(lmind: LocalMind) -> None:
    alice = await FaceClient.connect(lmind.url, lmind.token)
    bob = await second_operator(lmind, "bob")
    cid = await alice.create_conversation()
    await alice.subscribe(cid)
    mine = await bob.chat_to_end(cid, "hello", request_id="job-1")
    assert mine["payload"]["status"] == "succeeded"
    await alice.command("face.chat", "job-1", conversation_id=cid, content="/sleep 30")
    await alice.reply("job-1", ("face.accepted",))  # admitted, and its reply running
    # Bob cancels *his* job-1, which has already finished.
    cancel_id = await bob.command(
        "face.chat.cancel", conversation_id=cid, target_request_id="job-1"
    )
    reply = await bob.reply(cancel_id, timeout=20)
    assert reply["payload"]["data"]["target_status"] == "succeeded", reply
    assert not events_of(alice.seen, "chat.cancelled", request_id="job-1")
    await alice.close()
    await bob.close()
