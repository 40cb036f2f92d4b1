"""Is this Mind ready to serve? (``GET /readyz``, docs/operations.md)

A readiness check makes one cheap round trip to each part a request needs:

- the Store: a real write through its writer (one row of its ``meta``
  table, committed by the group-commit writer like a chat's events), so a
  writer that is stuck or a database that refuses writes shows; with SQLite
  also room on the database's disk: the probe allocates ``ROOM_BYTES`` in a
  new file next to the database and removes it, so a full disk shows even
  while the database's write-ahead log still has pages to reuse;
- the Journal: a Redis ``PING`` when the journal is Redis (cluster mode);
  an in-process journal is always there;
- in cluster mode, the leases: the node's renewal rounds keep up (the last
  one ended within ``lease_ms``), so it can keep the conversations it owns.

A probe's answer is kept for ``ttl_s`` (1 s) on the Mind's monotonic clock, and
checks that arrive while one runs share it: a load balancer polling every
node a hundred times a second costs one write a second, not a hundred. The
Store's last commit outcome is read at every check, though: once a chat's
commit failed, the Mind is not ready at once, until a later commit (the
next probe's, at the latest) succeeds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from halfpi.store.base import WriteTx

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.mind.health")

# How long one probe's answer is served again.
TTL_S = 1.0
# How long each part may take to answer before it counts as down.
TIMEOUT_S = 2.0
# The room the disk must still have: a group commit's worth of pages (16 of 4 KiB).
ROOM_BYTES = 64 * 1024
# The probe's file, next to the database; removed at once.
ROOM_FILE = ".halfpi-readyz"
# The probe's row in the Store's meta table: the time of its last write.
PROBE_KEY = "readyz_probe"
LAST_COMMIT_FAILED = "the last commit failed"


@dataclass(frozen=True, slots=True)
class Readiness:
    """``checks``: each part's state, ``"ok"`` or one short reason (never a
    URL, a password or a driver's message: an unauthenticated client reads it)."""

    checks: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(state == "ok" for state in self.checks.values())


class NoRoom(Exception):
    """The disk refused to give the probe new pages; ``why`` is the errno's
    name (``ENOSPC``, ``EROFS``, ``EDQUOT``), never a path."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def take_room(folder: Path, room: int = ROOM_BYTES) -> None:
    """Allocate ``room`` bytes in a new file in ``folder`` and remove it:
    :class:`NoRoom` when the filesystem cannot (full, read-only, over quota).
    A real allocation, not ``statvfs``: quotas, reserved blocks and a disk
    remounted read-only answer the way they will answer the database.
    Where the filesystem cannot preallocate (``EOPNOTSUPP``, no
    ``posix_fallocate`` at all) the room is written instead: that is not a
    full disk. ``O_NOFOLLOW``: a link planted under that name is refused,
    never truncated through."""
    path = folder / ROOM_FILE
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
        try:
            _allocate(fd, room)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise NoRoom(errno.errorcode.get(exc.errno or 0, "error")) from None


# fallocate's answers that say "not here", not "no room".
_CANNOT_PREALLOCATE = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})


def _allocate(fd: int, room: int) -> None:
    """``room`` bytes of real pages for ``fd``: preallocated where the
    filesystem can, else written and flushed (the disk answers either way)."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, room)
            return
        except OSError as exc:
            if exc.errno not in _CANNOT_PREALLOCATE:
                raise
    zeros = bytes(room)
    written = 0
    while written < room:
        written += os.write(fd, zeros[written:])
    os.fsync(fd)


async def _probe(name: str, check: Awaitable[Any], timeout_s: float) -> tuple[str, str]:
    try:
        await asyncio.wait_for(check, timeout_s)
    except TimeoutError:
        return name, f"no answer within {timeout_s:g} s"
    except NoRoom as exc:
        log.warning("readiness: the %s's disk has no room (%s)", name, exc.why)
        return name, f"its disk has no room ({exc.why})"
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
        commit_failed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._more = more or {}
        self._commit_failed = commit_failed
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
        readiness = self._last
        if readiness is None or self._clock() - self._at >= self.ttl_s:
            if self._running is None:
                self._running = asyncio.ensure_future(self._run())
            readiness = await asyncio.shield(self._running)
        if self._commit_failed():  # read at every check: no probe needed to say so
            readiness = Readiness({**readiness.checks, "store": LAST_COMMIT_FAILED})
        return readiness

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
    """The readiness probe of a running Mind: a real write through its
    Store's writer (and, for SQLite, room on the database's disk), its
    Store's last commit outcome, and its Journal's Redis client when it has one."""
    folder = None if mind.config.postgres else mind.config.db_path.parent
    # Each cluster node its own row: nodes probing at once never wait on one another.
    key = f"{PROBE_KEY}:{mind.config.node_id}" if mind.config.node_id else PROBE_KEY

    async def store_write() -> None:
        await mind.store.write(WriteTx(meta=((key, repr(mind.wall())),)))
        if folder is not None:
            await asyncio.to_thread(take_room, folder)

    client = getattr(mind.journal, "client", None)
    ping = getattr(client, "ping", None)
    more: dict[str, Callable[[], Awaitable[Any]]] | None = None
    if mind.cluster is not None:
        more = {"leases": mind.cluster.check_leases}
    return ReadinessProbe(
        store_write, ping, mind.now, more=more,
        commit_failed=lambda: bool(getattr(mind.store, "last_commit_failed", False)),
    )
