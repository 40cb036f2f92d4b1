"""Readiness (``GET /readyz``): one cheap probe per second at most, each
part named when it fails (docs/operations.md, "Health and metrics")."""

from __future__ import annotations

import asyncio

from halfpi.errors import StoreError
from halfpi.mind.health import ReadinessProbe
from tests.support.clock import FakeClock


async def test_a_readiness_probe_is_made_once_per_second_however_many_ask() -> None:
    clock = FakeClock()
    writes = 0

    async def write() -> None:
        nonlocal writes
        writes += 1
        await asyncio.sleep(0)

    probe = ReadinessProbe(write, None, clock)
    answers = await asyncio.gather(*(probe.check() for _ in range(50)))
    assert all(a.ready for a in answers)
    assert writes == 1
    clock.now += 0.5
    await probe.check()
    assert writes == 1
    clock.now += 0.6
    await probe.check()
    assert writes == 2


async def test_a_store_that_refuses_writes_is_not_ready_and_named() -> None:
    async def write() -> None:
        raise StoreError("commit failed: disk I/O error at /secret/path")

    async def ping() -> bool:
        return True

    readiness = await ReadinessProbe(write, ping, FakeClock()).check()
    assert not readiness.ready
    assert readiness.checks == {"store": "unreachable (StoreError)", "journal": "ok"}


async def test_a_journal_that_does_not_answer_in_time_is_not_ready() -> None:
    async def write() -> None:
        return None

    async def ping() -> None:
        await asyncio.Event().wait()

    probe = ReadinessProbe(write, ping, FakeClock(), timeout_s=0.05)
    readiness = await probe.check()
    assert readiness.checks == {"store": "ok", "journal": "no answer within 0.05 s"}
