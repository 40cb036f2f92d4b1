"""Unknown tokens re-read the credential table, at most once per interval."""

from __future__ import annotations

import asyncio

import pytest

from halfpi.mind.auth import SharedReread


class Clock:
    """Time that moves only when the re-read sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


async def test_many_unknown_tokens_at_once_share_one_read() -> None:
    clock = Clock()
    reads: list[float] = []

    async def refresh() -> None:
        reads.append(clock.now)
        await asyncio.sleep(0)

    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    await asyncio.gather(*(gate.wait() for _ in range(50)))
    assert reads == [100.0]


async def test_reads_are_at_least_an_interval_apart() -> None:
    clock = Clock()
    reads: list[float] = []

    async def refresh() -> None:
        reads.append(clock.now)

    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    for _ in range(5):
        await gate.wait()
    assert reads == pytest.approx([100.0, 100.1, 100.2, 100.3, 100.4])
    assert len(clock.slept) == 4


async def test_a_waiter_arriving_during_a_read_waits_for_the_next_one() -> None:
    # The read in progress may have missed a credential created a moment
    # before this token came: only a read started afterwards can tell.
    clock = Clock()
    started = asyncio.Event()
    release = asyncio.Event()
    reads = 0

    async def refresh() -> None:
        nonlocal reads
        reads += 1
        started.set()
        await release.wait()

    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    first = asyncio.create_task(gate.wait())
    await started.wait()
    late = asyncio.create_task(gate.wait())
    await asyncio.sleep(0)
    assert reads == 1
    release.set()
    await asyncio.gather(first, late)
    assert reads == 2


async def test_a_failing_read_lets_the_waiters_go_on() -> None:
    clock = Clock()

    async def refresh() -> None:
        raise OSError("the store is gone")

    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    await asyncio.wait_for(gate.wait(), 5)
