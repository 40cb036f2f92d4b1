"""Connections that have not authenticated yet (docs/operations.md, "Limits").
Pure: the servers apply these rules; time is an argument.

Why: every accepted socket costs a file descriptor, and a peer that opens
sockets and never finishes its request head or its hello costs one for as
long as it is allowed to stay. Bounding the time alone is not enough: at a
few hundred sockets a second, the bound's worth of them fills the Mind's
descriptors, ``accept`` fails, and the Face that wants in is locked out
with everyone else. So what has not shown a credential yet is also capped:

- A connection is *pending* from its accept until it authenticates (a
  Face's or Hand's hello is welcomed, an HTTP request's bearer token or
  stream ticket is accepted) or closes.
- At most ``per_address`` pending connections per address (an IPv6
  address counts by its /64: :func:`address_key`) and ``total`` in all.
  A new connection over a cap *displaces* the oldest pending one of its
  own address, or (over the total) of the address that holds the most,
  rather than being refused: a flood closes its own oldest sockets, while
  a Face, whose handshake takes milliseconds, gets through — unless the
  flood comes from as many addresses as the total cap, or from its own.
- The caps follow the descriptor limit (:func:`limits_for`): pending
  connections hold at most half of it, so authenticated Faces and Hands and
  the Mind's own files always have the other half.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Past these, more pending connections buy nothing but memory.
MAX_TOTAL = 16_384
MAX_PER_ADDRESS = 256


def address_key(address: str) -> str:
    """What the per-address cap counts: an IPv6 address's /64 (one host's
    usual share: a peer with one has 2⁶⁴ addresses to spread a flood
    over), an IPv4 address itself (mapped into IPv6 or not); anything else
    (a name, a proxy's per-connection key) as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return address


@dataclass(frozen=True, slots=True)
class PendingLimits:
    total: int
    per_address: int


def limits_for(descriptors: int) -> PendingLimits:
    """The caps for a process that may hold ``descriptors`` open files:
    pending connections take at most half; one address at most an eighth of
    that (between 4 and :data:`MAX_PER_ADDRESS`)."""
    total = max(8, min(descriptors // 2, MAX_TOTAL))
    per_address = max(4, min(total // 8, MAX_PER_ADDRESS))
    return PendingLimits(total=total, per_address=min(per_address, total))


class PendingConnections(Generic[K]):
    """The pending connections, oldest first; ``K`` is whatever the server
    names a connection by."""

    def __init__(self, limits: PendingLimits) -> None:
        self.limits = limits
        self._all: dict[K, str] = {}
        self._by_address: dict[str, OrderedDict[K, None]] = {}
        # How many each address holds: count -> those addresses (insertion
        # ordered), and the largest count, so that the biggest holder is
        # found at once however many addresses there are.
        self._holding: dict[int, dict[str, None]] = {}
        self._most = 0
        self.displaced = 0  # connections closed to make room, since the start

    @property
    def count(self) -> int:
        return len(self._all)

    def of(self, address: str) -> int:
        return len(self._by_address.get(address_key(address), ()))

    def admit(self, key: K, address: str) -> list[K]:
        """A connection from ``address`` was accepted: it is pending. Returns
        the connections it displaces (the server closes them): over the
        per-address cap, the oldest of its own address; over the total, the
        oldest of the address that holds the most (its own among equals), so
        that a flood from a few addresses displaces only itself."""
        address = address_key(address)
        out: list[K] = []
        mine = self._by_address.get(address)
        if mine is not None and len(mine) >= self.limits.per_address:
            out.append(next(iter(mine)))
            self.settle(out[-1])
        if len(self._all) >= self.limits.total:
            mine = self._by_address.get(address)
            biggest = (address if mine is not None and len(mine) >= self._most
                       else next(iter(self._holding[self._most])))
            out.append(next(iter(self._by_address[biggest])))
            self.settle(out[-1])
        mine = self._by_address.setdefault(address, OrderedDict())
        self._all[key] = address
        mine[key] = None
        self._moved(address, len(mine) - 1, len(mine))
        self.displaced += len(out)
        return out

    def settle(self, key: K) -> None:
        """``key`` authenticated or closed: it is no longer pending (again: nothing)."""
        address = self._all.pop(key, None)
        if address is None:
            return
        mine = self._by_address[address]
        del mine[key]
        self._moved(address, len(mine) + 1, len(mine))
        if not mine:
            del self._by_address[address]

    def _moved(self, address: str, before: int, now: int) -> None:
        """``address`` held ``before`` pending connections, now ``now`` (±1)."""
        if before:
            bucket = self._holding[before]
            del bucket[address]
            if not bucket:
                del self._holding[before]
        if now:
            self._holding.setdefault(now, {})[address] = None
        if now > self._most:
            self._most = now
        while self._most and self._most not in self._holding:
            self._most -= 1


class Tally:
    """Something that may repeat thousands of times a second (an ``accept``
    failing with "Too many open files"), told at most once per interval:
    :meth:`note` answers how many happened since the last line, when a line
    is due, else ``None``. The first is told at once."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.count = 0
        self.last: float | None = None

    def note(self, now: float) -> int | None:
        self.count += 1
        if self.last is not None and now - self.last < self.interval_s:
            return None
        told, self.count, self.last = self.count, 0, now
        return told

    def flush(self, now: float) -> int | None:
        """At the end of an interval: what was held back since the last
        line (``None``: nothing), so a burst that stopped is told in full."""
        if not self.count:
            return None
        told, self.count, self.last = self.count, 0, now
        return told

    def due(self) -> float | None:
        """When :meth:`flush` has something to tell (``None``: nothing held back)."""
        if not self.count or self.last is None:
            return None
        return self.last + self.interval_s
