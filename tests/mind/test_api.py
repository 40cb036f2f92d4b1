"""The Mind API without any transport: a caller is a principal and a sink.

What a WebSocket session, an SSE stream or a one-shot HTTP command will all
rely on — the registry, cancel targeting, subscriptions and replay, the
detail-mode rule — is driven here through ``api.handle`` with a fake caller
whose sink just collects what it is sent (DESIGN §9).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config, JournalLimits
from halfpi.core import wire
from halfpi.core.events import Outbound, ToolCalled, to_message
from halfpi.core.limits import QueueLimits
from halfpi.core.outbound import Message, OutboundQueue, message
from halfpi.errors import Forbidden, InvalidRequest, RequestConflict, Unavailable
from halfpi.journal.base import JournalEntry
from halfpi.journal.memory import MemoryJournal
from halfpi.mind import api
from halfpi.mind.service import Mind
from halfpi.mind.subscriptions import Subscriptions
from halfpi.store.sqlite import SQLiteStore
from tests.support.wait import until

Frame = dict[str, Any]


class FakeCaller:
    """A caller of any transport: who it is, and a sink that keeps replies."""

    def __init__(
        self, mind: Mind, principal_id: str = "p_owner", profile: str = "operator"
    ) -> None:
        self.principal_id: str | None = principal_id
        self.label = "laptop"
        self.profile = profile
        self.scopes: frozenset[str] = frozenset()
        self.detail_mode: str | None = None
        self.closed = False
        self.sent: list[Message] = []
        self.woken = 0
        self.subscriptions: Subscriptions = mind.subscriptions_for(self)

    def send(self, message: Message) -> None:
        if not self.closed:
            self.sent.append(message)

    def reply(self, value: Outbound) -> None:
        self.send(to_message(value))

    def reply_stored(self, type_: str, body: dict[str, Any]) -> None:
        self.send(message(type_, body))

    def wake(self) -> None:
        self.woken += 1

    def close(self, code: int, reason: str) -> None:
        self.closed = True

    # -- reading what it was sent --------------------------------------------------

    def frames(self) -> list[Frame]:
        return [json.loads(m.frame(0)) for m in self.sent]

    def replies(self, request_id: str) -> list[Frame]:
        return [f for f in self.frames() if f["payload"].get("request_id") == request_id]

    def types(self, request_id: str) -> list[str]:
        return [f["type"] for f in self.replies(request_id)]

    async def drain(self, budget: int = 1 << 30) -> list[Frame]:
        """What its flushes write of the replay until it has caught up: pull
        when woken, as a connection does while its transport takes writes."""
        frames: list[Frame] = []
        async for batch in self.pulls(budget):
            frames += [json.loads(frame) for frame in batch]
        return frames

    async def pulls(self, budget: int) -> AsyncIterator[list[bytes]]:
        """Each flush's frames until the replay has caught up (it is live)."""
        subs = self.subscriptions
        while subs.replaying:
            await until(lambda: subs.ready or not subs.replaying)
            yield [m.frame(0) for m in subs.pull(budget)]


def command(type_: str, **payload: Any) -> Any:
    return wire.decode_command(json.dumps({"type": type_, "payload": payload}))[1]


@pytest.fixture
async def mind(tmp_path: Path) -> AsyncIterator[Mind]:
    config = Config(home=tmp_path, credential_poll_s=3600.0, local_hand=False)
    mind = Mind(config, SQLiteStore(config.db_path), MemoryJournal(config.journal),
                ScriptedAgent(0.0))
    await mind.start()
    try:
        yield mind
    finally:
        await mind.drain()


async def create(mind: Mind, caller: FakeCaller, request_id: str = "c1") -> str:
    await api.handle(mind, caller, "face.conversation.create",
                     command("face.conversation.create", request_id=request_id))
    result = caller.replies(request_id)[-1]
    assert result["type"] == "face.result", result
    return str(result["payload"]["data"]["conversation_id"])


async def chat_to_end(mind: Mind, caller: FakeCaller, cid: str, rid: str, text: str) -> Frame:
    await api.handle(mind, caller, "face.chat",
                     command("face.chat", request_id=rid, conversation_id=cid, content=text))
    await until(lambda: "face.result" in caller.types(rid))
    return caller.replies(rid)[-1]


async def test_a_mutation_answers_accepted_then_result_to_any_caller(mind: Mind) -> None:
    caller = FakeCaller(mind)
    await create(mind, caller)
    assert caller.types("c1") == ["face.accepted", "face.result"]


async def test_I5_the_same_request_again_gets_the_stored_outcome_not_a_second_one(
    mind: Mind,
) -> None:
    first, again = FakeCaller(mind), FakeCaller(mind)  # one principal, two connections
    cid = await create(mind, first)
    assert await create(mind, again) == cid
    assert again.types("c1") == ["face.result"]
    conversations = await mind.store.list_conversations(10, None)
    assert [c.conversation_id for c in conversations] == [cid]


async def test_I5_a_different_payload_under_a_used_request_id_conflicts(mind: Mind) -> None:
    caller = FakeCaller(mind)
    await create(mind, caller)
    with pytest.raises(RequestConflict):
        await api.handle(mind, caller, "face.conversation.create",
                         command("face.conversation.create", request_id="c1", name="other"))


async def test_a_replay_of_a_running_chat_is_attached_for_its_result(mind: Mind) -> None:
    laptop, phone = FakeCaller(mind), FakeCaller(mind)
    cid = await create(mind, laptop)
    payload = command("face.chat", request_id="q1", conversation_id=cid, content="/sleep 0.2")
    await api.handle(mind, laptop, "face.chat", payload)
    await api.handle(mind, phone, "face.chat", payload)  # the SDK re-sent it elsewhere
    assert phone.types("q1") == ["face.accepted"]
    await until(lambda: "face.result" in phone.types("q1"))
    assert phone.replies("q1")[-1]["payload"]["content"] == "done"
    assert laptop.types("q1") == ["face.accepted", "face.result"]


async def test_cancel_of_a_finished_chat_converges_at_once(mind: Mind) -> None:
    caller = FakeCaller(mind)
    cid = await create(mind, caller)
    await chat_to_end(mind, caller, cid, "q1", "hello")
    await api.handle(mind, caller, "face.chat.cancel",
                     command("face.chat.cancel", request_id="x1", conversation_id=cid,
                             target_request_id="q1"))
    assert caller.types("x1") == ["face.accepted", "face.result"]
    data = caller.replies("x1")[-1]["payload"]["data"]
    assert data == {"outcome": "already_finished", "target_request_id": "q1",
                    "target_status": "succeeded"}


async def test_cancel_names_its_caller_in_the_reason(mind: Mind) -> None:
    caller = FakeCaller(mind)
    cid = await create(mind, caller)
    await api.handle(mind, caller, "face.chat",
                     command("face.chat", request_id="q1", conversation_id=cid,
                             content="/sleep 30"))
    await api.handle(mind, caller, "face.chat.cancel",
                     command("face.chat.cancel", request_id="x1", conversation_id=cid,
                             target_request_id="q1"))
    await until(lambda: "face.result" in caller.types("x1"))
    chat = caller.replies("q1")[-1]["payload"]
    assert (chat["status"], chat["data"]["reason"]) == ("cancelled", "cancelled by laptop")
    assert caller.replies("x1")[-1]["payload"]["data"]["outcome"] == "cancelled"


async def test_I4_subscribe_since_a_cursor_replays_exactly_through_pull_then_goes_live(
    mind: Mind,
) -> None:
    writer, reader = FakeCaller(mind), FakeCaller(mind)
    cid = await create(mind, writer)
    actor = await mind.actor(cid)
    start = actor.cursor(actor.published)
    await chat_to_end(mind, writer, cid, "q1", "/repeat 3 hi")
    await api.handle(mind, reader, "face.subscribe",
                     command("face.subscribe", request_id="s1", conversation_ids=[cid],
                             since={cid: start}))
    accepted = reader.replies("s1")[-1]["payload"]
    assert (accepted["replay"], accepted["conversations"]) == ("exact", {cid: "exact"})
    await until(lambda: reader.woken >= 1)  # the connection is asked to flush
    assert not [m for m in reader.sent if m.type == "face.event"]  # nothing is pushed
    replayed = await reader.drain()
    seqs = [f["payload"]["seq"] for f in replayed]
    assert seqs == list(range(1, actor.published + 1))
    assert not reader.subscriptions.replaying  # caught up: live from here
    before = len(reader.sent)
    await chat_to_end(mind, writer, cid, "q2", "again")
    live = [json.loads(m.frame(0)) for m in reader.sent[before:]]
    assert live[0]["payload"]["seq"] == actor.published - len(live) + 1


async def test_I7_a_replay_is_pulled_in_batches_within_the_budget(mind: Mind) -> None:
    writer, reader = FakeCaller(mind), FakeCaller(mind)
    cid = await create(mind, writer)
    actor = await mind.actor(cid)
    start = actor.cursor(actor.published)
    await chat_to_end(mind, writer, cid, "q1", "/repeat 50 word")
    await api.handle(mind, reader, "face.subscribe",
                     command("face.subscribe", request_id="s1", conversation_ids=[cid],
                             since={cid: start}))
    batches = [batch async for batch in reader.pulls(1_000)]
    assert len(batches) > 3
    # A batch stops once it has used its budget: all but its last frame fit.
    assert all(sum(len(frame) for frame in batch[:-1]) < 1_000 for batch in batches)
    seqs = [json.loads(frame)["payload"]["seq"] for batch in batches for frame in batch]
    assert seqs == list(range(1, actor.published + 1))


async def test_I9_an_observer_cannot_ask_for_transparent_detail(mind: Mind) -> None:
    owner, observer = FakeCaller(mind), FakeCaller(mind, "p_watch", profile="observer")
    cid = await create(mind, owner)
    with pytest.raises(Forbidden):
        await api.handle(mind, observer, "face.subscribe",
                         command("face.subscribe", request_id="s1", conversation_ids=[cid],
                                 detail_mode="transparent"))
    await api.handle(mind, observer, "face.subscribe",
                     command("face.subscribe", request_id="s2", conversation_ids=[cid]))
    assert observer.detail_mode == "summary"  # the connection's default, now kept


async def test_a_subscribe_naming_an_unknown_transient_type_installs_nothing(mind: Mind) -> None:
    caller = FakeCaller(mind)
    cid = await create(mind, caller)
    with pytest.raises(InvalidRequest) as refused:
        await api.handle(mind, caller, "face.subscribe",
                         command("face.subscribe", request_id="s1", conversation_ids=[cid],
                                 transient_types=["chat.delta"]))
    assert refused.value.field == "transient_types"
    assert cid not in caller.subscriptions


async def test_a_caller_that_goes_away_follows_nothing_and_waits_for_nothing(
    mind: Mind,
) -> None:
    caller = FakeCaller(mind)
    cid = await create(mind, caller)
    await api.handle(mind, caller, "face.subscribe",
                     command("face.subscribe", request_id="s1", conversation_ids=[cid]))
    await api.handle(mind, caller, "face.chat",
                     command("face.chat", request_id="q1", conversation_id=cid,
                             content="/sleep 0.2"))
    actor = await mind.actor(cid)
    assert caller in actor.subscribers
    caller.closed = True
    api.disconnected(mind, caller)
    assert caller not in actor.subscribers
    assert not mind.registry.is_attached((str(caller.principal_id), "q1"), caller)
    assert actor.chat_run is not None
    assert await actor.chat_run.done == "succeeded"  # I1: the chat ran on without it


async def test_mutations_are_refused_while_the_mind_drains(mind: Mind) -> None:
    caller = FakeCaller(mind)
    mind.draining = True
    try:
        with pytest.raises(Unavailable):
            await api.handle(mind, caller, "face.conversation.create",
                             command("face.conversation.create", request_id="c1"))
        await api.handle(mind, caller, "face.conversation.list",
                         command("face.conversation.list", request_id="l1"))
        assert caller.types("l1") == ["face.result"]
    finally:
        mind.draining = False


# -- replay through the Journal seam: reads awaited, appends in flight (I4) -------------------


class InFlightReads(MemoryJournal):
    """A journal whose reads take their answer at once but deliver it only
    when :attr:`gate` opens: a remote read in flight while the log moves."""

    def __init__(self, limits: JournalLimits) -> None:
        super().__init__(limits)
        self.gate = asyncio.Event()
        self.gate.set()
        self.reads = 0

    async def read_after(
        self, conversation_id: str, seq: int, limit: int
    ) -> list[JournalEntry] | None:
        answer = self.read_after_now(conversation_id, seq, limit)
        self.reads += 1
        await self.gate.wait()
        return answer


class LaggingAppends(MemoryJournal):
    """A journal whose appends land only when :meth:`land` is called (a remote
    journal's pipelined appends): until then reads do not see them."""

    def __init__(self, limits: JournalLimits) -> None:
        super().__init__(limits)
        self.in_flight: list[tuple[str, JournalEntry, asyncio.Future[None]]] = []
        self.reads = 0

    async def read_after(
        self, conversation_id: str, seq: int, limit: int
    ) -> list[JournalEntry] | None:
        self.reads += 1
        return self.read_after_now(conversation_id, seq, limit)

    def append(self, conversation_id: str, entry: JournalEntry) -> asyncio.Future[None] | None:
        future = asyncio.get_running_loop().create_future()
        self.in_flight.append((conversation_id, entry, future))
        return future

    def land(self) -> None:
        for conversation_id, entry, future in self.in_flight:
            super().append(conversation_id, entry)
            future.set_result(None)
        self.in_flight.clear()


@contextlib.asynccontextmanager
async def mind_on(tmp_path: Path, journal: MemoryJournal) -> AsyncIterator[Mind]:
    config = Config(home=tmp_path, credential_poll_s=3600.0, local_hand=False)
    mind = Mind(config, SQLiteStore(config.db_path), journal, ScriptedAgent(0.0))
    await mind.start()
    try:
        yield mind
    finally:
        await mind.drain()


def event_seqs(frames: list[Frame]) -> list[int]:
    return [f["payload"]["seq"] for f in frames if "seq" in f["payload"]]


async def test_I4_events_published_while_a_replay_read_is_in_flight_come_once(
    tmp_path: Path,
) -> None:
    """The switch to live is one synchronous step: an event published while
    the replay's read is under way is read by a later read or pushed live,
    never both, never neither."""
    journal = InFlightReads(JournalLimits())
    async with mind_on(tmp_path, journal) as mind:
        writer, reader = FakeCaller(mind), FakeCaller(mind)
        cid = await create(mind, writer)
        actor = await mind.actor(cid)
        start = actor.cursor(actor.published)
        await chat_to_end(mind, writer, cid, "q1", "/repeat 30 word")
        journal.gate.clear()
        await api.handle(mind, reader, "face.subscribe",
                         command("face.subscribe", request_id="s1", conversation_ids=[cid],
                                 since={cid: start}))
        await until(lambda: journal.reads == 1)  # its answer taken, not delivered yet
        await chat_to_end(mind, writer, cid, "q2", "/repeat 20 more")  # the log moves on
        assert not reader.subscriptions.by_conversation[cid].live
        journal.gate.set()
        replayed = await reader.drain()
        assert event_seqs(replayed) == list(range(1, actor.published + 1))
        assert journal.reads >= 2  # what came meanwhile was read, not pushed
        before = len(reader.sent)
        await chat_to_end(mind, writer, cid, "q3", "live")
        live = [json.loads(m.frame(0)) for m in reader.sent[before:]]
        assert event_seqs(live)[0] == event_seqs(replayed)[-1] + 1
        assert event_seqs(live) == sorted(set(event_seqs(live)))


async def test_I4_a_replay_pulled_in_steps_while_the_log_moves_misses_nothing(
    tmp_path: Path,
) -> None:
    async with mind_on(tmp_path, MemoryJournal(JournalLimits())) as mind:
        writer, reader = FakeCaller(mind), FakeCaller(mind)
        cid = await create(mind, writer)
        actor = await mind.actor(cid)
        start = actor.cursor(actor.published)
        await chat_to_end(mind, writer, cid, "q1", "/repeat 200 word")
        await api.handle(mind, reader, "face.subscribe",
                         command("face.subscribe", request_id="s1", conversation_ids=[cid],
                                 since={cid: start}))
        frames: list[Frame] = []
        chats = iter(range(2, 6))
        async for batch in reader.pulls(2_000):
            frames += [json.loads(frame) for frame in batch]
            n = next(chats, None)
            if n is not None:  # more is published between two pulls
                await chat_to_end(mind, writer, cid, f"q{n}", f"/repeat {n} more")
        frames += [json.loads(m.frame(0)) for m in reader.sent if m.conversation_id == cid]
        assert event_seqs(frames) == list(range(1, actor.published + 1))


async def test_I4_a_replay_waits_for_appends_still_on_their_way_to_the_journal(
    tmp_path: Path,
) -> None:
    journal = LaggingAppends(JournalLimits())
    async with mind_on(tmp_path, journal) as mind:
        writer, reader = FakeCaller(mind), FakeCaller(mind)
        cid = await create(mind, writer)
        actor = await mind.actor(cid)
        start = actor.cursor(actor.published)
        await chat_to_end(mind, writer, cid, "q1", "/repeat 5 word")
        assert journal.in_flight  # published, not yet in the journal
        assert not actor.idle()  # so it is not unloaded before they are in
        await api.handle(mind, reader, "face.subscribe",
                         command("face.subscribe", request_id="s1", conversation_ids=[cid],
                                 since={cid: start}))
        sub = reader.subscriptions.by_conversation[cid]
        await until(lambda: sub.fetching)
        subs = reader.subscriptions
        for _ in range(50):  # the connection flushes whenever there is something to pull
            if subs.ready:
                assert subs.pull(1 << 20) == []
            await asyncio.sleep(0)
        assert journal.reads <= 2  # no read again and again: it waits for the appends
        journal.land()
        replayed = await reader.drain()
        assert event_seqs(replayed) == list(range(1, actor.published + 1))
        assert sub.live


@pytest.mark.parametrize(
    ("detail_mode", "transient_types"),
    [
        ("transparent", None),
        ("summary", None),
        ("transparent", []),
        ("summary", ["face.chat.delta"]),
    ],
)
async def test_replayed_frames_are_the_frames_of_the_replayed_messages(
    mind: Mind, detail_mode: str, transient_types: list[str] | None
) -> None:
    """A connection's flush frames journal entries without making messages
    of them: the same frames, in the same order, with the same filters (I9),
    and the queue knows the cursor it wrote last (for face.evicted)."""
    writer = FakeCaller(mind)
    cid = await create(mind, writer)
    actor = await mind.actor(cid)
    start = actor.cursor(actor.published)
    await actor.append(ToolCalled(tool_call_id="t_1", tool="exec", args={"n": 1}))
    await chat_to_end(mind, writer, cid, "q1", "/repeat 5 word")
    readers = [FakeCaller(mind), FakeCaller(mind)]
    for reader in readers:
        await api.handle(mind, reader, "face.subscribe",
                         command("face.subscribe", request_id="s1", conversation_ids=[cid],
                                 since={cid: start}, detail_mode=detail_mode,
                                 transient_types=transient_types))
    by_message, by_frame = readers
    messages = [frame async for batch in by_message.pulls(1 << 20) for frame in batch]
    queue = OutboundQueue(QueueLimits())
    subs = by_frame.subscriptions
    frames: list[bytes] = []
    while subs.replaying:
        await until(lambda: subs.ready or not subs.replaying)
        frames += subs.pull_frames(queue, 1 << 20)
    expected = [
        json.dumps({**json.loads(f), "payload": {**json.loads(f)["payload"], "event_seq": n}})
        for n, f in enumerate(messages, 1)
    ]
    assert [json.loads(f) for f in frames] == [json.loads(f) for f in expected]
    assert len(frames) > 2
    assert queue.event_seq == len(frames)
    assert queue.written_cursors[cid] == json.loads(frames[-1])["payload"]["cursor"]
    has_args = any(b'"args"' in f for f in frames)
    assert has_args == (detail_mode == "transparent")
    has_deltas = any(b"face.chat.delta" in f for f in frames)
    assert has_deltas == (transient_types != [])
