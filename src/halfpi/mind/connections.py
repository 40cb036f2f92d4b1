"""Every live connection of the Mind, whatever its door (the ``Hub`` of
``mind/connection.py``).

It registers a connection and counts it against its principal's cap
(DESIGN §11), writes what each connection has ready once per loop turn
(one call for all of them: a thousand readers of one event cost one
callback, not a thousand), visits a connection when its liveness deadline
comes (a timing wheel of 1 s slots: an idle connection costs nothing per
round, and one round serves every heartbeat due in it, all sharing one
encoded ``face.ping``), closes the
connections of revoked credentials (I8: one mechanism for every door),
and releases a closed one exactly once (its subscriptions dropped, its
waits for results detached, its queue's counts kept for ``/metrics``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from halfpi.core.events import Ping, to_message
from halfpi.core.outbound import Message, OutboundQueue
from halfpi.core.throttle import worth_logging
from halfpi.core.timers import Wheel
from halfpi.errors import CloseCode
from halfpi.mind.caller import gone
from halfpi.mind.connection import BEAT_SLACK_S, Connection, Framing, Liveness, Replies

if TYPE_CHECKING:
    from halfpi.config import Config
    from halfpi.mind.actor import ActorEnv
    from halfpi.mind.auth import Credential
    from halfpi.mind.registry import Registry
    from halfpi.mind.subscriptions import Sink, Subscriptions

log = logging.getLogger("halfpi.mind")

# How ``GET /metrics`` labels a connection's transport, by its kind.
TRANSPORT = {"hand": "websocket"}
# Kinds told no session-level news (``Mind.announce``): a Hand, a request.
NO_NEWS = frozenset({"hand", "http"})
# The maintenance wheel's slot: deadlines are kept per second, a heartbeat
# takes along what else of it is due within one (``BEAT_SLACK_S``).
SLOT_S = BEAT_SLACK_S
# Distinct liveness rules kept to be shared (the doors' few, with room to spare).
MAX_SHARED_RULES = 64


class Host(Protocol):
    """What the connections need of the Mind (``mind/service.py``)."""

    config: Config
    registry: Registry
    env: ActorEnv

    def now(self) -> float: ...

    def wall(self) -> float: ...

    def subscriptions_for(self, sink: Sink) -> Subscriptions: ...


class Connections:
    """The Mind's connections (``Mind.connections``)."""

    def __init__(self, mind: Host) -> None:
        self.mind = mind
        self.live: set[Connection] = set()
        # When each connection next needs a visit (hello timeout, heartbeat,
        # presumed dead, a long-poll's end).
        self.deadlines: Wheel[Connection] = Wheel(SLOT_S)
        self._per_principal: Counter[str] = Counter()  # capped live connections
        self._cap_refusals: Counter[str] = Counter()
        self._ready: list[Connection] = []
        self._flushing = False
        self._call_soon: Callable[[Callable[[], None]], object] | None = None
        self._beat: tuple[float, Message] | None = None  # the round's face.ping
        self._rules: dict[Liveness, Liveness] = {}

    def __len__(self) -> int:
        return len(self.live)

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self.live))

    def __contains__(self, conn: object) -> bool:
        return conn in self.live

    # -- opening -----------------------------------------------------------------------

    def open(self, framing: Framing, liveness: Liveness,
             collect: Replies | None = None) -> Connection:
        """A new connection, not yet welcomed; its first visit is due now."""
        mind = self.mind
        # One Liveness value per rule, shared (each door makes its own per
        # call); bounded, as a long-poll's lifetime is the reader's choice.
        rules = self._rules
        shared = rules.get(liveness)
        if shared is not None:
            liveness = shared
        elif len(rules) < MAX_SHARED_RULES:
            rules[liveness] = liveness
        conn = Connection(self, framing, liveness, OutboundQueue(mind.config.queue), mind.now(),
                          collect)
        self.live.add(conn)
        self.deadlines.set(conn, float("-inf"))
        return conn

    # -- the Hub -----------------------------------------------------------------------

    def subscriptions(self, conn: Connection) -> Subscriptions:
        return self.mind.subscriptions_for(conn)

    def wall(self) -> float:
        return self.mind.wall()

    def heartbeat(self, now: float) -> Message:
        beat = self._beat
        if beat is None or beat[0] != now:
            beat = self._beat = (now, to_message(Ping(ts=self.mind.wall())))  # shown: wall time
        return beat[1]

    def bind(self, conn: Connection, credential: Credential) -> bool:
        principal_id = credential.principal_id
        cap = self.mind.config.max_connections_per_principal
        live = self._per_principal[principal_id]
        if cap and live >= cap:
            self._cap_refusals[principal_id] += 1
            refused = self._cap_refusals[principal_id]
            if worth_logging(refused):
                log.warning("refused a connection of %s: %d live already (%d refused)",
                            principal_id, live, refused)
            return False
        self._per_principal[principal_id] = live + 1
        return True

    def ready(self, conn: Connection) -> None:
        self._ready.append(conn)
        if not self._flushing:
            self._flushing = True
            call_soon = self._call_soon
            if call_soon is None:
                call_soon = self._call_soon = asyncio.get_running_loop().call_soon
            call_soon(self._flush_ready)

    def _flush_ready(self) -> None:
        """Once per loop turn: every connection with something ready writes
        it, as one write each. Those with more (replay) come back next turn."""
        self._flushing = False
        ready, self._ready = self._ready, []
        for conn in ready:
            try:
                conn.flush()
            except Exception:  # one broken connection must not stop the others
                log.exception("flushing a %s connection failed", conn.kind)

    def release(self, conn: Connection) -> None:
        mind = self.mind
        gone(conn, mind.registry)
        if conn in self.live:
            mind.env.metrics.connection_closed(conn.queue, transport_of(conn))
        self.live.discard(conn)
        self.deadlines.discard(conn)
        if conn.bound and conn.principal_id is not None:
            conn.bound = False
            principal_id = conn.principal_id
            left = self._per_principal[principal_id] - 1
            if left > 0:
                self._per_principal[principal_id] = left
            else:
                del self._per_principal[principal_id]

    # -- maintenance -------------------------------------------------------------------

    def tick(self, now: float) -> int:
        """Visit the connections whose deadline came (time passed in); each
        does what is due and names its next. Returns how many were visited."""
        due = self.deadlines.pop_due(now)
        for conn in due:
            try:
                at = conn.tick(now)
            except Exception:  # one broken connection must not stop the others
                log.exception("connection maintenance failed")
                at = now + 1.0
            if at is not None and conn in self.live:
                self.deadlines.set(conn, at)
        return len(due)

    def revoke(self, principals: set[str]) -> None:
        """Close every connection of a revoked credential, whatever its door."""
        for conn in list(self.live):
            if conn.principal_id in principals:
                conn.close(CloseCode.REVOKED, "credential revoked")

    def close_all(self, code: int, reason: str) -> None:
        """Close every connection (a drain) but the one-shot callers: each
        waits for its own command's outcome, which the drain gives it (an
        interrupted chat's result, I11), and ends with its request."""
        for conn in list(self.live):
            if conn.collect is None:
                conn.close(code, reason)

    def live_of(self, principal_id: str) -> int:
        """How many capped connections ``principal_id`` has open."""
        return self._per_principal.get(principal_id, 0)


def transport_of(conn: Connection) -> str:
    return TRANSPORT.get(conn.kind, conn.kind)


def profile_of(conn: Connection) -> str:
    if conn.kind == "hand":
        return "hand"
    return conn.profile or "none"
