"""Every timer of the Mind on one heap, on the Mind's monotonic clock.

The approval TTL, a Hand's grace period, a run's deadline, a policy check's
timeout, the wait between attempts to commit a chat's end, the handshake
throttle's wait and the maintenance round are all :class:`Scheduler` timers.
Time is an argument (STYLE, aioquic's ``get_timer()`` / ``handle_timer(now)``):
the heap is :class:`halfpi.core.timers.Timers`, and whoever knows the time
runs what is due with :meth:`Scheduler.run_due`.

- In production one asyncio timer (``loop.call_at``) is armed for the
  earliest deadline; when it fires it runs what is due by the Mind's clock
  and arms itself for the next one. A timer set earlier than the armed one
  re-arms it at once. No task per timer, no polling.
- A test gives the Mind a fake clock, sets ``driven = False`` (no asyncio
  timer is ever armed), moves the clock and calls :meth:`Scheduler.run_due`:
  a two-minute TTL takes microseconds, and nothing happens between two
  steps the test did not ask for.

The armed asyncio timer only decides *when to look*: what runs is decided
by the injected clock, so a fake clock that has not moved runs nothing.

The clock is monotonic (``time.monotonic``, the event loop's own, by
default): every timer here is a duration, and a step of the wall clock — an
operator or NTP setting the time back an hour — must neither stall them for
the step nor fire them all at once (STYLE: two clocks). Wall time is only
for what is shown and stored (``expires_at``, ``ts``); a schedule kept as
wall time (an outbox row's next attempt) is turned into a delay by its owner
before it reaches this heap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from halfpi.core.timers import Timer, Timers

log = logging.getLogger("halfpi.scheduler")


class Scheduler:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, driven: bool = True
    ) -> None:
        if clock is time.time:
            raise ValueError("the scheduler counts durations: give it a monotonic clock")
        self.clock = clock
        # True: from :meth:`start` on, an asyncio timer runs what is due.
        # False: only :meth:`run_due` does (whoever moves a fake clock calls it).
        self.driven = driven
        self.timers = Timers()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed: asyncio.TimerHandle | None = None
        self._armed_for: float | None = None  # the deadline the armed timer serves
        self._sleepers: set[asyncio.Future[None]] = set()

    def now(self) -> float:
        return self.clock()

    # -- setting timers -------------------------------------------------------------

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Run ``callback(*args)`` once the (monotonic) clock reads ``when``;
        ``cancel()`` the returned timer to take it back."""
        timer = self.timers.call_at(when, callback, *args)
        if self._loop is not None and (self._armed_for is None or when < self._armed_for):
            self._arm()
        return timer

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        return self.call_at(self.clock() + delay, callback, *args)

    async def sleep(self, delay: float) -> None:
        """Wait ``delay`` seconds of the Mind's clock (the Mind's ``sleep``)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.add(future)
        timer = self.call_later(delay, _wake, future)
        try:
            await future
        finally:
            timer.cancel()
            self._sleepers.discard(future)

    async def wait_first(self, futures: Iterable[asyncio.Future[Any]], timeout: float) -> bool:
        """Wait until one of ``futures`` is done, at most ``timeout`` seconds of
        the Mind's clock (``asyncio.wait``'s timeout, counted here so a fake
        clock drives it too). True if one is done; none is cancelled."""
        waiting = set(futures)
        if any(f.done() for f in waiting):
            return True
        expired: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(timeout, _wake, expired)
        try:
            await asyncio.wait(waiting | {expired}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            expired.cancel()
        return any(f.done() for f in waiting)

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()

    # -- running them ---------------------------------------------------------------

    def run_due(self, now: float | None = None) -> int:
        """Run every timer due at ``now`` (the clock's reading by default),
        earliest first, including those the callbacks set for ``now`` or
        earlier. One failing callback does not stop the others. Returns how
        many ran."""
        if now is None:
            now = self.clock()
        ran = 0
        while (timer := self.timers.pop_due(now)) is not None:
            ran += 1
            try:
                timer.run()
            except Exception:
                log.exception("timer %r failed", timer.callback)
        if self._loop is not None:
            self._arm()
        return ran

    def start(self) -> None:
        """Drive the timers from this event loop from now on (if ``driven``)."""
        if self.driven:
            self._loop = asyncio.get_running_loop()
            self._arm()

    def close(self) -> None:
        """Stop: no timer runs any more, and whoever sleeps is cancelled."""
        self._loop = None
        if self._armed is not None:
            self._armed.cancel()
        self._armed = self._armed_for = None
        self.timers.clear()
        for future in list(self._sleepers):
            future.cancel()

    def _arm(self) -> None:
        loop = self._loop
        assert loop is not None
        when = self.timers.next_deadline()
        if when == self._armed_for and self._armed is not None:
            return
        if self._armed is not None:
            self._armed.cancel()
            self._armed = None
        self._armed_for = when
        if when is not None:
            # The injected clock says how far away it is; the loop's clock
            # (monotonic too) counts that long. If they disagree, the next
            # look re-arms.
            delay = max(0.0, when - self.clock())
            self._armed = loop.call_at(loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._armed = self._armed_for = None
        self.run_due()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
