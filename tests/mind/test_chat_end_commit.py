"""Every admitted chat reaches a terminal state Faces see (DESIGN §5, I3, I10),
even when the Store refuses the write of its end for a while."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

from halfpi.agents.base import ChatInput, Delta
from halfpi.core.states import CHAT_EVENT_FOR_STATUS
from halfpi.store.base import ChatRunRow, FinishedRequest, StoredEvent, WriteTx
from tests.support.client import FaceClient, seq_of
from tests.support.clock import ManualSleep
from tests.support.frames import event, events_of
from tests.support.mind import LocalMind, local_mind
from tests.support.rig import fake_time_mind
from tests.support.store import FailingWrites
from tests.support.wait import until

CHAT_ENDS = set(CHAT_EVENT_FOR_STATUS.values())


class GatedAgent:
    """Replies "hello world"; a chat saying ``gated`` waits for :attr:`gate`
    between the two words, so a test can break the Store in between."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def reply(self, chat: ChatInput) -> AsyncIterator[Delta]:
        yield Delta("hello ")
        if chat.content == "gated":
            await self.gate.wait()
        yield Delta("world")


async def ends_in_log(lmind: LocalMind, cid: str, run_id: str) -> list[str]:
    events = await lmind.mind.store.events(cid, 0, 10_000)
    return [
        e.type for e in events if e.type in CHAT_ENDS and json.loads(e.data)["run_id"] == run_id
    ]


async def pending(face: FaceClient, cid: str) -> list[str]:
    snap = await face.reply(await face.command("face.conversation.snapshot", conversation_id=cid))
    return [p["request_id"] for p in snap["payload"]["pending_chats"]]


async def gated_chat(lmind: LocalMind, face: FaceClient, cid: str) -> str:
    chat = await face.command("face.chat", conversation_id=cid, content="gated")
    await face.reply(chat, ("face.accepted",))
    await face.expect(lambda f: f["type"] == "face.chat.delta")
    return chat


async def test_a_chat_whose_end_cannot_be_committed_settles_once_the_store_heals(
    tmp_path: Path,
) -> None:
    agent = GatedAgent()
    async with local_mind(tmp_path / "home", agent, local_hand=False) as lmind:
        mind = lmind.mind
        clock = ManualSleep()
        mind.sleep = clock
        face = await FaceClient.connect(lmind.url, lmind.token)
        device = await FaceClient.connect(lmind.url, lmind.token)  # the same owner elsewhere
        cid = await face.create_conversation()
        await face.subscribe(cid)
        store = FailingWrites(mind.store)
        mind.store = store  # type: ignore[assignment]
        chat = await gated_chat(lmind, face, cid)
        actor = await mind.actor(cid)
        assert actor.chat_run is not None
        run_id = actor.chat_run.run_id

        store.fail()  # the disk fills up before the chat ends
        agent.gate.set()
        assert await clock.next_wait() == 0.25  # the end was refused; a retry waits

        # Meanwhile the chat is still pending, truthfully, and holds its conversation.
        busy = await face.command("face.chat", conversation_id=cid, content="meanwhile")
        refused = await face.reply(busy, ("face.result", "face.error"))
        assert refused["type"] == "face.error" and refused["payload"]["code"] == "busy"
        assert await pending(face, cid) == [chat]
        replay = await device.command("face.chat", chat, conversation_id=cid, content="gated")
        assert (await device.reply(replay, ("face.accepted", "face.result")))["type"] == (
            "face.accepted"
        )
        clock.advance()
        assert await clock.next_wait() == 0.5  # refused again: the wait grows
        assert not events_of(face.seen, "chat.completed")
        assert not [f for f in face.seen if f["type"] == "face.result"
                    and f["payload"]["request_id"] == chat]

        store.heal()
        clock.advance()
        ended = await face.expect(event("chat.completed", request_id=chat))
        result = await face.reply(chat)
        replayed = await device.reply(chat)  # the replaying connection learns it too
        for frame in (result, replayed):
            assert frame["type"] == "face.result"
            assert frame["payload"]["status"] == "succeeded"
            assert frame["payload"]["content"] == "hello world"
        assert ended["payload"]["data"]["content"] == "hello world"
        # Every refused attempt staged its own event; none was ever shown,
        # and the one that committed came after everything shown before it.
        attempts = [e.seq for tx in store.refused for e in tx.events if e.type == "chat.completed"]
        assert len(attempts) == 2 and len(set(attempts)) == 2
        shown = {seq_of(f["payload"]["cursor"]) for f in face.events(cid)}
        assert not shown & set(attempts)
        assert ended["payload"]["seq"] > max(attempts)
        assert ended["payload"]["seq"] == max(shown)

        assert await pending(face, cid) == []
        again = await device.command("face.chat", chat, conversation_id=cid, content="gated")
        settled = await device.reply(again, ("face.accepted", "face.result"))
        assert settled["type"] == "face.result" and settled["payload"]["status"] == "succeeded"
        after = await face.chat_to_end(cid, "and now?")
        assert after["payload"]["status"] == "succeeded"
        assert await ends_in_log(lmind, cid, run_id) == ["chat.completed"]
        await face.close()
        await device.close()


async def test_a_drain_while_the_end_still_fails_leaves_the_chat_to_restart_recovery(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    agent = GatedAgent()
    loop = asyncio.get_running_loop()
    async with local_mind(home, agent, local_hand=False) as lmind:
        lmind.mind.sleep = clock = ManualSleep()
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        store = FailingWrites(lmind.mind.store)
        lmind.mind.store = store  # type: ignore[assignment]
        chat = await gated_chat(lmind, face, cid)
        store.fail()
        agent.gate.set()
        await clock.next_wait()
        draining = loop.time()
    # The drain gave the end one last try, then stopped waiting for it.
    assert loop.time() - draining < lmind.config.shutdown_grace_s
    assert clock.delays == [0.25]
    async with local_mind(home, local_hand=False) as restarted:
        face = await FaceClient.connect(restarted.url, restarted.token)
        replay = await face.command("face.chat", chat, conversation_id=cid, content="gated")
        result = await face.reply(replay, ("face.accepted", "face.result"))
        assert result["type"] == "face.result"
        assert result["payload"]["status"] == "interrupted"
        assert await pending(face, cid) == []
        await face.close()


async def test_a_chat_converges_on_an_outcome_the_store_already_holds(tmp_path: Path) -> None:
    """Another writer recorded an outcome for the run first (as a second Mind
    on the same home once did): the Store refuses ours, no retry can change
    that, and everyone learns the outcome that stands (I10)."""
    agent = GatedAgent()
    async with local_mind(tmp_path / "home", agent, local_hand=False) as lmind:
        mind = lmind.mind
        mind.sleep = clock = ManualSleep()
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        chat = await gated_chat(lmind, face, cid)
        actor = await mind.actor(cid)
        run = actor.chat_run
        assert run is not None
        now = mind.wall()
        standing = {"request_id": chat, "status": "interrupted", "content": "",
                    "data": {"reason": "mind_restarted"}}
        await mind.store.write(
            WriteTx(
                events=[StoredEvent(cid, 10**9, "chat.interrupted",
                                    json.dumps({"request_id": chat, "run_id": run.run_id}).encode(),
                                    now)],
                chat_runs=[ChatRunRow(run.run_id, cid, chat, run.principal_id, "interrupted",
                             run.started_at, now, "", None)],
                finished=[FinishedRequest(run.principal_id, chat, "interrupted", standing, now)],
            )
        )
        agent.gate.set()
        result = await face.reply(chat)
        assert {k: v for k, v in result["payload"].items() if k != "event_seq"} == standing
        assert clock.delays == []  # a refusal is not retried
        assert not events_of(face.seen, "chat.completed")
        assert await pending(face, cid) == []
        after = await face.chat_to_end(cid, "not busy")
        assert after["payload"]["status"] == "succeeded"
        assert await ends_in_log(lmind, cid, run.run_id) == ["chat.interrupted"]
        await face.close()


async def test_the_waits_between_attempts_to_commit_an_end_are_on_the_minds_clock(
    tmp_path: Path,
) -> None:
    agent = GatedAgent()
    # Maintenance an hour away: the only timer is the retry's wait.
    async with fake_time_mind(tmp_path / "home", agent, credential_poll_s=3600.0) as rig:
        face = await rig.face()
        cid = await rig.conversation(face)
        store = FailingWrites(rig.mind.store)
        rig.mind.store = store  # type: ignore[assignment]
        chat = await rig.command(face, "face.chat", conversation_id=cid, content="gated")
        await rig.expect(face, lambda f: f["type"] == "face.chat.delta")
        store.fail(lambda tx: bool(tx.finished))  # the end's commit only
        agent.gate.set()

        async def waits(seconds: float) -> None:
            await until(lambda: rig.mind.scheduler.next_deadline() == rig.clock.now + seconds)

        await waits(0.25)
        assert rig.advance(0.249) == 0 and len(store.refused) == 1
        assert rig.advance(0.001) == 1
        await until(lambda: len(store.refused) == 2)
        await waits(0.5)  # refused again: the wait grows
        store.heal()
        assert rig.advance(0.499) == 0
        assert rig.advance(0.001) == 1
        result = await rig.reply(face, chat)
        assert result["payload"]["status"] == "succeeded"
        assert result["payload"]["content"] == "hello world"
        assert len(store.refused) == 2
