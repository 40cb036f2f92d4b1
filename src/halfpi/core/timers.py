"""A heap of deadlines, one per key: what the Mind's maintenance loop visits.

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
from typing import Generic, TypeVar

K = TypeVar("K")

_COMPACT_SLACK = 64


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
