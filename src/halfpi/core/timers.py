"""Heaps of deadlines, with time passed in: the Mind's timers and its sessions'.

:class:`Timers` holds every timer of the Mind (approval TTL, Hand grace, a
run's deadline, the maintenance round): callbacks on one heap, run by
whoever says what time it is (``pop_due(now)``) — an asyncio driver in
production (``mind/scheduler.py``), a test's fake clock otherwise, so a
two-minute TTL is tested in microseconds (aioquic's ``get_timer()`` /
``handle_timer(now)``).

:class:`Deadlines` is one deadline per key: what the maintenance round visits.

Every connection has a next moment at which something may be due for it
(hello timeout, heartbeat ping, presumed dead). Sweeping every connection on
every maintenance round costs CPU in proportion to the number of idle
connections; a heap of ``(deadline, key)`` costs nothing for a connection
until its deadline, and ``O(log n)`` then (aioquic's ``get_timer`` /
``handle_timer(now)``, for many keys).

Time is an argument: nothing here reads a clock. A key has at most one live
deadline; setting it again replaces the old one, which stays in the heap as a
stale entry until it surfaces or the heap is compacted (lazy deletion keeps
``set`` at one push).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")

_COMPACT_SLACK = 64


class Timer:
    """One callback due at :attr:`when`. :meth:`cancel` it and it never runs
    (the same shape as asyncio's ``TimerHandle``, so holders need not care
    which clock drives it)."""

    __slots__ = ("args", "callback", "done", "timers", "when")

    def __init__(
        self, timers: Timers, when: float, callback: Callable[..., object], args: tuple[Any, ...]
    ) -> None:
        self.timers = timers
        self.when = when
        self.callback = callback
        self.args = args
        self.done = False  # ran or cancelled

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self.timers.forget(self)

    def run(self) -> None:
        """Call the callback (the driver does, once :meth:`Timers.pop_due` gave it)."""
        self.callback(*self.args)


class Timers:
    """Timers on a heap. Nothing here reads a clock or runs anything by itself:
    :meth:`pop_due` hands over the next timer whose time came, and the caller
    runs it. A cancelled timer stays in the heap as a stale entry until it
    surfaces or the heap is compacted (cancel is O(1))."""

    __slots__ = ("_heap", "_live", "_order")

    def __init__(self) -> None:
        # (when, tie-breaker, timer): timers are never compared; equal
        # deadlines run in the order they were set.
        self._heap: list[tuple[float, int, Timer]] = []
        self._live = 0
        self._order = itertools.count()

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Timer:
        timer = Timer(self, when, callback, args)
        heapq.heappush(self._heap, (when, next(self._order), timer))
        self._live += 1
        return timer

    def forget(self, timer: Timer) -> None:
        """``timer`` was cancelled: count it out (its entry goes stale)."""
        self._live -= 1
        if len(self._heap) > 4 * self._live + _COMPACT_SLACK:
            self._heap = [entry for entry in self._heap if not entry[2].done]
            heapq.heapify(self._heap)

    def pop_due(self, now: float) -> Timer | None:
        """The earliest live timer due at ``now`` (marked done), or None.
        Call again until None: a timer set or cancelled by the one just run
        is taken into account."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)[2]
            if not timer.done:
                timer.done = True
                self._live -= 1
                return timer
        return None

    def next_deadline(self) -> float | None:
        """When the earliest live timer is due, or None."""
        heap = self._heap
        while heap and heap[0][2].done:
            heapq.heappop(heap)  # drop stale entries from the top
        return heap[0][0] if heap else None

    def clear(self) -> None:
        """Cancel every timer."""
        for _, _, timer in self._heap:
            timer.done = True
        self._heap.clear()
        self._live = 0

    def heap_size(self) -> int:
        """Entries in the heap, stale ones included (bounded by compaction)."""
        return len(self._heap)

    def __len__(self) -> int:
        return self._live


class Deadlines(Generic[K]):
    """Keys with a deadline each; :meth:`pop_due` returns those whose time came."""

    __slots__ = ("_due", "_heap", "_order")

    def __init__(self) -> None:
        self._due: dict[K, float] = {}
        # (deadline, tie-breaker, key): keys are never compared.
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()

    def set(self, key: K, at: float) -> None:
        """``key`` is next due at ``at`` (replacing any earlier setting)."""
        if self._due.get(key) == at:
            return
        self._due[key] = at
        heapq.heappush(self._heap, (at, next(self._order), key))
        if len(self._heap) > 4 * len(self._due) + _COMPACT_SLACK:
            self._compact()

    def discard(self, key: K) -> None:
        """Forget ``key``; its heap entry goes stale."""
        self._due.pop(key, None)

    def pop_due(self, now: float) -> list[K]:
        """Remove and return every key due at ``now``, earliest first."""
        heap, due = self._heap, self._due
        out: list[K] = []
        while heap and heap[0][0] <= now:
            at, _, key = heapq.heappop(heap)
            if due.get(key) == at:  # else stale: replaced or discarded
                del due[key]
                out.append(key)
        return out

    def next_at(self) -> float | None:
        """The earliest live deadline, or None."""
        heap, due = self._heap, self._due
        while heap and due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # drop stale entries from the top
        return heap[0][0] if heap else None

    def heap_size(self) -> int:
        """Entries in the heap, stale ones included (bounded by compaction)."""
        return len(self._heap)

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def _compact(self) -> None:
        order = self._order
        self._heap = [(at, next(order), key) for key, at in self._due.items()]
        heapq.heapify(self._heap)
