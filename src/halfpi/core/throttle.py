"""Failed handshakes, throttled per address (DESIGN §11). Pure: time is an argument.

A token is 256 random bits, so guessing one is hopeless; the throttle is
about what guessing costs the Mind (a hash, a credential re-read, a log
line each) and about noticing it. The rule:

- An address with no recent failure is never delayed, and nothing is kept
  for it once its handshake succeeded.
- Every failure doubles the wait before the address's next token check:
  ``base_s · 2ⁿ⁻¹`` after the n-th, capped at ``cap_s``.
- A check in flight counts as a failure until it succeeds, so parallel
  connections from one address get successive slots (each one the wait of
  one more failure) instead of guessing side by side.
- An attempt whose slot is further away than ``max_wait_s`` is refused at
  once, without a check; refusals do not push the slots further.
- A success resets the address; failures are forgotten after
  ``forget_after_s`` without one. At most ``max_addresses`` are tracked (the
  least recently active is forgotten first), so the table is bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ThrottleLimits:
    base_s: float = 0.25
    cap_s: float = 8.0
    max_wait_s: float = 8.0
    forget_after_s: float = 600.0
    max_addresses: int = 10_000


@dataclass(slots=True)
class _Address:
    failures: int
    pending: int
    next_at: float  # no check from this address starts before this time
    last: float  # the last failure (or the first attempt)
    refused: int = 0


class HandshakeThrottle:
    def __init__(self, limits: ThrottleLimits | None = None) -> None:
        self.limits = limits or ThrottleLimits()
        self._table: OrderedDict[str, _Address] = OrderedDict()

    @property
    def tracked(self) -> int:
        return len(self._table)

    def delay(self, failures: int) -> float:
        """The wait that ``failures`` failures earn."""
        if failures <= 0:
            return 0.0
        limits = self.limits
        return float(min(limits.cap_s, limits.base_s * 2.0 ** min(failures - 1, 62)))

    def admit(self, address: str, now: float) -> float | None:
        """A handshake from ``address`` wants its token checked at ``now``.

        Returns the seconds it must wait first (``0.0``: at once), or ``None``
        when it is refused without a check. An admitted attempt must end with
        :meth:`failed` or :meth:`succeeded`.
        """
        self._forget(now)
        entry = self._table.get(address)
        if entry is not None and self._expired(entry, now):
            del self._table[address]
            entry = None
        if entry is None:
            entry = _Address(failures=0, pending=0, next_at=now, last=now)
            self._table[address] = entry
            while len(self._table) > self.limits.max_addresses:
                self._table.popitem(last=False)
        presumed = entry.failures + entry.pending
        slot = max(now, entry.next_at)
        if slot - now > self.limits.max_wait_s:
            entry.refused += 1
            return None
        entry.pending += 1
        entry.next_at = slot + self.delay(presumed)
        self._table.move_to_end(address)
        return slot - now

    def failed(self, address: str, now: float) -> int:
        """The attempt's token was wrong; returns the address's failure count."""
        entry = self._table.get(address)
        if entry is None:
            entry = _Address(failures=0, pending=0, next_at=now, last=now)
            self._table[address] = entry
            while len(self._table) > self.limits.max_addresses:
                self._table.popitem(last=False)
        entry.pending = max(0, entry.pending - 1)
        entry.failures += 1
        entry.last = now
        entry.next_at = max(entry.next_at, now + self.delay(entry.failures))
        self._table.move_to_end(address)
        return entry.failures

    def succeeded(self, address: str) -> None:
        """The attempt's token was right: the address is trusted again."""
        entry = self._table.get(address)
        if entry is None:
            return
        entry.pending = max(0, entry.pending - 1)
        entry.failures = 0
        if entry.pending == 0:
            del self._table[address]

    def refused(self, address: str) -> int:
        """How many attempts from ``address`` were refused without a check."""
        entry = self._table.get(address)
        return entry.refused if entry is not None else 0

    def _expired(self, entry: _Address, now: float) -> bool:
        return entry.pending == 0 and now - entry.last >= self.limits.forget_after_s

    def _forget(self, now: float) -> None:
        """Drop expired entries from the least recently active end (amortised O(1))."""
        table = self._table
        while table:
            address, entry = next(iter(table.items()))
            if not self._expired(entry, now):
                return
            del table[address]


def client_address(peer: str, forwarded_for: list[str], trusted: frozenset[str]) -> str:
    """The address a handshake is counted under (docs/operations.md): the
    peer's own, unless the peer is a trusted proxy; then the hop that proxy
    added to ``X-Forwarded-For`` (the last entry: earlier ones come from the
    client and may be forged). ``forwarded_for``: every such header's value."""
    if peer in trusted:
        client = ",".join(forwarded_for).rpartition(",")[2].strip()
        if client:
            return client
    return peer


def worth_logging(count: int) -> bool:
    """Whether the ``count``-th occurrence of something repeated is worth a
    log line: the 1st, 2nd, 4th, 8th… — a flood of a million writes twenty."""
    return count > 0 and count & (count - 1) == 0
