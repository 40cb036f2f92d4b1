"""The Redis journal against a real redis-server (DESIGN §10, I4)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from halfpi.config import JournalLimits
from halfpi.core.outbound import RELIABLE
from halfpi.journal.base import JournalEntry
from halfpi.journal.redis import RedisJournal, stream_key
from tests.support.redis import RedisServer, redis_server, redis_url  # noqa: F401

pytestmark = pytest.mark.asyncio


def entry(seq: int) -> JournalEntry:
    return JournalEntry(seq, RELIABLE, "face.event", b'{"n":%d}' % seq, float(seq), b"{}", "r1")


def conv() -> str:
    return f"c_{uuid.uuid4().hex}"


@pytest.fixture
async def journal(redis_url: str) -> AsyncIterator[RedisJournal]:  # noqa: F811
    j = RedisJournal.from_url(redis_url)
    yield j
    await j.close()


async def append_all(j: RedisJournal, c: str, seqs: range) -> None:
    futures = [j.append(c, entry(s)) for s in seqs]
    await asyncio.gather(*[f for f in futures if f is not None])


async def test_entries_read_back_after_a_seq_exactly_as_appended(journal: RedisJournal) -> None:
    c = conv()
    epoch = await journal.open(c, None, 0)
    await append_all(journal, c, range(1, 11))
    got = await journal.read_after(c, 4, 100)
    assert got == [entry(s) for s in range(5, 11)]
    assert await journal.read_after(c, 4, 2) == [entry(5), entry(6)]
    w = await journal.window(c)
    assert (w.epoch, w.floor, w.head) == (epoch, 0, 10)


async def test_another_node_opening_the_same_epoch_continues_the_stream(redis_url: str) -> None:  # noqa: F811
    c = conv()
    a, b = RedisJournal.from_url(redis_url), RedisJournal.from_url(redis_url)
    try:
        epoch = await a.open(c, None, 0)
        await append_all(a, c, range(1, 6))
        assert await b.open(c, epoch, 5) == epoch
        assert await b.read_after(c, 2, 10) == [entry(3), entry(4), entry(5)]
        assert await b.open(c, "e_other", 5) != "e_other"  # a stale epoch: no continuity
    finally:
        await a.close()
        await b.close()


async def test_a_cursor_below_the_trimmed_floor_is_refused(redis_url: str) -> None:  # noqa: F811
    c = conv()
    j = RedisJournal.from_url(redis_url, JournalLimits(events=10))
    try:
        await j.open(c, None, 0)
        await append_all(j, c, range(1, 2001))
        w = await j.window(c)
        assert 0 < w.floor < 2000 - 10 and w.head == 2000
        assert await j.read_after(c, w.floor - 1, 10) is None
        assert [e.seq for e in await j.read_after(c, w.floor, 3) or []] == [
            w.floor + 1, w.floor + 2, w.floor + 3]
    finally:
        await j.close()


async def test_a_gap_in_the_stream_is_never_served_as_continuous(journal: RedisJournal) -> None:
    c = conv()
    await journal.open(c, None, 0)
    await append_all(journal, c, range(1, 6))
    await journal.client.xdel(stream_key(c), "3-0")
    assert await journal.read_after(c, 1, 10) is None
    assert c in journal.lost


async def test_released_window_reopens_empty_and_settled_at_its_head(journal: RedisJournal) -> None:
    c = conv()
    epoch = await journal.open(c, None, 0)
    await append_all(journal, c, range(1, 4))
    await journal.release(c)
    assert await journal.open(c, epoch, 3) == epoch
    w = await journal.window(c)
    assert (w.floor, w.head, w.settled) == (3, 3, 3)
    assert await journal.read_after(c, 3, 10) == []


async def test_I4_redis_restarted_without_its_data_gives_a_new_epoch_never_a_silent_gap(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    c = conv()
    j = RedisJournal.from_url(redis_server.url)
    try:
        epoch = await j.open(c, None, 0)
        await append_all(j, c, range(1, 6))
        redis_server.kill()
        redis_server.start()
        # The open window notices at its next read: nothing is served as continuous.
        assert await j.read_after(c, 2, 10) is None
        assert c in j.lost
        # Reopened (by this node or another), the epoch is new: Faces are reset.
        assert await j.open(c, epoch, 5) != epoch
    finally:
        await j.close()
