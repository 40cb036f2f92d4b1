"""Credentials: tokens hashed at rest, stable principals, live revocation (I8).

A token is 32 random bytes (``hpf_…`` for Faces, ``hph_…`` for Hands) shown
once. Only its sha256 is stored: with 256 bits of entropy a slow hash adds
nothing, and lookups stay O(1). Tokens are never logged; ``describe`` shows
a credential without its secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from halfpi.core.ids import new_principal_id
from halfpi.core.scopes import scopes_for
from halfpi.private import private_dir
from halfpi.store.base import Credential as Credential  # what transports are given
from halfpi.store.base import Store

log = logging.getLogger("halfpi.mind.auth")

TOKEN_PREFIX = {"face": "hpf_", "hand": "hph_"}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(kind: str) -> str:
    return TOKEN_PREFIX[kind] + secrets.token_urlsafe(32)


def make_credential(
    kind: str, label: str, profile: str, scopes: frozenset[str], now: float
) -> tuple[Credential, str]:
    token = new_token(kind)
    credential = Credential(
        principal_id=new_principal_id(now),
        label=label,
        kind=kind,
        profile=profile,
        scopes=scopes,
        token_hash=hash_token(token),
        created_at=now,
    )
    return credential, token


class CredentialCache:
    """The Mind's in-memory view of the credential table, refreshed by version."""

    def __init__(self) -> None:
        self.version = -1
        self._by_hash: dict[str, Credential] = {}
        self._by_principal: dict[str, Credential] = {}

    def load(self, credentials: list[Credential], version: int) -> set[str]:
        """Replace the view; return principal ids that are no longer live."""
        before = {p for p, c in self._by_principal.items() if c.live}
        self._by_principal = {c.principal_id: c for c in credentials}
        self._by_hash = {c.token_hash: c for c in credentials}
        self.version = version
        now_live = {p for p, c in self._by_principal.items() if c.live}
        return before - now_live

    def authenticate(self, token: str, kind: str) -> Credential | None:
        credential = self._by_hash.get(hash_token(token))
        if credential is None or not credential.live or credential.kind != kind:
            return None
        # The dict lookup already matched; compare again in constant time so
        # the check does not depend on dict internals.
        if not hmac.compare_digest(credential.token_hash, hash_token(token)):
            return None
        return credential

    def get(self, principal_id: str) -> Credential | None:
        credential = self._by_principal.get(principal_id)
        return credential if credential is not None and credential.live else None

    def has_face(self) -> bool:
        return any(c.kind == "face" for c in self._by_principal.values())

    def has_kind_label(self, kind: str, label: str) -> bool:
        return any(
            c.kind == kind and c.label == label and c.live for c in self._by_principal.values()
        )


class SharedReread:
    """Re-read the credential table for unknown tokens, at most once per
    ``interval`` however many arrive, every waiter sharing one read.

    A waiter never joins a read that has already started (it might have
    missed a credential created a moment before the waiter's token came):
    it waits for the next one, which starts at most ``interval`` after the
    last, and never before the last one ended. So a credential just created
    works at once (within ``interval``), a flood of unknown tokens costs one
    read per ``interval``, and a Store that stops answering holds one read
    and one waiting to start, however many waiters come. A failed read is
    logged once until one succeeds again.
    """

    def __init__(
        self,
        refresh: Callable[[], Awaitable[None]],
        clock: Callable[[], float],
        interval: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.refresh = refresh
        self.clock = clock
        self.interval = interval
        self.sleep = sleep
        self.reads = 0
        self._last_start = float("-inf")
        self._next: asyncio.Task[None] | None = None  # not started yet: joinable
        self._running: asyncio.Task[None] | None = None
        self._failing = False

    async def wait(self) -> None:
        """Return once a read that started after this call has finished."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_task(self._read())
        await asyncio.shield(self._next)

    async def wait_within(self, seconds: float) -> None:
        """:meth:`wait`, at most ``seconds`` of ``sleep``'s clock: a read that
        hangs leaves the view read last in force (the read itself goes on,
        shared), never a waiter waiting for ever."""
        reading = asyncio.ensure_future(self.wait())
        timer = asyncio.ensure_future(self.sleep(seconds))
        try:
            await asyncio.wait({reading, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            reading.cancel()  # only this waiter's: the read is shielded

    async def _read(self) -> None:
        previous = self._running
        if previous is not None and not previous.done():
            await asyncio.wait([previous])  # one read at a time
        delay = self._last_start + self.interval - self.clock()
        if delay > 0:
            await self.sleep(delay)
        self._next = None  # from here on, newcomers wait for the next read
        self._running = asyncio.current_task()
        self._last_start = self.clock()
        self.reads += 1
        try:
            await self.refresh()
        except Exception as exc:  # the waiters go on with the view they have
            if not self._failing:
                log.warning("reading the credentials failed (%s); the view read last stands",
                            exc)
            self._failing = True
        else:
            self._failing = False


@dataclass(frozen=True)
class AddedCredential:
    credential: Credential
    token: str


async def add_credential(
    store: Store,
    kind: str,
    label: str,
    profile: str,
    now: float,
    *,
    extra_scopes: tuple[str, ...] = (),
    approve: bool = False,
) -> AddedCredential:
    """Create a credential with a fresh principal and token (``halfpi face
    add``, ``halfpi hand add``). Raises ValueError for an unknown profile or
    scope (before touching the store) and LabelInUse when a live credential
    of ``kind`` has ``label``."""
    scopes = scopes_for(profile, extra_scopes, approve=approve) if kind == "face" else frozenset()
    credential, token = make_credential(kind, label, profile, scopes, now)
    await store.add_credential(credential)
    return AddedCredential(credential, token)


def write_token_file(path: Path, token: str) -> None:
    """Write a token readable by its owner only (mode 0600, created that way)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)
