"""Who may connect (DESIGN §11, I8): the credentials as last read, their
re-reads, and the handshake throttle — one part of the Mind.

The Mind asks it to ``authenticate`` a handshake's token and to ``refresh``
its view; what a revocation means for live connections is the Mind's
(``Mind.refresh_credentials`` closes them, whatever their door). Tokens are
hashed at rest (``mind/auth.py``) and never logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from halfpi.config import Config
from halfpi.core.scopes import scopes_for
from halfpi.core.throttle import HandshakeThrottle, worth_logging
from halfpi.errors import RateLimited
from halfpi.mind.auth import CredentialCache, SharedReread, make_credential, write_token_file
from halfpi.mind.counters import MindMetrics
from halfpi.store.base import Credential, Store

log = logging.getLogger("halfpi.mind")

# How long a handshake waits for the credentials version before it goes on
# with the credentials read last (a Store that stopped answering).
RECHECK_TIMEOUT_S = 1.0
# A known token's handshake reads the credentials version unless a read that
# started at most this long ago has finished: a token revoked earlier than
# that is refused, on every node, and a stream of HTTP requests (each one a
# handshake) costs at most ten reads a second, not one each
# (benchmarks/http_requests.py).
RECHECK_FRESH_S = 0.1
# A revocation closes live connections within a second (I8; docs/operations.md,
# Store.credentials_version). The maintenance round (every credential_poll_s,
# 0.25 s) polls the version through ``poll``, which reads it only when no read
# began within POLL_S: a revocation committed just after a read began is seen
# by the read that begins at most POLL_S plus one round later (0.75 s, plus
# the read itself), and an idle Mind hops to the Store's reader thread twice a
# second instead of four times (each hop ~0.3 to 0.5 ms of CPU on a busy
# machine: most of what an idle Mind spends). Reads that must see the Store
# as it is now (a handshake's recheck, an unknown token, the start) are
# ``refresh``, never skipped.
POLL_S = 0.5


class Credentials:
    """The Mind's credentials (``Mind.credentials``)."""

    def __init__(
        self,
        store: Callable[[], Store],
        config: Config,
        monotonic: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        metrics: MindMetrics,
        reread: Callable[[], Awaitable[None]],
    ) -> None:
        self._store = store
        self.config = config
        self.monotonic = monotonic
        self.sleep = sleep
        self.metrics = metrics
        self.cache = CredentialCache()
        self.throttle = HandshakeThrottle(config.handshake_throttle)
        # An unknown token: one shared re-read per credential_reread_s.
        self._reread = SharedReread(reread, monotonic, config.credential_reread_s, sleep)
        # A known token is checked against the credentials version at its
        # handshake (a hello, an HTTP request), unless the view is fresher
        # than RECHECK_FRESH_S (those arriving together share one read): a
        # credential revoked from another process or node since the last
        # poll is refused within RECHECK_FRESH_S, never welcomed for the
        # poll's interval. A Store slower than RECHECK_TIMEOUT_S leaves the
        # view read last in force.
        self._recheck = SharedReread(reread, monotonic, 0.0, sleep)
        self._read_at = float("-inf")  # when the last read that finished began
        self._refreshing = asyncio.Lock()

    async def refresh(self) -> set[str]:
        """Read the credentials again when their version moved; returns the
        principals revoked since the last read."""
        store = self._store()
        async with self._refreshing:  # one load at a time: never an older view last
            began = self.monotonic()
            version = await store.credentials_version()
            if version == self.cache.version:
                self._read_at = began
                return set()
            revoked = self.cache.load(await store.credentials(), version)
            self._read_at = began
        return set(revoked)

    async def poll(self) -> set[str]:
        """The maintenance round's re-read: :meth:`refresh` unless a read began
        less than ``POLL_S`` ago (any read: a handshake's recheck counts).
        Returns the principals revoked since the last read."""
        if self.monotonic() - self._read_at < POLL_S:
            return set()
        return await self.refresh()

    async def authenticate(
        self, token: str, kind: str, address: str, *, label: str | None = None
    ) -> Credential | None:
        """Check a handshake's token (and, for a Hand, its label), throttled
        per address (DESIGN §11, ``core/throttle.py``).

        Raises :class:`RateLimited` when the address must not try yet; waits
        its turn otherwise. An unknown token triggers a re-read of the
        credential table first, so a credential created a moment ago works at
        once — one shared re-read per ``credential_reread_s``, however many
        unknown tokens arrive; a known one a read of the credentials version
        unless one began at most ``RECHECK_FRESH_S`` ago (shared by the
        handshakes that arrive together), so one revoked earlier than that,
        from another process or node, is refused. Failures are
        logged with the address and the count, never the token.
        """
        throttle = self.throttle
        wait = throttle.admit(address, self.monotonic())
        if wait is None:
            refused = throttle.refused(address)
            if worth_logging(refused):
                log.warning(
                    "handshake from %s refused unchecked: %d attempts while throttled",
                    address,
                    refused,
                )
            self.metrics.handshakes_throttled += 1
            raise RateLimited("too many failed handshakes from this address; retry later")
        if wait > 0:
            await self.sleep(wait)
        cache = self.cache
        credential = cache.authenticate(token, kind)
        known = credential is not None
        if not known:
            await self._reread.wait_within(RECHECK_TIMEOUT_S)
            credential = cache.authenticate(token, kind)
        if credential is None or (label is not None and credential.label != label):
            count = throttle.failed(address, self.monotonic())
            self.metrics.handshakes_failed[kind] += 1
            log.warning(
                "handshake from %s failed: unknown or revoked %s credential "
                "(failure %d from this address; its next check waits %.2f s)",
                address,
                kind,
                count,
                throttle.delay(count),
            )
            return None
        throttle.succeeded(address)  # the token is right: no longer a guess in flight
        if known and self.monotonic() - self._read_at > RECHECK_FRESH_S:
            # Known from the view read last: still live? (Revoked by the CLI
            # or on another node since the last poll.) Read after the
            # throttle let go, so a burst of right tokens never waits on it.
            await self._recheck.wait_within(RECHECK_TIMEOUT_S)
            if cache.authenticate(token, kind) is None:
                self.metrics.handshakes_failed[kind] += 1
                log.warning("handshake from %s failed: its %s credential was just revoked",
                            address, kind)
                return None
        return credential

    async def create_local_face(self, now: float) -> None:
        """First start: the owner's own terminal gets an operator credential
        that may approve, its token written to ``face.token`` (mode 0600)."""
        scopes = scopes_for("operator", approve=True)
        credential, token = make_credential("face", "local", "operator", scopes, now)
        await self._store().add_credential(credential)
        write_token_file(self.config.face_token_path, token)
        log.info("created the local operator credential; token in %s", self.config.face_token_path)

    async def create_local_hand(self, now: float) -> None:
        """First start with the embedded Hand: its credential, its token in
        ``hand.token``."""
        label = self.config.local_hand_label
        credential, token = make_credential("hand", label, "hand", frozenset(), now)
        await self._store().add_credential(credential)
        write_token_file(self.config.hand_token_path, token)
