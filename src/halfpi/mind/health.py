"""Is this Mind ready to serve? (``GET /readyz``, docs/operations.md)

A readiness check makes one cheap round trip to each part a request needs:

- the Store: an empty write through its writer (SQLite: ``BEGIN
  IMMEDIATE``/``COMMIT`` on the group-commit thread, which takes the write
  lock; PostgreSQL: an empty transaction), so a writer that is stuck or a
  database that refuses writes shows;
- the Journal: a Redis ``PING`` when the journal is Redis (cluster mode);
  an in-process journal is always there;
- in cluster mode, the leases: the node's renewal rounds keep up (the last
  one ended within ``lease_ms``), so it can keep the conversations it owns.

A probe's answer is kept for ``ttl_s`` (1 s) on the Mind's clock, and
checks that arrive while one runs share it: a load balancer polling every
node a hundred times a second costs one write a second, not a hundred.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from halfpi.store.base import WriteTx

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.mind.health")

# How long one probe's answer is served again.
TTL_S = 1.0
# How long each part may take to answer before it counts as down.
TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Readiness:
    """``checks``: each part's state, ``"ok"`` or one short reason (never a
    URL, a password or a driver's message: an unauthenticated client reads it)."""

    checks: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(state == "ok" for state in self.checks.values())


async def _probe(name: str, check: Awaitable[Any], timeout_s: float) -> tuple[str, str]:
    try:
        await asyncio.wait_for(check, timeout_s)
    except TimeoutError:
        return name, f"no answer within {timeout_s:g} s"
    except Exception as exc:  # any failure of the part: it is not ready
        log.warning("readiness: the %s failed its check: %s", name, type(exc).__name__)
        return name, f"unreachable ({type(exc).__name__})"
    return name, "ok"


class ReadinessProbe:
    """Readiness of one Mind, probed at most once per ``ttl_s`` of ``clock``."""

    def __init__(
        self,
        store_write: Callable[[], Awaitable[Any]],
        journal_ping: Callable[[], Awaitable[Any]] | None,
        clock: Callable[[], float],
        *,
        ttl_s: float = TTL_S,
        timeout_s: float = TIMEOUT_S,
        more: dict[str, Callable[[], Awaitable[Any]]] | None = None,
    ) -> None:
        self._more = more or {}
        self._store_write = store_write
        self._journal_ping = journal_ping
        self._clock = clock
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._last: Readiness | None = None
        self._at = float("-inf")
        self._running: asyncio.Future[Readiness] | None = None
        self.probes = 0  # probes made (not answers served): for tests

    async def check(self) -> Readiness:
        if self._last is not None and self._clock() - self._at < self.ttl_s:
            return self._last
        if self._running is None:
            self._running = asyncio.ensure_future(self._run())
        running = self._running
        return await asyncio.shield(running)

    async def _run(self) -> Readiness:
        try:
            self.probes += 1
            checks = [_probe("store", self._store_write(), self.timeout_s)]
            if self._journal_ping is not None:
                checks.append(_probe("journal", self._journal_ping(), self.timeout_s))
            else:
                checks.append(_ready("journal"))
            for name, check in self._more.items():
                checks.append(_probe(name, check(), self.timeout_s))
            readiness = Readiness(dict(await asyncio.gather(*checks)))
            self._last, self._at = readiness, self._clock()
            return readiness
        finally:
            self._running = None


async def _ready(name: str) -> tuple[str, str]:
    return name, "ok"


def probe_of(mind: Mind) -> ReadinessProbe:
    """The readiness probe of a running Mind: its Store's writer, and its
    Journal's Redis client when it has one."""

    async def store_write() -> None:
        await mind.store.write(WriteTx())

    client = getattr(mind.journal, "client", None)
    ping = getattr(client, "ping", None)
    more: dict[str, Callable[[], Awaitable[Any]]] | None = None
    if mind.cluster is not None:
        more = {"leases": mind.cluster.check_leases}
    return ReadinessProbe(store_write, ping, mind.now, more=more)
