"""Injected time for the Mind: a test decides when time passes."""

from __future__ import annotations

import asyncio

from halfpi.mind.scheduler import Scheduler

T0 = 1_000_000.0
# Where the wall clock starts: far from T0, so a monotonic reading put where
# wall time belongs (a ``ts``, an ``expires_at``) is a different number and
# a test that checks it fails.
WALL0 = 1_800_000_000.0


class FakeClock:
    """The Mind's two clocks in a test (``Mind(clock=c.wall, monotonic=c)``,
    ``Scheduler(c)``): calling it reads the monotonic clock, :attr:`now`;
    :meth:`wall` reads the wall clock, :attr:`now` plus :attr:`wall_offset`
    (from :data:`WALL0`: the two never read alike). Both move only when the
    test moves them.

    :meth:`advance` moves both and runs, on every scheduler it :meth:`drives`,
    the timers that came due — a two-minute TTL passes in microseconds, and
    nothing fires between two steps the test did not ask for.
    :meth:`step_wall` moves the wall clock alone, either way, as an operator
    or NTP setting the system time does: no timer may notice."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.wall_offset = WALL0 - now
        self.schedulers: list[Scheduler] = []

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self.wall_offset

    def step_wall(self, seconds: float) -> int:
        """The wall clock jumps by ``seconds`` (back when negative); the
        monotonic one stands still. Returns how many timers ran (none
        should)."""
        self.wall_offset += seconds
        return sum(s.run_due(self.now) for s in self.schedulers)

    def drives(self, scheduler: Scheduler) -> Scheduler:
        """From now on only :meth:`advance` runs ``scheduler``'s timers (call
        it before the Mind starts: no asyncio timer is armed behind the test)."""
        assert scheduler.clock is self, "a scheduler runs on its own clock"
        scheduler.driven = False
        self.schedulers.append(scheduler)
        return scheduler

    def scheduler(self) -> Scheduler:
        """A new scheduler on this clock, driven by :meth:`advance`."""
        return self.drives(Scheduler(self))

    def advance(self, seconds: float) -> int:
        """Time passes; returns how many timers ran."""
        assert seconds >= 0, "time only moves forward"
        self.now += seconds
        return sum(s.run_due(self.now) for s in self.schedulers)


class ManualSleep:
    """Use as ``Mind.sleep``: each wait is recorded (:attr:`delays`) and ends
    only when the test calls :meth:`advance` — no wall-clock waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._pending: list[asyncio.Future[None]] = []
        self.waiting = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.delays.append(seconds)
        self._pending.append(future)
        self.waiting.set()
        await future

    async def next_wait(self, timeout: float = 10.0) -> float:
        """Wait until something sleeps; return how long it asked for."""
        await asyncio.wait_for(self.waiting.wait(), timeout)
        return self.delays[-1]

    def advance(self) -> None:
        """Every wait in progress ends now."""
        self.waiting.clear()
        pending, self._pending = self._pending, []
        for future in pending:
            if not future.done():
                future.set_result(None)
