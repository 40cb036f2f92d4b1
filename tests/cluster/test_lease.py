"""Conversation leases on a real redis-server (DESIGN §10)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from halfpi.cluster.lease import Lease, Leases
from tests.support.redis import RedisServer, redis_server, redis_url  # noqa: F401

pytestmark = pytest.mark.asyncio


def conv() -> str:
    return f"c_{uuid.uuid4().hex}"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:  # noqa: F811
    c = Redis.from_url(redis_url)
    yield c
    await c.aclose()


async def take_when_free(leases: Leases, c: str, at_least: int = 0) -> Lease:
    """Poll until the lease can be taken (expiry is Redis's), with a deadline."""
    deadline = time.monotonic() + 5
    while (lease := await leases.acquire(c, at_least)) is None:
        assert time.monotonic() < deadline, "the lease never expired"
        await asyncio.sleep(0.01)
    return lease


async def test_only_one_node_holds_a_conversation_lease(client: Redis) -> None:
    c = conv()
    a, b = Leases(client, "a"), Leases(client, "b")
    lease = await a.acquire(c)
    assert lease is not None and lease.fence == 1
    assert await b.acquire(c) is None
    assert await a.acquire(c) is None  # not re-entrant: the holder renews instead
    assert await b.holder(c) == lease


async def test_an_expired_lease_is_taken_over_with_a_larger_fence_and_the_old_owner_cannot_renew(
    client: Redis,
) -> None:
    c = conv()
    a, b = Leases(client, "a", ttl_ms=100), Leases(client, "b", ttl_ms=100)
    old = await a.acquire(c)
    assert old is not None
    new = await take_when_free(b, c)
    assert new.node_id == "b" and new.fence > old.fence
    assert not await a.renew(old)  # it learns it lost the conversation
    assert not await a.release(old)  # and cannot free what b holds
    assert await b.holder(c) == new


async def test_renewal_keeps_the_lease_past_its_first_ttl(client: Redis) -> None:
    c = conv()
    a, b = Leases(client, "a", ttl_ms=300), Leases(client, "b")
    lease = await a.acquire(c)
    assert lease is not None
    start = time.monotonic()
    while time.monotonic() - start < 0.9:  # three TTLs, renewed every ~third
        assert await a.renew(lease)
        assert await b.acquire(c) is None
        await asyncio.sleep(0.1)
    assert await client.pttl(f"halfpi:lease:{{{c}}}") > 0


async def test_a_released_lease_is_taken_at_once_with_a_larger_fence(client: Redis) -> None:
    c = conv()
    a, b = Leases(client, "a"), Leases(client, "b")
    first = await a.acquire(c)
    assert first is not None and await a.release(first)
    second = await b.acquire(c)
    assert second is not None and second.fence == first.fence + 1


async def test_the_fence_only_grows_even_when_redis_lost_its_data(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    c = conv()
    client = Redis.from_url(redis_server.url)
    try:
        leases = Leases(client, "a")
        fences = []
        for _ in range(3):
            lease = await leases.acquire(c)
            assert lease is not None
            fences.append(lease.fence)
            await leases.release(lease)
        await client.aclose()
        redis_server.kill()
        redis_server.start()
        client = Redis.from_url(redis_server.url)
        leases = Leases(client, "b")
        # The taker passes the highest fence it knows (the Store keeps it).
        after = await leases.acquire(c, at_least=fences[-1])
        assert after is not None and after.fence > fences[-1]
        assert fences == sorted(set(fences))
    finally:
        await client.aclose()


async def test_a_node_id_with_the_separator_is_refused(client: Redis) -> None:
    with pytest.raises(ValueError):
        Leases(client, "a|b")
