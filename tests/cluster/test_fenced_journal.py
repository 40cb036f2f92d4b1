"""The Redis journal of a cluster owner: fenced appends, fan-out, followers
and the settle of a take-over (DESIGN §10, I2, I4) — against a real redis-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from halfpi.cluster.bus import Bus
from halfpi.cluster.lease import Leases
from halfpi.core.cluster_keys import fanout_channel
from halfpi.core.outbound import RELIABLE
from halfpi.journal.base import JournalEntry
from halfpi.journal.redis import (
    FencedAppendError,
    RedisJournal,
    fanout_entries,
    msgpack_array,
)
from tests.support.redis import RedisServer, redis_server, redis_url  # noqa: F401


def entry(seq: int) -> JournalEntry:
    return JournalEntry(seq, RELIABLE, "face.event", b'{"n":%d}' % seq, float(seq))


def conv() -> str:
    return f"c_{uuid.uuid4().hex}"


@pytest.fixture
async def pair(redis_url: str) -> AsyncIterator[tuple[RedisJournal, RedisJournal]]:  # noqa: F811
    a, b = RedisJournal.from_url(redis_url), RedisJournal.from_url(redis_url)
    a.settle_on_open = b.settle_on_open = True
    yield a, b
    await a.close()
    await b.close()


async def appended(j: RedisJournal, c: str, seqs: range) -> None:
    futures = [j.append(c, entry(s)) for s in seqs]
    await asyncio.gather(*[f for f in futures if f is not None])


async def test_I2_a_stale_owner_cannot_append_once_another_node_took_the_conversation(
    pair: tuple[RedisJournal, RedisJournal],
) -> None:
    old, new = pair
    c = conv()
    lease_a = await Leases(old.client, "a", ttl_ms=60_000).acquire(c)
    assert lease_a is not None
    epoch = await old.open(c, None, 0)
    old.fence(c, lease_a.fence)
    await appended(old, c, range(1, 4))
    refused: list[str] = []
    old.on_fenced = refused.append
    # The lease expires (deleted here: what PX does) and node b takes it over.
    await old.client.delete(f"halfpi:lease:{{{c}}}")
    lease_b = await Leases(new.client, "b", ttl_ms=60_000).acquire(c)
    assert lease_b is not None and lease_b.fence > lease_a.fence
    assert await new.open(c, epoch, 3) == epoch
    new.fence(c, lease_b.fence)
    late = old.append(c, entry(4))
    assert late is not None
    with pytest.raises(FencedAppendError):
        await late
    assert refused == [c]  # the stale owner hears it, and steps down
    await appended(new, c, range(4, 6))
    assert await new.read_after(c, 3, 10) == [entry(4), entry(5)]


async def test_an_owner_publishes_each_batch_it_appends_on_the_conversation_channel(
    pair: tuple[RedisJournal, RedisJournal],
) -> None:
    owner, follower = pair
    c = conv()
    lease = await Leases(owner.client, "a", ttl_ms=60_000).acquire(c)
    assert lease is not None
    await owner.open(c, None, 0)
    owner.fence(c, lease.fence)
    bus = Bus(follower.client)
    heard: list[JournalEntry] = []
    got_five = asyncio.Event()

    def on_entries(payload: bytes) -> None:
        heard.extend(fanout_entries(payload))
        if len(heard) >= 5:
            got_five.set()

    await bus.start({})
    try:
        await bus.listen(fanout_channel(c), on_entries)
        await appended(owner, c, range(1, 6))
        await asyncio.wait_for(got_five.wait(), 10)
    finally:
        await bus.close()
    assert heard == [entry(s) for s in range(1, 6)]  # in seq order, each once


async def test_fenced_appends_go_on_after_redis_forgot_its_scripts(
    pair: tuple[RedisJournal, RedisJournal],
) -> None:
    """The fenced append is sent by its SHA (no SCRIPT EXISTS per batch):
    when Redis no longer holds the script (restarted, SCRIPT FLUSH) the
    NOSCRIPT answer loads it and the same appends are sent again, once."""
    owner, _ = pair
    c = conv()
    lease = await Leases(owner.client, "a", ttl_ms=60_000).acquire(c)
    assert lease is not None
    await owner.open(c, None, 0)
    owner.fence(c, lease.fence)
    await appended(owner, c, range(1, 4))
    await owner.client.script_flush()
    await appended(owner, c, range(4, 7))
    assert await owner.read_after(c, 0, 10) == [entry(s) for s in range(1, 7)]


async def test_a_follower_learns_the_epoch_and_head_from_redis(
    pair: tuple[RedisJournal, RedisJournal],
) -> None:
    owner, follower = pair
    c = conv()
    assert await follower.follow(c) is None  # nobody opened it yet
    epoch = await owner.open(c, None, 0)
    await appended(owner, c, range(1, 8))
    assert await follower.follow(c) == (epoch, 7)
    assert await follower.read_after(c, 5, 10) == [entry(6), entry(7)]


async def test_I4_a_new_owner_settles_the_window_at_the_stores_head(
    pair: tuple[RedisJournal, RedisJournal],
) -> None:
    old, new = pair
    c = conv()
    epoch = await old.open(c, None, 0)
    await appended(old, c, range(1, 6))
    # The Store's head is past the seq reservation: 4096 here. The new owner
    # keeps the epoch; every cursor below the head is replayed from the Store.
    assert await new.open(c, epoch, 4096) == epoch
    window = await new.window(c)
    assert (window.epoch, window.floor, window.head, window.settled) == (epoch, 4096, 4096, 4096)
    assert await new.read_after(c, 2, 10) is None  # below the floor: the Store's to replay
    await appended(new, c, range(4097, 4099))
    assert await new.read_after(c, 4096, 10) == [entry(4097), entry(4098)]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 65535, 65536])
def test_a_fanout_batch_is_a_msgpack_array_of_the_entries_encoded_once(n: int) -> None:
    items = [msgspec.msgpack.encode(entry(s)) for s in range(n)]
    assert fanout_entries(msgpack_array(items)) == [entry(s) for s in range(n)]
