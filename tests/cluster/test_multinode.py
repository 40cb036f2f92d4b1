"""Cluster mode end to end (DESIGN §10): real ``halfpi mind`` nodes on one
real PostgreSQL and one real Redis (``tests/support/cluster.py``), driven by
real WebSocket Faces. Nodes are killed (``kill -9``), paused past their lease
(SIGSTOP/SIGCONT) and Redis is restarted without its data; what every Face
holds is checked against the truth in PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.support.client import FaceClient, seq_of
from tests.support.cluster import Cluster, Node, running_cluster
from tests.support.stream import (
    POSITIONED,
    TERMINAL_EVENTS,
    assert_contiguous,
    covered_seqs,
    delta_text,
    is_terminal_event,
    positioned,
)

pytestmark = pytest.mark.e2e

Frame = dict[str, Any]
RETRYABLE = ("busy", "unavailable")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Nodes a, b, c without their local Hands: no test here runs a tool, and
    the Hands have a test of their own (one defect, one failing test)."""
    async with running_cluster(tmp_path / "cluster", local_hand=False) as c:
        yield c


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Nodes a and b (a cluster starts slowly on a loaded machine: no more
    nodes than a test needs)."""
    async with running_cluster(tmp_path / "cluster", ("a", "b"), local_hand=False) as c:
        yield c


# -- helpers -------------------------------------------------------------------


def durable(frames: list[Frame], conversation_id: str) -> list[tuple[int, str]]:
    """The durable events a Face holds: ``(seq, type)`` in arrival order."""
    return [
        (int(f["payload"]["seq"]), str(f["payload"]["type"])) for f in frames
        if f["type"] == "face.event" and f["payload"]["conversation_id"] == conversation_id
    ]


def last_cursor(frames: list[Frame], conversation_id: str, start: str) -> str:
    seen = positioned(frames, conversation_id)
    return str(seen[-1]["payload"]["cursor"]) if seen else start


async def subscribe_with_snapshot(face: FaceClient, conversation_id: str) -> str:
    """Subscribe from now on; the snapshot's cursor (where the Face starts)."""
    accepted = await face.subscribe(conversation_id, snapshot=True)
    assert accepted["type"] == "face.accepted", accepted
    snapshot = await face.expect(lambda f: f["type"] == "face.snapshot"
                                 and f["payload"]["conversation"]["id"] == conversation_id)
    return str(snapshot["payload"]["cursor"])


async def chat_admitted(face: FaceClient, conversation_id: str, content: str, request_id: str,
                        timeout: float = 20.0) -> Frame:
    """Send a chat, again with the same request_id while the answer is a
    retryable refusal (``busy``, ``unavailable``: an owner moving); return
    its ``face.result``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        reply = await face.chat_to_end(conversation_id, content, request_id,
                                       timeout=max(0.1, deadline - loop.time()))
        if reply["type"] == "face.result":
            return reply
        assert reply["payload"]["code"] in RETRYABLE, reply
        assert loop.time() < deadline, f"still refused after {timeout} s: {reply}"
        await asyncio.sleep(0.05)  # polling a condition (the owner moved) with a deadline


async def terminal_in_store(cluster: Cluster, conversation_id: str,
                            request_id: str) -> list[tuple[int, str]]:
    rows = await cluster.sql(
        "SELECT seq, type FROM events WHERE conversation_id = $1 AND type = ANY($2::text[])"
        " AND data::jsonb ->> 'request_id' = $3 ORDER BY seq",
        conversation_id, list(TERMINAL_EVENTS), request_id,
    )
    return [(int(r["seq"]), str(r["type"])) for r in rows]


async def ended_in_store(cluster: Cluster, conversation_id: str, request_id: str,
                         timeout: float = 20.0) -> tuple[int, str]:
    """The chat's terminal event, once PostgreSQL has it (polled, with a deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (ended := await terminal_in_store(cluster, conversation_id, request_id)):
        assert loop.time() < deadline, f"{request_id} never ended in the Store"
        await asyncio.sleep(0.05)  # polling a condition with a deadline
    assert len(ended) == 1, f"terminal events of {request_id} in the Store: {ended}"
    return ended[0]


def reached(request_id: str, seq: int) -> Callable[[Frame], bool]:
    """A Face has caught up with a chat's end: its terminal event, or a
    ``face.reset`` whose snapshot is at or past it."""
    return lambda f: is_terminal_event(f, request_id) or (
        f["type"] == "face.reset" and seq_of(f["payload"]["snapshot"]["cursor"]) >= seq
    )


async def first_seq_of(cluster: Cluster, conversation_id: str, request_id: str) -> int:
    rows = await cluster.sql(
        "SELECT min(seq) AS seq FROM events WHERE conversation_id = $1"
        " AND data::jsonb ->> 'request_id' = $2",
        conversation_id, request_id,
    )
    assert rows and rows[0]["seq"] is not None, f"no event of {request_id} in PostgreSQL"
    return int(rows[0]["seq"])


async def owner_of(cluster: Cluster, conversation_id: str) -> tuple[Node, Node, int]:
    """The conversation's owner (its lease holder in Redis), a node that is
    not, and the owner's fence."""
    holder = await cluster.lease_holder(conversation_id)
    assert holder is not None, "no node holds the lease of a conversation with a chat"
    owner = cluster[holder[0]]
    other = next(n for n in cluster.nodes.values() if n is not owner and n.alive)
    return owner, other, holder[1]


def summary(frames: list[Frame]) -> list[str]:
    """Frames in brief, for failure messages."""
    return [
        " ".join(str(x) for x in (f["type"], f["payload"].get("seq", ""),
                                  f["payload"].get("type", ""), f["payload"].get("reason", ""),
                                  f["payload"].get("cursor", "")) if x)
        for f in frames
    ]


@dataclass
class Viewer:
    """One Face's view of a conversation across its connections (nodes)."""

    face: FaceClient
    start: str  # the cursor it started from
    frames: list[Frame] = field(default_factory=list)  # of its earlier connections
    moves: int = 0  # connections the Mind closed with 1012

    def all_frames(self) -> list[Frame]:
        return self.frames + self.face.seen

    def walk(self, conversation_id: str) -> tuple[str, list[tuple[int, int]]]:
        """Its cursor now, and the windows ``(last seq seen, snapshot seq)``
        that a ``face.reset`` told it to skip."""
        cursor, resets = self.start, []
        for frame in self.all_frames():
            payload = frame["payload"]
            if payload.get("conversation_id") != conversation_id:
                continue
            if frame["type"] in POSITIONED:
                cursor = payload["cursor"]
            elif frame["type"] == "face.reset":
                resets.append((seq_of(cursor), seq_of(payload["snapshot"]["cursor"])))
                cursor = payload["snapshot"]["cursor"]
        return cursor, resets

    async def move(self, cluster: Cluster, node: Node, conversation_id: str) -> Frame:
        """Its connection was cut: connect to ``node`` and resume from its cursor."""
        cursor, _ = self.walk(conversation_id)
        self.frames += self.face.seen
        self.face = await cluster.face(node)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        # While the owner is dead and its lease not yet expired the answer may
        # be `unavailable` (retryable): a Face asks again.
        while (accepted := await self.face.subscribe(conversation_id, since=cursor))[
                "type"] == "face.error" and accepted["payload"]["code"] in RETRYABLE:
            assert loop.time() < deadline, accepted
            await asyncio.sleep(0.05)  # polling a condition (the owner moved) with a deadline
        assert accepted["type"] == "face.accepted", accepted
        if accepted["payload"]["conversations"][conversation_id] == "reset":
            await self.face.expect(lambda f: f["type"] == "face.reset")
        return accepted

    async def until(self, cluster: Cluster, node: Node, conversation_id: str,
                    predicate: Callable[[Frame], bool], timeout: float = 20.0) -> Frame:
        """The next frame matching ``predicate``; a connection the Mind
        closes with 1012 (the conversation moved; resume) is resumed on
        ``node`` from the cursor, as a Face does."""
        for frame in self.all_frames():  # already here (maybe taken by another wait)
            if predicate(frame):
                return frame
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                return await self.face.expect(predicate, max(0.1, deadline - loop.time()))
            except TimeoutError as exc:
                exc.add_note(f"{self.moves} moves; last frames: {summary(self.all_frames()[-8:])}")
                raise
            except websockets.ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code != 1012 or loop.time() > deadline:
                    raise
                self.moves += 1
                await self.move(cluster, node, conversation_id)

    def check_against(self, truth: list[tuple[int, str]], conversation_id: str) -> None:
        """What the Face holds is the truth: every durable event after its
        start (outside the windows a ``face.reset`` said it skipped), each
        once, nothing the Store lacks; every seq it saw, once, in order."""
        frames = self.all_frames()
        _, skipped = self.walk(conversation_id)
        held = durable(frames, conversation_id)
        seqs = covered_seqs(positioned(frames, conversation_id))
        assert seqs == sorted(set(seqs)), f"seqs seen twice or out of order: {seqs}"
        start = seq_of(self.start)
        expected = [
            e for e in truth
            if e[0] > start and not any(lo < e[0] <= hi for lo, hi in skipped)
        ]
        assert held == expected, (
            f"the Face holds {held}, the Store has {expected} (start {start}, resets {skipped})"
        )


# -- the harness -----------------------------------------------------------------


async def test_three_nodes_on_one_database_welcome_the_same_face_credential(
    tmp_path: Path,
) -> None:
    async with running_cluster(tmp_path / "cluster", local_hand=False) as cluster:
        async with asyncio.timeout(30):
            welcomes = [(await cluster.face(name)).welcome for name in ("a", "b", "c")]
    principals = {w["payload"]["principal_id"] for w in welcomes if w is not None}
    assert principals == {cluster.credential.principal_id}
    assert len({w["payload"]["node_id"] for w in welcomes if w is not None}) == 3


async def test_every_node_of_a_cluster_runs_its_own_local_hand(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "cluster", ("a", "b")) as cluster, \
            asyncio.timeout(30):
        for name in ("a", "b"):
            face = await cluster.face(name)
            while True:
                request_id = await face.command("face.hand.list")
                hands = (await face.reply(request_id))["payload"]["data"]["hands"]
                if any(h["hand_id"] == f"local-{name}" and h["connected"] for h in hands):
                    break
                await asyncio.sleep(0.05)  # polling a condition with a deadline


# -- moving between nodes ----------------------------------------------------------

WORDS = " ".join(f"w{i}" for i in range(60))


async def test_I4_a_face_cut_mid_reply_on_one_node_resumes_exactly_on_another(
    pair: Cluster,
) -> None:
    async with asyncio.timeout(60):
        stay, cut = await pair.face("a"), await pair.face("a")
        cid = await stay.create_conversation()
        start = await subscribe_with_snapshot(stay, cid)
        await subscribe_with_snapshot(cut, cid)
        await stay.command("face.chat", "long", conversation_id=cid, content=f"/pace 20 {WORDS}")
        await cut.expect(lambda f: f["type"] == "face.chat.delta"
                         and f["payload"]["text"].strip() == "w10", 20)
        await cut.close()
        before = positioned(cut.seen, cid)
        cursor = before[-1]["payload"]["cursor"]

        moved = await pair.face("b")
        accepted = await moved.subscribe(cid, since=cursor)
        assert accepted["type"] == "face.accepted", accepted
        assert accepted["payload"]["replay"] == "exact", accepted
        assert accepted["payload"]["conversations"][cid] == "exact", accepted
        done = await moved.expect(lambda f: is_terminal_event(f, "long"), 30)
        stayed = await stay.expect(lambda f: is_terminal_event(f, "long"), 30)

    after = positioned(moved.seen, cid)
    assert_contiguous(after, seq_of(cursor) + 1, done["payload"]["seq"])
    assert any(f["type"] == "face.chat.delta" for f in after)  # deltas are replayed too
    assert delta_text(before, "long") + delta_text(after, "long") == WORDS
    assert delta_text(stay.seen, "long") == WORDS
    assert done["payload"] == {**stayed["payload"], "event_seq": done["payload"]["event_seq"]}
    assert done["payload"]["data"]["content"] == WORDS
    truth = await pair.events(cid)
    assert durable(stay.seen, cid) == [e for e in truth if e[0] > seq_of(start)]
    assert durable(cut.seen + moved.seen, cid) == durable(stay.seen, cid)


async def test_I5_a_chat_sent_to_one_node_and_retried_on_another_is_admitted_once(
    cluster: Cluster,
) -> None:
    content = "/pace 40 one two three four five six seven eight"
    async with asyncio.timeout(60):
        on_a, on_c = await cluster.face("a"), await cluster.face("c")
        cid = await on_a.create_conversation()
        await on_a.command("face.chat", "once", conversation_id=cid, content=content)
        first = await on_a.reply("once", ("face.accepted", "face.error"))
        assert first["type"] == "face.accepted", first
        # The same request on another node while it runs: the same admission.
        await on_c.command("face.chat", "once", conversation_id=cid, content=content)
        retried = await on_c.reply("once", ("face.accepted", "face.result", "face.error"))
        result_a = await on_a.reply("once", ("face.result", "face.error"), 20)
        result_c = (retried if retried["type"] == "face.result"
                    else await on_c.reply("once", ("face.result", "face.error"), 20))
        # And once more on a third node after it ended: its terminal result.
        on_b = await cluster.face("b")
        result_b = await on_b.chat_to_end(cid, content, "once")

    assert retried["type"] in ("face.accepted", "face.result"), retried
    if retried["type"] == "face.accepted":
        for key in ("operation", "conversation_id", "run_id"):
            assert retried["payload"][key] == first["payload"][key], (first, retried)
    for result in (result_a, result_c, result_b):
        assert result["type"] == "face.result", result
        assert result["payload"]["status"] == "succeeded", result
        assert result["payload"]["content"] == "one two three four five six seven eight"
        assert result["payload"]["data"]["run_id"] == first["payload"]["run_id"], result
    users = await cluster.sql(
        "SELECT count(*) AS n FROM messages WHERE conversation_id = $1 AND role = 'user'", cid)
    assert users[0]["n"] == 1
    requests = await cluster.sql("SELECT count(*) AS n FROM requests WHERE request_id = 'once'")
    assert requests[0]["n"] == 1
    assert [t for _, t in await cluster.events(cid)].count("chat.message") == 1


async def test_I4_a_face_resumed_on_a_survivor_before_the_take_over_follows_the_chat_after_it(
    pair: Cluster,
) -> None:
    """The Face of a killed owner resumes on the other node at once (the lease
    not yet expired); that node then takes the conversation over: the Face
    gets the chat's end and what follows it, live."""
    async with asyncio.timeout(90):
        for round_ in range(4):
            owner, other = (pair["a"], pair["b"]) if round_ % 2 == 0 else (pair["b"], pair["a"])
            on_owner = await pair.face(owner)
            cid = await on_owner.create_conversation()
            viewer = Viewer(on_owner, await subscribe_with_snapshot(on_owner, cid))
            chat_id, next_id = f"cut{round_}", f"then{round_}"
            await on_owner.command("face.chat", chat_id, conversation_id=cid,
                                   content="/pace 30 " + " ".join(f"w{i}" for i in range(10)))
            await on_owner.expect(lambda f: f["type"] == "face.chat.delta"
                                  and f["payload"]["text"].strip() == "w3", 20)
            assert (await pair.lease_holder(cid) or ("",))[0] == owner.name
            owner.kill()
            await viewer.move(pair, other, cid)
            ended = await ended_in_store(pair, cid, chat_id)
            await viewer.until(pair, other, cid, reached(chat_id, ended[0]))
            asker = await pair.face(other)
            result = await chat_admitted(asker, cid, "/pace 1 and then", next_id)
            await viewer.until(pair, other, cid,
                               reached(next_id, seq_of(result["payload"]["data"]["cursor"])))
            viewer.check_against(await pair.events(cid), cid)
            await owner.start()


# -- an owner killed -------------------------------------------------------------

ROUNDS = 20
REPLY_WORDS = 8
PACE_MS = 25


async def test_kill_9_of_the_owner_mid_chat_interrupts_the_chat_and_every_face_converges(
    tmp_path: Path,
) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    async with running_cluster(tmp_path / "cluster", local_hand=False) as cluster:
        restarting: dict[str, asyncio.Task[Node]] = {}
        try:
            async with asyncio.timeout(150):
                for round_ in range(ROUNDS):
                    story: list[str] = []
                    try:
                        outcomes[await kill_round(cluster, rng, restarting, round_, story)] += 1
                    except BaseException as exc:
                        exc.add_note(f"round {round_} of seed {seed}: {'; '.join(story)}")
                        raise
        finally:
            for task in restarting.values():
                await asyncio.wait_for(task, 60)
    # Most kills land mid-reply: the test proves the take-over, not luck.
    assert outcomes["chat.interrupted"] >= ROUNDS // 2, (outcomes, seed)


async def kill_round(cluster: Cluster, rng: random.Random,
                     restarting: dict[str, asyncio.Task[Node]], round_: int,
                     story: list[str]) -> str:
    """One conversation, a Face on every live node, a chat cut by ``kill -9``
    of its owner at a random point; the outcome the Store recorded."""
    for name, task in list(restarting.items()):
        if task.done():
            await restarting.pop(name)
    while len(cluster.nodes) - len(restarting) < 2:  # two live nodes at least
        await restarting.pop(next(iter(restarting)))
    live = [n for n in cluster.nodes.values() if n.alive and n.name not in restarting]
    viewers: dict[str, Viewer] = {}
    for node in live:
        face = await cluster.face(node)
        viewers[node.name] = Viewer(face, "")
    first = viewers[live[0].name].face
    cid = await first.create_conversation(f"round {round_}")
    for viewer in viewers.values():
        viewer.start = await subscribe_with_snapshot(viewer.face, cid)

    sender_node = rng.choice(live)
    sender = viewers[sender_node.name]
    chat_id = f"k{round_}"
    words = " ".join(f"r{round_}w{i}" for i in range(REPLY_WORDS))
    content = f"/pace {PACE_MS} {words}"
    await sender.face.command("face.chat", chat_id, conversation_id=cid, content=content)
    point = rng.randint(-1, REPLY_WORDS)  # -1: at once; N: after the end
    if point < 0:
        victim = sender_node  # maybe before it was admitted; maybe not the owner
    else:
        await sender.face.reply(chat_id, ("face.accepted",))
        if point == REPLY_WORDS:
            await sender.face.expect(lambda f: is_terminal_event(f, chat_id), 20)
        elif point > 0:
            await sender.face.expect(
                lambda f: f["type"] == "face.chat.delta"
                and f["payload"]["text"].strip() == f"r{round_}w{point - 1}", 20)
        victim, _, _ = await owner_of(cluster, cid)
    story.append(f"conversation {cid}, faces on {sorted(viewers)}, chat sent on "
                 f"{sender_node.name}, kill point {point}, node {victim.name} killed")
    victim.kill()
    restarting[victim.name] = asyncio.create_task(victim.start())

    survivors = [n for n in live if n is not victim]
    homes = {name: cluster[name] for name in viewers}  # where each Face is connected
    if victim.name in viewers:
        cut = viewers[victim.name]
        homes[victim.name] = rng.choice(survivors)
        await cut.move(cluster, homes[victim.name], cid)
        if cut is sender:  # the Face re-sends what it cannot know was admitted
            resent = await chat_admitted(cut.face, cid, content, chat_id)
            outcome = {"interrupted": "chat.interrupted", "succeeded": "chat.completed"}
            assert outcome.get(resent["payload"]["status"]) == (
                await ended_in_store(cluster, cid, chat_id))[1], resent
    ended = await ended_in_store(cluster, cid, chat_id)
    story.append(f"the chat ended {ended} in the Store")
    for name, viewer in viewers.items():
        story.append(f"the Face first on {name} (now on {homes[name].name}) waits for it")
        await viewer.until(cluster, homes[name], cid, reached(chat_id, ended[0]))
        story.pop()

    # The conversation goes on, from the next seq.
    next_id = f"n{round_}"
    asker_node = rng.choice(survivors)
    asker = viewers[asker_node.name]
    story.append(f"the next chat sent by the Face on {asker_node.name}")
    result = await chat_admitted(asker.face, cid, f"/pace 1 after round {round_}", next_id)
    assert result["payload"]["status"] == "succeeded", result
    next_end = seq_of(result["payload"]["data"]["cursor"])
    story.append(f"the next chat ended at seq {next_end}")
    for name, viewer in viewers.items():
        story.append(f"the Face first on {name} (now on {homes[name].name}) waits for it")
        await viewer.until(cluster, homes[name], cid, reached(next_id, next_end))
        story.pop()

    truth = await cluster.events(cid)
    # A take-over may skip the seqs the dead owner had reserved (docs/cluster.md),
    # never reuse one: the next chat comes right after the end, above all seen.
    next_first = await first_seq_of(cluster, cid, next_id)
    assert truth[truth.index(ended) + 1][0] == next_first, truth
    for viewer in viewers.values():
        viewer.check_against(truth, cid)
        await viewer.face.close()
    return ended[1]


# -- an owner paused past its lease ------------------------------------------------


async def test_an_owner_paused_past_its_lease_writes_nothing_after_the_take_over_and_steps_down(
    pair: Cluster,
) -> None:
    async with asyncio.timeout(60):
        warm = await pair.face("a")
        cid = await warm.create_conversation()
        assert (await warm.chat_to_end(cid, "warm up", "warm"))["payload"]["status"] == \
            "succeeded"
        owner, other, fence = await owner_of(pair, cid)
        on_owner, on_other = await pair.face(owner), await pair.face(other)
        for face in (on_owner, on_other):
            await subscribe_with_snapshot(face, cid)
        # A reply that would end within the pause: the paused owner wakes with
        # all of it due at once, and tries to write it.
        words = " ".join(f"p{i}" for i in range(20))
        await on_owner.command("face.chat", "paused", conversation_id=cid,
                               content=f"/pace 50 {words}")
        await on_other.expect(lambda f: f["type"] == "face.chat.delta"
                              and f["payload"]["text"].strip() == "p2", 20)
        owner.pause()
        taken = await chat_admitted(on_other, cid, "/pace 1 taken over", "taken", 20)
        assert taken["payload"]["status"] == "succeeded", taken
        holder = await pair.lease_holder(cid)
        assert holder is not None and holder[0] != owner.name and holder[1] > fence, holder
        before = await pair.events(cid)
        owner.resume()

        # The woken node follows the new owner: its Face learns the truth ...
        await on_owner.expect(lambda f: is_terminal_event(f, "paused")
                              or f["type"] == "face.reset", 20)
        # ... and a chat through it goes to the new owner.
        after = await chat_admitted(on_owner, cid, "/pace 1 and on", "woken", 20)
        assert after["payload"]["status"] == "succeeded", after

    assert await pair.lease_holder(cid) == holder  # it did not take the lease back
    truth = await pair.events(cid)
    woken = [e for e in truth if e[0] >= await first_seq_of(pair, cid, "woken")]
    assert truth == before + woken, f"written after the take-over: {truth[len(before):]}"
    assert [t for _, t in await terminal_in_store(pair, cid, "paused")] == [
        "chat.interrupted"]
    # Nothing of the paused chat reached a Face after the take-over.
    interrupted = next(f for f in on_other.seen if is_terminal_event(f, "paused"))
    late = [f for f in on_other.seen[on_other.seen.index(interrupted):]
            if f["type"] == "face.chat.delta" and f["payload"]["request_id"] == "paused"]
    assert not late, late
    seqs = covered_seqs(positioned(on_other.seen, cid))
    assert seqs == sorted(set(seqs)), seqs
    reply = await pair.sql(
        "SELECT status, content FROM messages WHERE conversation_id = $1 AND request_id = $2"
        " AND role = 'assistant'", cid, "paused")
    assert [r["status"] for r in reply] == ["interrupted"], reply
    assert reply[0]["content"] != words, reply  # the paused node's full reply never landed


# -- Redis loses its data ----------------------------------------------------------


async def test_I4_redis_restarted_mid_conversation_gives_resuming_faces_a_reset_and_chat_goes_on(
    pair: Cluster,
) -> None:
    async with asyncio.timeout(60):
        on_a, on_b = await pair.face("a"), await pair.face("b")
        cid = await on_a.create_conversation()
        watcher = Viewer(on_b, await subscribe_with_snapshot(on_b, cid))
        start_a = await subscribe_with_snapshot(on_a, cid)
        done = await on_a.chat_to_end(cid, "/pace 5 one two three", "m1")
        assert done["payload"]["status"] == "succeeded", done
        await on_b.expect(lambda f: is_terminal_event(f, "m1"), 20)
        await on_a.close()
        cursor = last_cursor(on_a.seen, cid, start_a)

        await pair.restart_redis()

        resumed = await pair.face("b")
        accepted = await resumed.subscribe(cid, since=cursor)
        assert accepted["type"] == "face.accepted", accepted
        assert accepted["payload"]["conversations"][cid] == "reset", accepted  # said, not "exact"
        reset = await resumed.expect(lambda f: f["type"] == "face.reset")
        assert reset["payload"]["conversation_id"] == cid
        assert reset["payload"]["reason"] in ("cursor_expired", "epoch_changed"), reset
        snapshot_seq = seq_of(reset["payload"]["snapshot"]["cursor"])
        assert snapshot_seq >= seq_of(cursor), reset

        goes_on = await chat_admitted(resumed, cid, "/pace 5 four five", "m2")
        assert goes_on["payload"]["status"] == "succeeded", goes_on
        assert goes_on["payload"]["content"] == "four five"
        # The Face that stayed on b through the restart: the chat, or a reset; no gap.
        await watcher.until(pair, pair["b"], cid,
                            reached("m2", seq_of(goes_on["payload"]["data"]["cursor"])))

    truth = await pair.events(cid)
    assert [t for _, t in truth].count("chat.message") == 2
    m1_ended = await terminal_in_store(pair, cid, "m1")
    assert await first_seq_of(pair, cid, "m2") > m1_ended[0][0]
    assert durable(resumed.seen, cid) == [e for e in truth if e[0] > snapshot_seq]
    watcher.check_against(truth, cid)  # (if it was closed with 1012: resumed from its cursor)
