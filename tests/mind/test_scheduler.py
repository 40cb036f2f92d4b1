"""The Mind's one scheduler: timers on the Mind's clock (STYLE: time is an argument).

On a fake clock nothing runs until the test moves it; in production one
asyncio timer, armed for the earliest deadline, runs what is due by itself
(those tests take milliseconds of real time, bounded).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from halfpi.mind.scheduler import Scheduler
from tests.support.clock import T0, FakeClock


async def test_on_a_fake_clock_timers_run_only_when_the_clock_comes() -> None:
    clock = FakeClock()
    scheduler = clock.scheduler()
    scheduler.start()  # a scheduler the test drives arms nothing behind it
    fired: list[float] = []
    scheduler.call_later(120.0, lambda: fired.append(clock()))
    scheduler.call_at(T0 + 30.0, lambda: fired.append(clock()))
    assert scheduler.next_deadline() == T0 + 30.0
    await asyncio.sleep(0)
    assert clock.advance(29.999) == 0 and fired == []
    assert clock.advance(0.001) == 1 and fired == [T0 + 30.0]
    assert clock.advance(3600.0) == 1 and fired == [T0 + 30.0, T0 + 3630.0]
    assert scheduler.next_deadline() is None


async def test_sleep_ends_when_the_minds_clock_says_so() -> None:
    clock = FakeClock()
    scheduler = clock.scheduler()
    sleeper = asyncio.ensure_future(scheduler.sleep(0.25))
    await asyncio.sleep(0)
    clock.advance(0.249)
    await asyncio.sleep(0)
    assert not sleeper.done()
    clock.advance(0.001)
    await asyncio.wait_for(sleeper, 5)
    assert len(scheduler.timers) == 0


async def test_a_cancelled_sleep_leaves_no_timer() -> None:
    scheduler = FakeClock().scheduler()
    sleeper = asyncio.ensure_future(scheduler.sleep(10.0))
    await asyncio.sleep(0)
    assert len(scheduler.timers) == 1
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert len(scheduler.timers) == 0


async def test_a_failing_timer_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    scheduler = clock.scheduler()
    fired: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    scheduler.call_later(1.0, broken)
    scheduler.call_later(1.0, fired.append, "after")
    with caplog.at_level(logging.ERROR, logger="halfpi.scheduler"):
        assert clock.advance(1.0) == 2
    assert fired == ["after"]
    assert "boom" in caplog.text


async def test_close_calls_every_timer_off_and_wakes_sleepers_with_cancel() -> None:
    clock = FakeClock()
    scheduler = clock.scheduler()
    fired: list[str] = []
    scheduler.call_later(1.0, fired.append, "ttl")
    sleeper = asyncio.ensure_future(scheduler.sleep(1.0))
    await asyncio.sleep(0)
    scheduler.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(sleeper, 5)
    assert clock.advance(10.0) == 0 and fired == []
    assert len(scheduler.timers) == 0


def test_a_scheduler_refuses_the_wall_clock() -> None:
    """Its timers are durations: ``time.time`` would stall them for the
    length of a backward step of the system clock (STYLE: two clocks)."""
    with pytest.raises(ValueError, match="monotonic"):
        Scheduler(time.time)
    assert Scheduler().clock is time.monotonic


async def test_wait_first_ends_at_the_first_done_or_at_its_timeout_on_the_minds_clock() -> None:
    clock = FakeClock()
    scheduler = clock.scheduler()
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()
    waiting = asyncio.ensure_future(scheduler.wait_first((answer,), 5.0))
    await asyncio.sleep(0)
    clock.advance(4.999)
    await asyncio.sleep(0)
    assert not waiting.done()
    answer.set_result("here")
    assert await asyncio.wait_for(waiting, 5) is True
    assert len(scheduler.timers) == 0, "its timer is called off"

    silent: asyncio.Future[str] = loop.create_future()
    waiting = asyncio.ensure_future(scheduler.wait_first((silent,), 5.0))
    await asyncio.sleep(0)
    clock.advance(5.0)
    assert await asyncio.wait_for(waiting, 5) is False
    assert not silent.done(), "what it waited for is not cancelled"


# -- driven by the event loop (production): real time, milliseconds ------------------


async def test_a_driven_scheduler_runs_a_timer_by_itself_at_its_time() -> None:
    scheduler = Scheduler()
    scheduler.start()
    try:
        fired = asyncio.get_running_loop().create_future()
        due = time.monotonic() + 0.02
        scheduler.call_at(due, lambda: fired.set_result(time.monotonic()))
        at = await asyncio.wait_for(fired, 5)
        assert at >= due, "never before its time"
    finally:
        scheduler.close()


async def test_an_earlier_timer_wakes_a_driven_scheduler_armed_for_a_later_one() -> None:
    scheduler = Scheduler()
    scheduler.start()
    try:
        later: list[str] = []
        scheduler.call_later(3600.0, later.append, "an hour")  # what the driver sleeps for
        fired = asyncio.get_running_loop().create_future()
        scheduler.call_later(0.01, fired.set_result, "soon")
        assert await asyncio.wait_for(fired, 5) == "soon"
        assert later == [] and scheduler.next_deadline() is not None
    finally:
        scheduler.close()


async def test_a_driven_scheduler_sleeps_on_the_minds_clock() -> None:
    scheduler = Scheduler()
    scheduler.start()
    try:
        started = time.monotonic()
        await asyncio.wait_for(scheduler.sleep(0.02), 5)
        assert time.monotonic() - started >= 0.02
    finally:
        scheduler.close()


async def test_a_driven_scheduler_on_a_clock_that_stands_still_runs_nothing() -> None:
    """The asyncio timer only decides when to look; the injected clock
    decides what is due."""
    clock = FakeClock()
    scheduler = Scheduler(clock)  # driven, though its clock never moves
    scheduler.start()
    try:
        fired: list[str] = []
        scheduler.call_later(0.01, fired.append, "due by the fake clock only")
        looked = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.05, looked.set_result, None)
        await asyncio.wait_for(looked, 5)  # the armed timer has fired and re-armed
        assert fired == []
        clock.now += 0.01
        assert scheduler.run_due() == 1 and fired == ["due by the fake clock only"]
    finally:
        scheduler.close()
