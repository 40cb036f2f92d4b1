"""Memory follows the work, not the history: idle actors are unloaded (I2, I4).

An actor with no subscriber, no running chat, tool run or approval, and
nothing published for ``unload_idle_s`` is unloaded by the maintenance;
its journal window is dropped, its epoch stays in the Store. Loading it
again is transparent, and a resume from a cursor taken before the unload
replays every durable event exactly once, then goes live. A whole Mind on
a fake clock, sessions over recording wires (``tests/support/rig.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.agents.base import ChatInput, Delta
from halfpi.core.events import ToolCalled
from halfpi.errors import Unavailable
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.service import Mind
from halfpi.mind.trim import Trimmer
from tests.support.frames import Frame
from tests.support.rig import Peer, Rig, fake_time_mind
from tests.support.store import HeldReads
from tests.support.wait import until

IDLE_S = 60.0


class GatedAgent:
    """Echoes the message; a chat saying ``gated`` says "partial" first and
    then waits for :attr:`gate`: a chat running for as long as a test needs."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def reply(self, chat: ChatInput) -> AsyncIterator[Delta]:
        if chat.content == "gated":
            yield Delta("partial ")
            await self.gate.wait()
            yield Delta("end")
            return
        for word in chat.content.split():
            yield Delta(word + " ")


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    # Maintenance rounds are run by the tests (credential_poll_s far away),
    # except where a test moves the clock over one on purpose.
    async with fake_time_mind(
        tmp_path / "home", GatedAgent(), unload_idle_s=IDLE_S, credential_poll_s=3600.0
    ) as r:
        yield r


def journal(mind: Mind) -> MemoryJournal:
    assert isinstance(mind.journal, MemoryJournal)
    return mind.journal


async def created(rig: Rig, face: Peer) -> str:
    reply = await rig.reply(face, await rig.command(face, "face.conversation.create"))
    return str(reply["payload"]["data"]["conversation_id"])


async def chat(rig: Rig, face: Peer, cid: str, content: str = "hello there") -> Frame:
    request_id = await rig.command(face, "face.chat", conversation_id=cid, content=content)
    return await rig.reply(face, request_id)


async def subscribe(rig: Rig, face: Peer, cid: str, **payload: Any) -> Frame:
    request_id = await rig.command(face, "face.subscribe", conversation_ids=[cid], **payload)
    return await rig.reply(face, request_id, ("face.accepted", "face.error"))


async def unload_after(rig: Rig, seconds: float) -> int:
    """Time passes (no timer runs); then one maintenance round's unloading."""
    rig.clock.now += seconds
    return await rig.mind.unload_idle(rig.clock.now)


def face_events(face: Peer, cid: str) -> list[Frame]:
    return [
        f
        for f in face.wire.frames
        if f["type"] == "face.event" and f["payload"]["conversation_id"] == cid
    ]


async def caught_up(face: Peer, cid: str, events: int) -> None:
    await until(lambda: len(face_events(face, cid)) >= events)


def without_event_seq(frame: Frame) -> Frame:
    return {**frame, "payload": {k: v for k, v in frame["payload"].items() if k != "event_seq"}}


# -- when an actor is unloaded ------------------------------------------------------------


async def test_an_idle_conversation_is_unloaded_once_its_idle_time_has_run_out(rig: Rig) -> None:
    mind = rig.mind
    face = await rig.face()
    cid = await created(rig, face)
    await chat(rig, face, cid)
    actor = await mind.actor(cid)
    epoch = actor.epoch
    assert (await mind.store.get_conversation(cid)).epoch == epoch  # type: ignore[union-attr]
    assert await unload_after(rig, IDLE_S - 1) == 0
    assert mind.is_loaded(cid) and journal(mind).holds(cid)
    assert await unload_after(rig, 1) == 1
    assert not mind.is_loaded(cid)
    assert not journal(mind).holds(cid)  # its window is dropped
    assert actor.unloaded
    # The Store keeps its epoch: loading it again continues the conversation.
    assert (await mind.store.get_conversation(cid)).epoch == epoch  # type: ignore[union-attr]


async def test_the_maintenance_round_unloads_on_the_minds_clock(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home", unload_idle_s=IDLE_S) as rig:
        face = await rig.face()
        cid = await created(rig, face)
        await chat(rig, face, cid)
        assert rig.mind.is_loaded(cid)
        rig.advance(IDLE_S)  # a round runs (every 0.25 s of the clock)
        await until(lambda: not rig.mind.is_loaded(cid))
        assert not journal(rig.mind).holds(cid)


async def test_a_command_counts_as_use_and_puts_the_unload_off(rig: Rig) -> None:
    face = await rig.face()
    cid = await created(rig, face)
    await chat(rig, face, cid)
    rig.clock.now += IDLE_S - 1
    snapshot = await rig.command(face, "face.conversation.snapshot", conversation_id=cid)
    await rig.reply(face, snapshot)
    assert await unload_after(rig, 2) == 0
    assert await unload_after(rig, IDLE_S) == 1


async def test_a_subscribed_conversation_stays_loaded_until_nobody_follows_it(rig: Rig) -> None:
    mind = rig.mind
    face = await rig.face()
    cid = await created(rig, face)
    await subscribe(rig, face, cid)
    await chat(rig, face, cid)
    assert await unload_after(rig, 10 * IDLE_S) == 0
    assert mind.is_loaded(cid)
    unsubscribed = await rig.command(face, "face.unsubscribe", conversation_ids=[cid])
    await rig.reply(face, unsubscribed)
    assert await unload_after(rig, IDLE_S) == 1


async def test_nothing_of_a_running_chat_is_ever_unloaded(rig: Rig) -> None:
    mind = rig.mind
    agent = mind.agent
    assert isinstance(agent, GatedAgent)
    face = await rig.face()
    cid = await created(rig, face)
    request_id = await rig.command(face, "face.chat", conversation_id=cid, content="gated")
    await rig.reply(face, request_id, ("face.accepted",))
    actor = await mind.actor(cid)
    await until(lambda: actor.chat_run is not None and actor.chat_run.visible_text == ["partial "])
    for _ in range(3):  # however long it runs
        assert await unload_after(rig, 10 * IDLE_S) == 0
    assert mind.is_loaded(cid) and journal(mind).holds(cid)
    agent.gate.set()
    done = await rig.reply(face, request_id)
    assert done["payload"]["content"] == "partial end"
    assert await unload_after(rig, IDLE_S - 1) == 0  # idle from its last event on
    assert await unload_after(rig, 1) == 1


# -- loading again ------------------------------------------------------------------------


async def test_loading_an_unloaded_conversation_again_continues_it(rig: Rig) -> None:
    mind = rig.mind
    face = await rig.face()
    cid = await created(rig, face)
    first = await chat(rig, face, cid, "one")
    before = await mind.actor(cid)
    assert await unload_after(rig, IDLE_S) == 1
    second = await chat(rig, face, cid, "two")
    after = await mind.actor(cid)
    assert after is not before and not after.unloaded
    assert after.epoch == before.epoch
    first_cursor, second_cursor = (r["payload"]["data"]["cursor"] for r in (first, second))
    assert first_cursor.split(".")[0] == second_cursor.split(".")[0] == before.epoch
    assert int(second_cursor.split(".")[1]) > before.published  # seq continues, never reused
    snapshot = await rig.reply(
        face, await rig.command(face, "face.conversation.snapshot", conversation_id=cid)
    )
    assert [m["content"] for m in snapshot["payload"]["messages"]] == [
        "one", "one ", "two", "two "
    ]


async def test_I2_an_unloaded_actor_never_writes_again(rig: Rig) -> None:
    """A command that fetched the actor, then waited while it was unloaded,
    is told to retry: the conversation's one writer is the one loaded now."""
    mind = rig.mind
    face = await rig.face()
    cid = await created(rig, face)
    stale = await mind.actor(cid)
    assert await unload_after(rig, IDLE_S) == 1
    with pytest.raises(Unavailable):
        stale.append(ToolCalled(tool_call_id="t_1"))
    assert not mind.is_loaded(cid)  # and nothing was loaded or written for it
    assert await mind.store.events(cid, 0, 10) == []
    reply = await chat(rig, face, cid)
    assert reply["payload"]["status"] == "succeeded"


# -- resume across an unload (I4) --------------------------------------------------------------


async def test_I4_a_resume_from_before_an_unload_replays_every_durable_event_once_then_goes_live(
    rig: Rig,
) -> None:
    mind = rig.mind
    first = await rig.face()
    cid = await created(rig, first)
    start = (await subscribe(rig, first, cid))["payload"]["heads"][cid]
    await chat(rig, first, cid, "hello there")
    await chat(rig, first, cid, "and again")
    renamed = await rig.command(first, "face.conversation.rename", conversation_id=cid, name="n")
    await rig.reply(first, renamed)
    seen = face_events(first, cid)
    delta = next(f for f in first.wire.frames if f["type"] == "face.chat.delta")
    middle = delta["payload"]["cursor"]  # inside the first chat's reply
    after_middle = [f for f in seen if f["payload"]["seq"] > delta["payload"]["seq"]]
    assert 0 < len(after_middle) < len(seen)
    unsubscribed = await rig.command(first, "face.unsubscribe", conversation_ids=[cid])
    await rig.reply(first, unsubscribed)
    assert await unload_after(rig, IDLE_S) == 1

    for since, expected in ((start, seen), (middle, after_middle)):
        face = await rig.face()
        accepted = await subscribe(rig, face, cid, since={cid: since})
        assert (accepted["payload"]["replay"], accepted["payload"]["conversations"]) == (
            "exact", {cid: "exact"})
        await caught_up(face, cid, len(expected))
        replayed = face_events(face, cid)
        # Every durable event after the cursor, once, in order, as sent live.
        assert [without_event_seq(f) for f in replayed] == [
            without_event_seq(f) for f in expected
        ]
        assert not [f for f in face.wire.frames if f["type"] == "face.reset"]

    # Then live: the next events continue the same log, nothing twice.
    await chat(rig, face, cid, "live now")
    await until(lambda: any(
        f["payload"]["type"] == "chat.completed" and f["payload"]["data"]["content"] == "live now "
        for f in face_events(face, cid)
    ))
    seqs = [f["payload"]["seq"] for f in face_events(face, cid)]
    assert seqs == sorted(set(seqs))
    assert len(seqs) > len(after_middle)
    assert mind.is_loaded(cid)


async def test_I4_the_replay_from_the_store_keeps_each_viewers_detail_mode(rig: Rig) -> None:
    """Rebuilt from the Store, an event is byte for byte what was sent live:
    its summary variant too (I9: no arguments for summary viewers)."""
    mind = rig.mind
    face = await rig.face()
    cid = await created(rig, face)
    actor = await mind.actor(cid)
    await actor.append(ToolCalled(tool_call_id="t_1", tool="exec", args={"token": "***", "n": 1}))
    await chat(rig, face, cid)
    entries = journal(mind).read_after_now(cid, 0, 100)
    assert entries is not None
    live = [actor.message_of(e) for e in entries if e.type == "face.event"]
    stored, read = await actor.committed_after(0, actor.published, 100)
    assert read == actor.published
    assert [m.seq for m in stored] == [m.seq for m in live]
    for mode in ("transparent", "summary"):
        for a, b in zip(stored, live, strict=True):
            shown_stored, shown_live = a.for_mode(mode), b.for_mode(mode)
            assert shown_stored is not None and shown_live is not None
            assert shown_stored.frame(1) == shown_live.frame(1)
    summary = live[0].for_mode("summary")
    assert summary is not None
    assert b'"args"' in live[0].frame(1) and b'"args"' not in summary.frame(1)


async def test_I4_a_cursor_from_before_a_restart_still_gets_epoch_changed(tmp_path: Path) -> None:
    """The in-process journal does not survive the process: a new Mind on the
    same Store writes a new epoch when it first loads the conversation."""
    home = tmp_path / "home"
    async with fake_time_mind(home, unload_idle_s=IDLE_S) as rig:
        face = await rig.face()
        cid = await created(rig, face)
        reply = await chat(rig, face, cid)
        old = reply["payload"]["data"]["cursor"]
    async with fake_time_mind(home, unload_idle_s=IDLE_S) as rig:
        face = await rig.face()
        request_id = await rig.command(
            face, "face.subscribe", conversation_ids=[cid], since={cid: old}
        )
        await rig.reply(face, request_id, ("face.accepted",))
        reset = await rig.expect(face, lambda f: f["type"] == "face.reset")
        assert reset["payload"]["reason"] == "epoch_changed"
        stored = await rig.mind.store.get_conversation(cid)
        assert stored is not None and stored.epoch == reset["payload"]["snapshot"]["epoch"]
        assert stored.epoch != old.split(".")[0]


async def test_I4_a_journal_that_kept_its_window_keeps_the_epoch_across_a_restart(
    tmp_path: Path,
) -> None:
    """A journal that outlives the Mind (as a Redis stream does) holds
    continuity: the next Mind keeps the stored epoch and a cursor from
    before resumes exactly, transient events included."""
    home = tmp_path / "home"
    async with fake_time_mind(home) as rig:
        kept = journal(rig.mind)
        face = await rig.face()
        cid = await created(rig, face)
        start = (await subscribe(rig, face, cid))["payload"]["heads"][cid]
        await chat(rig, face, cid, "one two")
        before = face_events(face, cid)
        deltas = [f for f in face.wire.frames if f["type"] == "face.chat.delta"]
    async with fake_time_mind(home, journal=kept) as rig:
        face = await rig.face()
        accepted = await subscribe(rig, face, cid, since={cid: start})
        assert accepted["payload"]["replay"] == "exact"
        await caught_up(face, cid, len(before))
        assert [without_event_seq(f) for f in face_events(face, cid)] == [
            without_event_seq(f) for f in before
        ]
        again = [f for f in face.wire.frames if f["type"] == "face.chat.delta"]
        assert [without_event_seq(f) for f in again] == [without_event_seq(f) for f in deltas]
        assert (await rig.mind.actor(cid)).epoch == start.split(".")[0]


# -- a subscribe racing an unload --------------------------------------------------------------


async def test_a_subscribe_racing_an_unload_lands_on_the_loaded_actor(rig: Rig) -> None:
    mind = rig.mind
    face = await rig.face()
    cid = await created(rig, face)
    await chat(rig, face, cid)
    held = HeldReads(mind.store)
    mind.store = held  # type: ignore[assignment]
    request_id = await rig.command(face, "face.subscribe", conversation_ids=[cid], snapshot=True)
    await held.arrived.wait()  # the subscribe has its actor and reads its snapshot
    first = await mind.actor(cid)
    assert await unload_after(rig, IDLE_S) == 1  # meanwhile, idle long enough
    assert first.unloaded
    held.gate.set()
    await rig.reply(face, request_id, ("face.accepted",))
    await rig.expect(face, lambda f: f["type"] == "face.snapshot")
    now_loaded = await mind.actor(cid)
    assert now_loaded is not first
    assert len(now_loaded.subscribers) == 1 and not first.subscribers
    await chat(rig, face, cid, "after the race")
    await until(lambda: any(
        f["payload"]["type"] == "chat.completed" for f in face_events(face, cid)
    ))


# -- memory given back -------------------------------------------------------------------


async def test_unloading_gives_the_memory_back_at_most_every_few_seconds(rig: Rig) -> None:
    """After an unload the allocator is asked to return the freed pages
    (``malloc_trim`` on glibc, ``mind/trim.py``): once something was
    unloaded, never in a round that unloaded nothing since the last trim,
    and at most once per ``every_s`` however many rounds unload."""
    mind = rig.mind
    trims: list[float] = []
    mind.actors.trimmer = Trimmer(lambda: trims.append(rig.clock.now), every_s=5.0)
    face = await rig.face()
    first, second = await created(rig, face), await created(rig, face)
    kept = await created(rig, face)
    await subscribe(rig, face, kept)  # followed: it stays loaded, the Mind is not idle
    await chat(rig, face, first)
    assert await unload_after(rig, 1) == 0
    assert trims == []  # nothing unloaded: nothing to give back
    await chat(rig, face, second)  # idle 1 s later than the first
    assert await unload_after(rig, IDLE_S - 1) == 1
    assert trims == [rig.clock.now]  # the first unload: given back in that round
    assert await unload_after(rig, 1) == 1
    assert len(trims) == 1  # 1 s after the last trim: it waits
    assert await unload_after(rig, 4) == 0
    assert trims[-1] == rig.clock.now and len(trims) == 2  # owed, in a later round
    assert await unload_after(rig, 60) == 0
    assert len(trims) == 2  # nothing unloaded since: never again


async def test_the_last_unload_gives_the_memory_back_at_once(rig: Rig) -> None:
    mind = rig.mind
    trims: list[float] = []
    mind.actors.trimmer = Trimmer(lambda: trims.append(rig.clock.now), every_s=5.0)
    face = await rig.face()
    first, second = await created(rig, face), await created(rig, face)
    await chat(rig, face, first)
    rig.clock.now += 1
    await chat(rig, face, second)
    assert await unload_after(rig, IDLE_S - 1) == 1
    assert await unload_after(rig, 1) == 1  # the last one: nothing is loaded now
    assert len(mind.actors) == 0
    assert len(trims) == 2 and trims[-1] == rig.clock.now  # not 5 s later


def test_without_glibc_nothing_is_called() -> None:
    trimmer = Trimmer(None)
    trimmer.unloaded(10)
    assert not trimmer.maybe_trim(100.0)
