"""Counting for ``GET /metrics`` without a cost on the hot path.

The Mind counts in plain ints where it already does work (a chat that
ends, a batch that commits), and a Prometheus collector reads them when
it is scraped (``mind/metrics.py``). A :class:`Histogram` is a list of
bucket counts and a sum: one ``bisect`` and two additions per
observation, no lock (each is written by one thread and read whole).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Seconds, for commits (milliseconds to a slow disk's fsync) ...
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# ... and for chats (a scripted reply to a long tool-using one).
CHAT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Histogram:
    """Counts of observations per bucket (upper bounds, ``le``), their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus wants them, ``+Inf`` last."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out
