"""The request registry, seen from callers (DESIGN §5, I5).

``(principal_id, request_id)`` admits at most once. :meth:`Registry.admit`
is the one path of every mutation, whatever transport it came on: a new key
runs the command's own admission (which writes its record with everything
else it writes, in one transaction); a replay gets the stored outcome; a
different payload gets ``request_conflict``. A replay of a request still
running is *attached*: that caller also gets the terminal ``face.result``
when it comes (the pure decisions are in ``core/requests.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from halfpi.core.outbound import Message
from halfpi.core.requests import (
    Decision,
    RequestRecord,
    Tombstone,
    decide,
    payload_digest,
    replay_frames,
)
from halfpi.errors import RequestConflict
from halfpi.store.base import Store

Key = tuple[str, str]
Admit = Callable[[RequestRecord], Awaitable[RequestRecord | Tombstone]]


class Replier(Protocol):
    """Whoever waits for a request's replies."""

    @property
    def principal_id(self) -> str | None: ...

    def send(self, message: Message) -> None: ...

    def reply_stored(self, type_: str, body: dict[str, Any]) -> None:
        """A reply as the registry stored it (``face.accepted``, ``face.result``)."""


class _Lock:
    """A lock per key, and how many hold or wait for it (so it is dropped
    when nobody does: the registry's memory follows the commands in flight)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Registry:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._attached: dict[Key, set[Replier]] = {}
        self._locks: dict[Key, _Lock] = {}
        # For /metrics: new requests, replays of a known one, conflicts.
        self.admitted = self.replayed = self.conflicts = 0

    @contextlib.asynccontextmanager
    async def lock(self, key: Key) -> AsyncIterator[None]:
        """Serialize commands that share ``(principal_id, request_id)`` in this
        process; the store's admit-if-absent is the backstop across nodes."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _Lock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[key]

    async def admit(self, caller: Replier, type_: str, payload: Any, admit: Admit) -> None:
        """Admit ``payload`` once per ``(principal_id, request_id)``.

        ``admit`` runs only for a new key and sends its own replies; a replay
        gets the stored outcome; a different payload gets ``request_conflict``.
        """
        principal_id = caller.principal_id
        assert principal_id is not None
        digest = payload_digest(type_, payload)
        key = (principal_id, payload.request_id)
        async with self.lock(key):
            existing = await self.store.get_request(*key)
            if existing is None:
                record = RequestRecord(
                    principal_id, payload.request_id, type_, digest, "accepted", self.clock()
                )
                standing = await admit(record)
                if standing is record:
                    self.admitted += 1
                    return
                existing = standing
            await self._replay(caller, key, existing, digest)

    async def _replay(
        self, caller: Replier, key: Key, existing: RequestRecord | Tombstone, digest: str
    ) -> None:
        if decide(existing, digest) is Decision.CONFLICT:
            self.conflicts += 1
            raise RequestConflict(
                "this request_id was used for a different command", field="request_id"
            )
        self.replayed += 1
        for type_, body in replay_frames(existing):
            caller.reply_stored(type_, dict(body))
        if isinstance(existing, RequestRecord) and not existing.terminal:
            # Attach for the terminal result, then re-read: if it finished in
            # between and was not delivered to us, deliver it now (once).
            self.attach(key, caller)
            fresh = await self.store.get_request(*key)
            if fresh is not None and fresh.result is not None and self.is_attached(key, caller):
                self.detach_key(key, caller)
                caller.reply_stored("face.result", dict(fresh.result))

    # -- who waits for a terminal result ----------------------------------------

    def attach(self, key: Key, caller: Replier) -> None:
        """``caller`` will receive the terminal ``face.result`` of ``key``."""
        self._attached.setdefault(key, set()).add(caller)

    def detach(self, caller: Replier) -> None:
        """``caller`` went away: it waits for nothing any more."""
        for key in [k for k, s in self._attached.items() if caller in s]:
            self.detach_key(key, caller)

    def is_attached(self, key: Key, caller: Replier) -> bool:
        return caller in self._attached.get(key, ())

    def detach_key(self, key: Key, caller: Replier) -> None:
        callers = self._attached.get(key)
        if callers is not None:
            callers.discard(caller)
            if not callers:
                del self._attached[key]

    def deliver(self, principal_id: str, request_id: str, payload: dict[str, Any]) -> None:
        """A request's terminal ``face.result``, to everyone attached to it."""
        callers = self._attached.pop((principal_id, request_id), ())
        for caller in callers:
            caller.reply_stored("face.result", payload)
