"""Heaps of deadlines, with time passed in: the Mind's timers and its sessions'.

:class:`Timers` holds every timer of the Mind (approval TTL, Hand grace, a
run's deadline, the maintenance round): callbacks on one heap, run by
whoever says what time it is (``pop_due(now)``) — an asyncio driver in
production (``mind/scheduler.py``), a test's fake clock otherwise, so a
two-minute TTL is tested in microseconds (aioquic's ``get_timer()`` /
``handle_timer(now)``).

:class:`Deadlines` is one deadline per key (the actors' unload times);
:class:`Wheel` the same in coarse slots: what the maintenance round visits
(every connection's next heartbeat, hello timeout or presumed death).

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
import math
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


# The slot of a deadline of minus infinity ("due at once"), below any real one.
_AT_ONCE = -(2**62)


class Wheel(Generic[K]):
    """Keys with a deadline each, kept in coarse slots of ``slot_s`` seconds
    (a timing wheel; DESIGN §11: heartbeats "timed by one wheel, not per
    connection").

    The maintenance round asks for what is due at its ``now``: every slot
    that ended before ``now`` is handed over whole (no comparison, no heap
    operation per key), and only the slot ``now`` falls in is looked at key
    by key. So a deadline is never early and never later than the round
    that follows it, and setting or moving a key is a dict operation, not
    ``O(log n)`` on a heap that keeps a stale entry per move — what 10,000
    idle connections each do once per heartbeat. Only the slots in use are
    kept (a small heap of slot numbers); a slot emptied by ``discard``
    stays, empty, until its time passes.
    """

    __slots__ = ("_due", "_order", "_slots", "slot_s")

    def __init__(self, slot_s: float = 1.0) -> None:
        self.slot_s = slot_s
        self._due: dict[K, float] = {}
        self._slots: dict[int, dict[K, None]] = {}  # slot number -> its keys (ordered)
        self._order: list[int] = []  # heap of the slot numbers in _slots

    def _slot(self, at: float) -> int:
        if at == -math.inf:
            return _AT_ONCE
        if at == math.inf:
            return -_AT_ONCE
        return int(at // self.slot_s)

    def set(self, key: K, at: float) -> None:
        """``key`` is next due at ``at`` (replacing any earlier setting)."""
        due = self._due
        old = due.get(key)
        if old == at:
            return
        slot = self._slot(at)
        if old is not None:
            was = self._slot(old)
            if was == slot:
                due[key] = at
                return
            self._slots[was].pop(key, None)
        due[key] = at
        bucket = self._slots.get(slot)
        if bucket is None:
            bucket = self._slots[slot] = {}
            heapq.heappush(self._order, slot)
        bucket[key] = None

    def discard(self, key: K) -> None:
        """Forget ``key``."""
        at = self._due.pop(key, None)
        if at is not None:
            self._slots[self._slot(at)].pop(key, None)

    def pop_due(self, now: float) -> list[K]:
        """Remove and return every key due at ``now`` (slot by slot; within a
        slot in the order they were set)."""
        due, slots, order = self._due, self._slots, self._order
        current = self._slot(now)
        out: list[K] = []
        while order and order[0] < current:
            bucket = slots.pop(heapq.heappop(order))
            for key in bucket:
                del due[key]
            out.extend(bucket)
        if order and order[0] == current:
            bucket = slots[current]
            ripe = [key for key in bucket if due[key] <= now]
            for key in ripe:
                del bucket[key]
                del due[key]
            out.extend(ripe)
        return out

    def next_at(self) -> float | None:
        """The earliest live deadline, or None (a scan of the first slot in use)."""
        for slot in sorted(self._order):
            bucket = self._slots[slot]
            if bucket:
                return min(self._due[key] for key in bucket)
        return None

    def slots(self) -> int:
        """Slots in use, empty ones waiting for their time included."""
        return len(self._slots)

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due
