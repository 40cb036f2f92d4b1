"""The reply's text so far is saved while it streams (DESIGN §5): at most
about a second or 4 KiB behind what Faces were shown, never ahead of it,
riding the group commit — for every agent, so that a reply cut short by a
crash keeps the words a person already read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from halfpi.agents.base import ChatInput, Delta
from halfpi.core.events import HandConnected
from halfpi.mind.service import Mind
from halfpi.store.base import WriteTx
from tests.support.rig import Peer, Rig, fake_time_mind
from tests.support.store import FailingWrites, HeldCommits
from tests.support.wait import until


class PushedAgent:
    """Says exactly what the test pushes (None ends the reply)."""

    def __init__(self) -> None:
        self.said: asyncio.Queue[str | None] = asyncio.Queue()

    async def reply(self, chat: ChatInput) -> AsyncIterator[Delta]:
        while (text := await self.said.get()) is not None:
            yield Delta(text)


async def saved(mind: Mind, cid: str, request_id: str) -> str | None:
    row = await mind.store.chat_run_for_request(cid, request_id)
    assert row is not None
    return row.content


async def wait_saved(mind: Mind, cid: str, request_id: str, text: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (got := await saved(mind, cid, request_id)) != text:
        assert loop.time() < deadline, f"saved {got!r}, expected {text!r}"
        await asyncio.sleep(0.01)


async def started(rig: Rig, agent: PushedAgent) -> tuple[Peer, str, str]:
    face = await rig.face()
    cid = await rig.conversation(face)
    request_id = await rig.command(face, "face.chat", conversation_id=cid, content="go")
    await rig.reply(face, request_id, ("face.accepted",))
    return face, cid, request_id


async def shown(rig: Rig, face: Peer, request_id: str, text: str) -> None:
    def seen() -> str:
        return "".join(
            f["payload"]["text"]
            for f in face.seen(lambda f: f["type"] == "face.chat.delta")
            if f["payload"]["request_id"] == request_id
        )

    await until(lambda: seen() == text)


async def test_4_KiB_shown_are_saved_without_waiting_for_the_second(tmp_path: Path) -> None:
    agent = PushedAgent()
    async with fake_time_mind(tmp_path / "home", agent) as rig:
        face, cid, request_id = await started(rig, agent)
        words = ["x" * 63 + " " for _ in range(64)]  # 4096 bytes, the clock never moves
        for word in words:
            agent.said.put_nowait(word)
        await shown(rig, face, request_id, "".join(words))
        await wait_saved(rig.mind, cid, request_id, "".join(words))
        agent.said.put_nowait(None)


async def test_text_shown_before_a_pause_is_saved_a_second_later(tmp_path: Path) -> None:
    agent = PushedAgent()
    async with fake_time_mind(tmp_path / "home", agent) as rig:
        face, cid, request_id = await started(rig, agent)
        agent.said.put_nowait("a few words")
        await shown(rig, face, request_id, "a few words")
        rig.advance(0.5)  # the stream stalls: nothing else arrives
        assert await saved(rig.mind, cid, request_id) is None
        rig.advance(0.5)
        await wait_saved(rig.mind, cid, request_id, "a few words")
        agent.said.put_nowait(None)


async def test_a_checkpoint_never_saves_text_that_was_not_shown(tmp_path: Path) -> None:
    agent = PushedAgent()
    async with fake_time_mind(tmp_path / "home", agent) as rig:
        face, cid, request_id = await started(rig, agent)
        agent.said.put_nowait("shown ")
        await shown(rig, face, request_id, "shown ")
        # A durable event is still committing: later deltas wait behind it (I3).
        held = HeldCommits(rig.mind.store, lambda tx: bool(tx.events))
        rig.mind.store = held
        actor = await rig.mind.actor(cid)
        run = actor.active_run_for(request_id)
        assert run is not None
        actor.append(HandConnected(hand_id="elsewhere", generation=1))
        await held.arrived.wait()
        for _ in range(70):
            agent.said.put_nowait("y" * 63 + " ")  # 4 KiB and more, none of it shown yet
        await until(lambda: len(run.text) == 71)
        rig.advance(1.0)
        await wait_saved(rig.mind, cid, request_id, "shown ")
        rig.mind.store = held.inner
        await held.release()
        agent.said.put_nowait(None)
        result = await rig.reply(face, request_id)
        assert result["payload"]["content"] == "shown " + ("y" * 63 + " ") * 70


async def test_no_checkpoint_is_written_once_the_reply_ended(tmp_path: Path) -> None:
    agent = PushedAgent()
    async with fake_time_mind(tmp_path / "home", agent) as rig:
        face, cid, request_id = await started(rig, agent)
        agent.said.put_nowait("the end")
        agent.said.put_nowait(None)
        result = await rig.reply(face, request_id)
        assert result["payload"]["status"] == "succeeded"
        writes: list[WriteTx] = []
        inner = rig.mind.store

        class Watch:
            def __getattr__(self, name: str) -> object:
                return getattr(inner, name)

            def write(self, tx: WriteTx) -> asyncio.Future[object]:
                writes.append(tx)
                return inner.write(tx)  # type: ignore[no-any-return]

        rig.mind.store = Watch()  # type: ignore[assignment]
        rig.advance(5.0)
        assert not [tx for tx in writes if tx.chat_runs], writes
        rig.mind.store = inner
        row = await rig.mind.store.chat_run_for_request(cid, request_id)
        assert row is not None and (row.status, row.content) == ("succeeded", "the end")



async def test_a_stream_waiting_behind_a_commit_does_not_redo_its_checkpoint_per_delta(
    tmp_path: Path,
) -> None:
    # While deltas wait behind a durable commit (I3), what could be saved does
    # not grow: each new delta must not re-assemble the text shown so far and
    # re-arm the save timer (that made a long fast reply quadratic).
    agent = PushedAgent()
    async with fake_time_mind(tmp_path / "home", agent) as rig:
        face, cid, request_id = await started(rig, agent)
        agent.said.put_nowait("shown ")
        await shown(rig, face, request_id, "shown ")
        held = HeldCommits(rig.mind.store, lambda tx: bool(tx.events))
        rig.mind.store = held
        actor = await rig.mind.actor(cid)
        run = actor.active_run_for(request_id)
        assert run is not None
        actor.append(HandConnected(hand_id="elsewhere", generation=1))
        await held.arrived.wait()
        armed: list[float] = []
        call_later = actor.env.call_later
        assert call_later is not None

        def counting(delay: float, callback: object, *args: object) -> object:
            armed.append(delay)
            return call_later(delay, callback, *args)

        actor.env.call_later = counting  # type: ignore[assignment]
        for _ in range(300):
            agent.said.put_nowait("z" * 63 + " ")  # 19 KiB waiting, none of it shown
        await until(lambda: len(run.text) == 301)
        assert len(armed) <= 2, f"the save timer was armed {len(armed)} times"
        actor.env.call_later = call_later
        rig.mind.store = held.inner
        await held.release()
        agent.said.put_nowait(None)
        result = await rig.reply(face, request_id)
        assert result["payload"]["content"] == "shown " + ("z" * 63 + " ") * 300
        await wait_saved(rig.mind, cid, request_id, result["payload"]["content"])


class Writes:
    """Wraps the Mind's store and keeps every write it is given."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.seen: list[WriteTx] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def write(self, tx: WriteTx) -> asyncio.Future[object]:
        self.seen.append(tx)
        return self.inner.write(tx)  # type: ignore[attr-defined,no-any-return]

    def checkpoints(self) -> list[WriteTx]:
        return [tx for tx in self.seen if tx.chat_runs or tx.run_text]


async def test_a_checkpoint_carries_only_the_text_shown_since_the_last_one(
    tmp_path: Path,
) -> None:
    # O(new text) per checkpoint: a long reply is not joined and written
    # whole every second, only what was shown since the previous save.
    agent = PushedAgent()
    async with fake_time_mind(tmp_path / "home", agent) as rig:
        face, cid, request_id = await started(rig, agent)
        writes = Writes(rig.mind.store)
        rig.mind.store = writes  # type: ignore[assignment]
        first = "a" * 4096
        agent.said.put_nowait(first)
        await shown(rig, face, request_id, first)
        await wait_saved(rig.mind, cid, request_id, first)
        second = "b" * 4096
        agent.said.put_nowait(second)
        await shown(rig, face, request_id, first + second)
        await wait_saved(rig.mind, cid, request_id, first + second)
        later = writes.checkpoints()[1:]
        assert later and all(not tx.chat_runs for tx in later), later
        assert "".join(t.text for tx in later for t in tx.run_text) == second
        rig.mind.store = writes.inner  # type: ignore[assignment]
        agent.said.put_nowait(None)
        result = await rig.reply(face, request_id)
        assert result["payload"]["content"] == first + second


async def test_after_a_lost_checkpoint_the_next_one_saves_the_whole_text(
    tmp_path: Path,
) -> None:
    # An append on top of a save that never landed would leave a hole in
    # the saved text: after a failure the next checkpoint rewrites it whole.
    agent = PushedAgent()
    async with fake_time_mind(tmp_path / "home", agent) as rig:
        face, cid, request_id = await started(rig, agent)
        agent.said.put_nowait("a" * 4096)
        await shown(rig, face, request_id, "a" * 4096)
        await wait_saved(rig.mind, cid, request_id, "a" * 4096)
        failing = FailingWrites(rig.mind.store)
        rig.mind.store = failing
        failing.fail(lambda tx: bool(tx.chat_runs or tx.run_text))
        agent.said.put_nowait("b" * 4096)
        await shown(rig, face, request_id, "a" * 4096 + "b" * 4096)
        await failing.refusal.wait()
        failing.heal()
        agent.said.put_nowait("c" * 4096)
        whole = "a" * 4096 + "b" * 4096 + "c" * 4096
        await shown(rig, face, request_id, whole)
        await wait_saved(rig.mind, cid, request_id, whole)
        rig.mind.store = failing.inner
        agent.said.put_nowait(None)
        result = await rig.reply(face, request_id)
        assert result["payload"]["content"] == whole
