"""I2 (one writer) and I3 (commit before show), proven inside one process.

The store is wrapped so that commits wait for the test's word: what a Face
can see while a commit is held is exactly what I3 forbids.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from halfpi.config import Config
from halfpi.core.outbound import Message, message
from halfpi.core.requests import RequestRecord
from halfpi.mind.service import Mind
from halfpi.mind.subscriptions import Subscription
from halfpi.process import build_mind
from halfpi.store.base import TxOutcome, WriteTx
from tests.support.client import FaceClient
from tests.support.mind import LocalMind


class GatedStore:
    """Delegates to a real store, but holds every commit until released."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.held: list[tuple[WriteTx, asyncio.Future[TxOutcome]]] = []
        self.gate_open = True
        self.arrived = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        if self.gate_open:
            return self.inner.write(tx)
        outer: asyncio.Future[TxOutcome] = asyncio.get_running_loop().create_future()
        self.held.append((tx, outer))
        self.arrived.set()
        return outer

    async def release(self) -> None:
        self.gate_open = True
        held, self.held = self.held, []
        for tx, outer in held:
            outer.set_result(await self.inner.write(tx))


class Recorder:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, message: Message) -> None:
        self.messages.append(message)

    def reply_stored(self, type_: str, body: dict[str, Any]) -> None:
        self.send(message(type_, body))


@pytest.fixture
async def mind(tmp_path: Path) -> Any:
    config = replace(Config(home=tmp_path / "home", port=0), scripted_delta_ms=0.0)
    mind = build_mind(config)
    await mind.start()
    try:
        yield mind
    finally:
        await mind.drain()


async def _conversation(mind: Mind) -> str:
    record = RequestRecord("p_test", "create-1", "face.conversation.create", "d", "accepted", 0.0)
    created = await mind.create_conversation(record, "t")
    assert isinstance(created, RequestRecord) and created.conversation_id
    return created.conversation_id


def _watch(actor: Any) -> Recorder:
    recorder = Recorder()
    sub = Subscription(recorder, actor, pos=actor.published, transient_types=None,
                       detail_mode="transparent")
    sub.live = True
    actor.subscribers[recorder] = sub
    return recorder


async def test_I2_concurrent_loads_return_the_same_actor(mind: Mind) -> None:
    cid = await _conversation(mind)
    actors = await asyncio.gather(*(mind.actor(cid) for _ in range(50)))
    assert len({id(a) for a in actors}) == 1


async def test_I2_seq_strictly_increases_across_chats(lmind: LocalMind) -> None:
    faces = [await FaceClient.connect(lmind.url, lmind.token) for _ in range(2)]
    cid = await faces[0].create_conversation()
    watcher = await FaceClient.connect(lmind.url, lmind.token)
    await watcher.subscribe(cid)
    succeeded = 0
    for round_ in range(5):
        # Both race for the conversation; one is admitted, the other is busy.
        replies = await asyncio.gather(
            *(f.chat_to_end(cid, f"/repeat 20 r{round_}f{i}") for i, f in enumerate(faces))
        )
        codes = [r["payload"].get("status") or r["payload"]["code"] for r in replies]
        assert set(codes) <= {"succeeded", "busy"} and "succeeded" in codes
        succeeded += codes.count("succeeded")
    for _ in range(succeeded):
        await watcher.expect(
            lambda f: f["type"] == "face.event" and f["payload"]["type"] == "chat.completed"
        )
    seqs = [e["payload"]["seq"] for e in watcher.events(cid)]
    assert seqs == sorted(set(seqs)), "seq must strictly increase with no repeats"
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no gaps in one connection"
    for face in [*faces, watcher]:
        await face.close()


async def test_I3_admission_events_hidden_until_commit(mind: Mind) -> None:
    cid = await _conversation(mind)
    actor = await mind.actor(cid)
    recorder = _watch(actor)
    gated = GatedStore(mind.store)
    mind.store = gated  # type: ignore[assignment]
    gated.gate_open = False
    accepted: list[RequestRecord] = []
    record = RequestRecord("p_test", "chat-1", "face.chat", "d", "accepted", 0.0)
    admission = asyncio.create_task(actor.admit_chat(record, "/sleep 0", accepted.append))
    await gated.arrived.wait()
    # The chat is staged (seqs taken) but its commit is held.
    assert actor.next_seq > actor.published + 1
    assert recorder.messages == [] and accepted == []
    # A delta produced meanwhile queues behind the uncommitted durable events.
    assert actor.chat_run is not None
    actor.emit_delta(actor.chat_run, "early")
    assert recorder.messages == []
    await gated.release()
    await admission
    kinds = [(m.type, m.seq) for m in recorder.messages[:3]]
    assert kinds == [("face.event", 1), ("face.event", 2), ("face.chat.delta", 3)]
    assert accepted == [record]


async def test_I3_terminal_event_and_result_wait_for_commit(mind: Mind) -> None:
    cid = await _conversation(mind)
    actor = await mind.actor(cid)
    recorder = _watch(actor)
    waiter = Recorder()  # attached for the chat's face.result, as a replaying Face is
    mind.registry.attach(("p_test", "chat-2"), waiter)
    record = RequestRecord("p_test", "chat-2", "face.chat", "d", "accepted", 0.0)
    gated = GatedStore(mind.store)
    mind.store = gated  # type: ignore[assignment]
    await actor.admit_chat(record, "/sleep 0.01", lambda r: None)
    run = actor.chat_run
    assert run is not None
    gated.gate_open = False
    gated.arrived.clear()
    await gated.arrived.wait()  # the terminal transaction is waiting
    shown = [m for m in recorder.messages if m.type == "face.event"]
    assert all(b'"chat.completed"' not in (m.body or b"") for m in shown)
    assert waiter.messages == []
    await gated.release()
    await run.done
    results = [(m.type, json.loads(m.encoded_body())["status"]) for m in waiter.messages]
    assert results == [("face.result", "succeeded")]
    assert any(b'"chat.completed"' in (m.body or b"") for m in recorder.messages)
