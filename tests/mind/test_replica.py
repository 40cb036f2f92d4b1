"""A conversation followed on a node that does not own it (DESIGN §10, I4):
two Mind nodes in this event loop on one PostgreSQL and one Redis."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from halfpi.config import Config
from halfpi.journal.base import JournalEntry
from halfpi.mind.cluster_node import ClusterNode
from halfpi.mind.replica import Replica
from halfpi.mind.service import Mind
from halfpi.process import running_mind
from tests.support.client import FaceClient
from tests.support.metrics import samples
from tests.support.postgres import pg_url, postgres  # noqa: F401
from tests.support.redis import RedisServer, redis_server  # noqa: F401

pytestmark = pytest.mark.asyncio


@contextlib.asynccontextmanager
async def node(home: Path, name: str, store: str, redis: str) -> AsyncIterator[tuple[Mind, str]]:
    config = Config(
        home=home, port=0, scripted_delta_ms=0.0, local_hand=False, store_url=store,
        journal_kind="redis", redis_url=redis, node_id=name, lease_ms=60_000,
    )
    async with running_mind(config, close_wait_s=1.0) as (mind, server):
        yield mind, f"ws://127.0.0.1:{server.port}/v1/face"


@pytest.fixture
async def two_nodes(
    tmp_path: Path, pg_url: str, redis_server: RedisServer  # noqa: F811
) -> AsyncIterator[tuple[tuple[Mind, str], tuple[Mind, str], str]]:
    async with node(tmp_path / "a", "a", pg_url, redis_server.url) as a:
        token = replace(a[0].config).face_token_path.read_text().strip()
        async with node(tmp_path / "b", "b", pg_url, redis_server.url) as b:
            yield a, b, token


def seqs(face: FaceClient, cid: str) -> list[int]:
    return [f["payload"]["seq"] for f in face.events(cid)]


@dataclass
class Followed:
    """A conversation node a owns (its Face subscribed there) and a Face
    following it live on node b, with both nodes' cluster parts."""

    mind_a: Mind
    mind_b: Mind
    a: ClusterNode
    b: ClusterNode
    owner: FaceClient
    follower: FaceClient
    cid: str


async def give_up(mind: Mind, cid: str) -> None:
    """The node steps down for ``cid`` and lets its lease go, as if it had
    died: it never writes to the conversation again, another may take it."""
    cluster = mind.cluster
    assert isinstance(cluster, ClusterNode)
    lease = cluster.held[cid]
    mind.step_down(cid)
    await cluster.leases.release(lease)


async def followed(two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str]) -> Followed:
    (mind_a, url_a), (mind_b, url_b), token = two_nodes
    assert isinstance(mind_a.cluster, ClusterNode) and isinstance(mind_b.cluster, ClusterNode)
    owner = await FaceClient.connect(url_a, token)
    cid = await owner.create_conversation()
    await owner.subscribe(cid)  # node a owns it now
    follower = await FaceClient.connect(url_b, token)
    assert (await follower.subscribe(cid))["payload"]["replay"] == "live"
    return Followed(mind_a, mind_b, mind_a.cluster, mind_b.cluster, owner, follower, cid)


async def follower_saw_it_all(owner: FaceClient, follower: FaceClient, cid: str,
                              result: dict[str, Any]) -> None:
    """Once the chat ended on the follower: every seq once, in order, as the
    owner's Face got them, and the deltas (transient) spell the reply."""
    end = await follower.expect(
        lambda f: f["type"] == "face.event" and f["payload"]["type"] == "chat.completed"
    )
    got = seqs(follower, cid)
    assert got == list(range(1, end["payload"]["seq"] + 1))  # no gap, no duplicate
    assert got == seqs(owner, cid)
    text = "".join(f["payload"]["text"] for f in follower.events(cid)
                   if f["type"] == "face.chat.delta")
    assert text == result["payload"]["content"]


async def test_I4_a_replica_that_misses_a_fanned_out_batch_replays_it_exactly(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    f = await followed(two_nodes)
    owner, follower, cid = f.owner, f.follower, f.cid
    replica = f.b.replicas[cid]
    assert isinstance(replica, Replica)

    # The pub/sub link loses the first batch of the next chat (as a dropped
    # connection would): the next batch shows a skipped seq.
    lost: list[list[JournalEntry]] = []
    receive = replica.receive

    def lossy(entries: list[JournalEntry]) -> None:
        if not lost:
            lost.append(entries)
            return
        receive(entries)

    replica.receive = lossy  # type: ignore[method-assign]
    words = " ".join(f"w{i}" for i in range(12))
    result = await owner.chat_to_end(cid, f"/pace 5 {words}", "q1")
    assert result["payload"]["status"] == "succeeded"
    await follower_saw_it_all(owner, follower, cid, result)
    assert lost and lost[0]  # something was lost on the link
    await owner.close()
    await follower.close()


async def test_a_command_sent_to_a_node_that_does_not_own_the_conversation_runs_on_its_owner(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    (mind_a, url_a), (mind_b, url_b), token = two_nodes
    owner = await FaceClient.connect(url_a, token)
    cid = await owner.create_conversation()
    await owner.subscribe(cid)
    other = await FaceClient.connect(url_b, token)
    result = await other.chat_to_end(cid, "hello from b", "q-b")
    assert result["payload"]["status"] == "succeeded"
    assert mind_a.owned(cid) is not None and mind_b.owned(cid) is None
    # The same request again, on either node: the same answer, one admission.
    again: Any = await owner.chat_to_end(cid, "hello from b", "q-b")
    assert again["payload"] == {**result["payload"], "event_seq": again["payload"]["event_seq"]}
    messages = await mind_a.store.messages(cid, limit=10, before_seq=None, max_seq=None)
    assert [m.content for m in messages.messages if m.role == "user"] == ["hello from b"]
    await owner.close()
    await other.close()


async def test_a_node_whose_lease_renewals_fall_behind_is_not_ready(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    from halfpi.mind.cluster_node import ClusterNode
    from halfpi.mind.health import probe_of

    (mind_a, _), _, _ = two_nodes
    assert isinstance(mind_a.cluster, ClusterNode)
    ready = await probe_of(mind_a).check()
    assert ready.checks == {"store": "ok", "journal": "ok", "leases": "ok"}
    mind_a.cluster.renewed_at -= 3600  # as if its renewal rounds had stalled for an hour
    stalled = await probe_of(mind_a).check()
    assert not stalled.ready
    assert stalled.checks["leases"].startswith("unreachable")


async def test_a_node_restarted_at_once_waits_for_its_previous_runs_lease_then_serves(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    from halfpi.cluster.lease import Leases
    from halfpi.mind.cluster_node import ClusterNode

    (mind_a, url_a), _, token = two_nodes
    face = await FaceClient.connect(url_a, token)
    cid = await face.create_conversation()
    assert isinstance(mind_a.cluster, ClusterNode)
    # The lease of this node's previous run (same node id, killed a moment ago).
    previous = Leases(mind_a.cluster.leases.client, "a", ttl_ms=700)
    assert await previous.acquire(cid, at_least=await mind_a.store.fence_of(cid)) is not None
    result = await face.chat_to_end(cid, "after a restart", "q-restart")
    assert result["payload"]["status"] == "succeeded", result  # waited, not refused
    lease = await mind_a.cluster.leases.holder(cid)
    assert lease is not None and lease.node_id == "a"
    assert lease.fence > 1  # a new token: the previous run's was never adopted
    await face.close()


@dataclass
class HeldTakeOver:
    """Node a ran a slow chat and died (stepped down, its lease let go); node
    b's take-over of the conversation is held at its read of open runs until
    something else on b asks for the conversation."""

    cid: str
    content: str
    taking_over: asyncio.Future[Any]
    asked: asyncio.Event  # lets the take-over go on
    url_b: str
    token: str

    async def done(self) -> None:
        self.asked.set()  # (where nothing asked for the conversation)
        await self.taking_over


async def held_take_over(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> HeldTakeOver:
    (mind_a, url_a), (mind_b, url_b), token = two_nodes
    owner = await FaceClient.connect(url_a, token)
    cid = await owner.create_conversation()
    content = "/pace 50 " + " ".join(f"w{i}" for i in range(60))
    await owner.command("face.chat", "q-slow", conversation_id=cid, content=content)
    await owner.reply("q-slow", ("face.accepted",))
    await give_up(mind_a, cid)  # as if it had died mid-chat
    await owner.close()

    at_open_chat_runs, asked = asyncio.Event(), asyncio.Event()
    open_chat_runs = mind_b.store.open_chat_runs

    async def held_open_chat_runs() -> Any:
        at_open_chat_runs.set()
        await asked.wait()
        return await open_chat_runs()

    monkeypatch.setattr(mind_b.store, "open_chat_runs", held_open_chat_runs)
    taking_over = asyncio.ensure_future(mind_b.actor(cid))
    actor = mind_b.actors.actor

    async def noticed_actor(conversation_id: str) -> Any:
        if asyncio.current_task() is not taking_over:  # someone else asks for it
            asked.set()
        return await actor(conversation_id)

    monkeypatch.setattr(mind_b.actors, "actor", noticed_actor)
    await at_open_chat_runs.wait()  # the take-over is under way
    return HeldTakeOver(cid, content, taking_over, asked, url_b, token)


async def test_I11_a_request_retried_while_a_node_takes_its_conversation_over_gets_its_outcome(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chat's request is retried on b while b is still closing what a
    left open: the retry waits for the take-over and gets the chat's outcome
    (interrupted) — never a ``face.accepted`` for a chat no node runs."""
    held = await held_take_over(two_nodes, monkeypatch)
    retrier = await FaceClient.connect(held.url_b, held.token)
    await retrier.command("face.chat", "q-slow", conversation_id=held.cid, content=held.content)
    first = await retrier.reply("q-slow", ("face.accepted", "face.result", "face.error"))
    await held.done()
    assert first["type"] == "face.result", first
    assert first["payload"]["status"] == "interrupted"
    await retrier.close()


async def test_I11_a_snapshot_read_while_a_node_takes_its_conversation_over_shows_the_outcome(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot asked of b during the take-over waits for it: the dead
    node's chat is already ``interrupted`` there, not shown still running."""
    held = await held_take_over(two_nodes, monkeypatch)
    reader = await FaceClient.connect(held.url_b, held.token)
    asked = await reader.command("face.conversation.snapshot", conversation_id=held.cid,
                                 messages_limit=50)
    snap = await reader.reply(asked, ("face.snapshot", "face.error"))
    await held.done()
    assert snap["type"] == "face.snapshot", snap
    [reply] = [m for m in snap["payload"]["messages"]
               if m["request_id"] == "q-slow" and m["role"] == "assistant"]
    assert reply["status"] == "interrupted"
    assert snap["payload"]["pending_chats"] == []
    await reader.close()


def garbage(rng: random.Random, cid: str) -> list[bytes]:
    """What a stranger with access to Redis might publish: random bytes,
    msgpack of the wrong shape, envelopes cut short or with wrong types,
    and a fan-out batch whose entries are not entries."""
    import msgspec

    shapes: list[Any] = [
        {"kind": "cmd"},  # no id
        {"kind": "done", "id": 7},  # wrong type
        {"kind": "msg", "id": "x", "body": "not bytes"},
        ["origin", "face.welcome"],  # a News cut short
        [[1, 2, 3]],  # a batch of non-entries
        {"kind": "cmd", "id": "z", "origin": "nowhere", "principal_id": "p_unknown",
         "type": "face.chat", "body": b'{"conversation_id":"' + cid.encode() + b'"}'},
    ]
    found = [msgspec.msgpack.encode(shape) for shape in shapes]
    found += [rng.randbytes(rng.randrange(0, 300)) for _ in range(40)]
    found.append(msgspec.msgpack.encode(shapes[0])[:-1])  # truncated
    return found


async def test_malformed_cluster_messages_are_dropped_and_a_follower_still_sees_every_event(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    from halfpi.core.cluster_keys import NEWS_CHANNEL, fanout_channel, node_channel

    f = await followed(two_nodes)
    mind_a, owner, follower, cid = f.mind_a, f.owner, f.follower, f.cid
    client = f.a.bus.client
    rng = random.Random(7)
    junk = garbage(rng, cid)
    channels = [node_channel("a"), node_channel("b"), NEWS_CHANNEL, fanout_channel(cid)]

    async def flood() -> None:
        for i, payload in enumerate(junk * 3):
            await client.publish(channels[i % len(channels)], payload)

    words = " ".join(f"w{i}" for i in range(20))
    chat, _ = await asyncio.gather(owner.chat_to_end(cid, f"/pace 2 {words}", "q-fuzz"), flood())
    assert chat["payload"]["status"] == "succeeded"
    await follower_saw_it_all(owner, follower, cid, chat)
    # Both nodes dropped what was not theirs, and still forward commands.
    assert f.a.bus.malformed > 0 and f.b.bus.malformed > 0
    after = await follower.chat_to_end(cid, "still forwarding?", "q-after")
    assert after["payload"]["status"] == "succeeded"
    messages = await mind_a.store.messages(cid, limit=20, before_seq=None, max_seq=None)
    assert [m.request_id for m in messages.messages if m.role == "user"] == ["q-fuzz", "q-after"]
    await owner.close()
    await follower.close()


async def test_I4_a_follower_that_missed_the_last_batch_gets_it_when_a_new_owner_settles(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    """The owner stored the chat's end but its fan-out never reached node b
    (killed between its commit and its publish, or the message was lost),
    and nothing else happens in the conversation: when a node takes it over
    (here node a again, after giving it up), the settle tells b's replica,
    which replays the end from the Store — not at some later event."""
    f = await followed(two_nodes)
    mind_a, owner, follower, cid = f.mind_a, f.owner, f.follower, f.cid
    replica = f.b.replicas[cid]
    receive = replica.receive

    def lose_every_batch(entries: list[JournalEntry]) -> None:
        if not entries:  # only what is not a batch of events gets through
            receive(entries)

    replica.receive = lose_every_batch  # type: ignore[method-assign]
    result = await owner.chat_to_end(cid, "/pace 2 one two three", "q-lost")
    assert result["payload"]["status"] == "succeeded"
    end_seq = seqs(owner, cid)[-1]
    assert seqs(follower, cid) == []  # every batch of the chat was lost on b
    await owner.close()

    # Node a gives the conversation up and takes it again: a new owner's settle.
    await give_up(mind_a, cid)
    await mind_a.actor(cid)
    end = await follower.expect(
        lambda f: f["type"] == "face.event" and f["payload"]["type"] == "chat.completed"
    )
    assert end["payload"]["seq"] == end_seq
    # Every durable event once, in order (the lost deltas were transient: the
    # new owner's settle dropped them with the stream; chat.completed has
    # the whole text).
    durable = [f["payload"]["seq"] for f in owner.events(cid) if f["type"] == "face.event"]
    assert seqs(follower, cid) == durable
    assert end["payload"]["data"]["content"] == result["payload"]["content"]
    await follower.close()


def cluster_samples(mind: Mind) -> dict[str, float]:
    """The cluster metrics of a scrape: sample name (with its outcome) → value."""
    return {name + (f"/{outcome}" if outcome else ""): value
            for (name, outcome), value in samples(mind, "halfpi_cluster_", "outcome").items()}


async def test_cluster_metrics_count_leases_replicas_forwards_take_overs_and_step_downs(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    f = await followed(two_nodes)
    mind_a, mind_b, owner, follower, cid = f.mind_a, f.mind_b, f.owner, f.follower, f.cid
    result = await follower.chat_to_end(cid, "forwarded from b", "q-metrics")
    assert result["payload"]["status"] == "succeeded"
    a, b = cluster_samples(mind_a), cluster_samples(mind_b)
    assert (a["halfpi_cluster_leases_held"], a["halfpi_cluster_replicas"]) == (1, 0)
    assert (b["halfpi_cluster_leases_held"], b["halfpi_cluster_replicas"]) == (0, 1)
    assert b["halfpi_cluster_forwards_total/answered"] >= 1  # the chat (and its subscribe)
    assert b.get("halfpi_cluster_forwards_total/unavailable", 0) == 0
    await owner.close()

    # a gives it up; b, which has a follower, takes it over.
    await give_up(mind_a, cid)
    await f.b.maintain()
    a, b = cluster_samples(mind_a), cluster_samples(mind_b)
    assert (a["halfpi_cluster_step_downs_total"], a["halfpi_cluster_leases_held"]) == (1, 0)
    assert (b["halfpi_cluster_takeovers_total"], b["halfpi_cluster_leases_held"]) == (1, 1)
    assert b["halfpi_cluster_replicas"] == 0
    assert a["halfpi_cluster_malformed_messages_total"] == 0
    await follower.close()


async def test_two_takes_of_one_conversation_on_one_node_share_one_lease(
    two_nodes: tuple[tuple[Mind, str], tuple[Mind, str], str],
) -> None:
    """A command and the outbox (say) asking for a conversation at once on
    one node: the second waits for the first take, never meets its own
    node as another owner (``unavailable``, or a forward to itself)."""
    (_, url_a), (mind_b, _), token = two_nodes
    face = await FaceClient.connect(url_a, token)
    cid = await face.create_conversation()
    cluster = mind_b.cluster
    assert cluster is not None
    first, second = await asyncio.gather(cluster.take(cid), cluster.take(cid))
    assert first is second
    await face.close()
