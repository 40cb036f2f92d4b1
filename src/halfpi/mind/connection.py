"""One connection to the Mind, whatever door it came in by (DESIGN §4, I7, I8).

A :class:`Connection` is what every door used to rebuild by hand: the
principal and its detail mode, the bounded :class:`OutboundQueue` (I7), the
subscriptions, the order in which frames leave (``send``, then what is
``writable``: the queue, then replay pulled as fast as the peer drains),
flow control (``pause``/``resume``), one liveness rule (``tick``, shaped
per door by a :class:`Liveness` value) and ``close`` exactly once.

It is Sans-I/O: no asyncio, no socket, time passed in. A door gives it a
:class:`Framing` — how frames become bytes on its transport (``write``),
its keep-alive (``ping``) and its end (``close``) — and feeds it inbound
traffic; the Mind's :class:`~halfpi.mind.connections.Connections` (its
``Hub``) registers it, counts it against its principal's cap, writes what
each connection has ready once per loop turn, and visits it when its
deadline comes. A door is then only a framer: see docs/architecture.md,
"A new door".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec
from msgspec import UNSET

from halfpi.core.events import (
    REPLIES,
    Accepted,
    Error,
    Evicted,
    Outbound,
    Pong,
    Reply,
    Result,
    Snapshot,
    to_message,
)
from halfpi.core.outbound import Message, OutboundQueue, message
from halfpi.core.states import CONNECTION
from halfpi.errors import CloseCode, ErrorCode, HalfpiError, InternalError, Refused

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.subscriptions import Subscriptions

FLUSH_BUDGET = 256 * 1024  # bytes handed to a framing per flush (one loop turn)


class Framing(Protocol):
    """What a door supplies: its transport, seen as frames."""

    # What carries the connection, as ``GET /metrics`` labels it:
    # websocket, hand, sse, agui, durable_sse, durable, http.
    kind: str

    @property
    def budget(self) -> int:
        """Bytes of frames it takes per flush (``FLUSH_BUDGET`` for most)."""
        ...

    def write(self, frames: list[bytes]) -> None:
        """Frame and write ``frames`` (encoded messages), in order, as one write."""

    def ping(self) -> None:
        """The transport's keep-alive (a WebSocket ping, an SSE comment)."""

    def close(self, code: int, reason: str) -> None:
        """End the transport (what was written before is delivered first)."""


class Beats(Protocol):
    """What a framing may add (the WebSocket's does): a heartbeat — the
    encoded ``face.ping`` frame and the transport's ping — as one write.
    Without it a heartbeat is ``write`` then ``ping``."""

    def beat(self, frame: bytes) -> None: ...


class Hub(Protocol):
    """What a connection needs of the Mind (``mind/connections.py``)."""

    def ready(self, conn: Connection) -> None:
        """Flush ``conn`` at the end of this loop turn."""

    def bind(self, conn: Connection, credential: Credential) -> bool:
        """Count ``conn`` against its principal's cap; False when it is full."""

    def release(self, conn: Connection) -> None:
        """``conn`` is closed: deregister it, uncap it, drop what it followed."""

    def subscriptions(self, conn: Connection) -> Subscriptions: ...

    def wall(self) -> float: ...

    def heartbeat(self, now: float) -> Message:
        """The ``face.ping`` of the round at ``now``: one message (its frame's
        tail encoded once) shared by every connection whose heartbeat is due."""


@dataclass(frozen=True, slots=True)
class Liveness:
    """One door's liveness rule (docs/protocol.md §11); None: not checked.

    - ``hello_s``: a connection not welcomed this long after it opened is
      closed (4002); a hello being checked (a throttled one) waits.
    - ``ping_s``: nothing came for this long: ``Framing.ping`` (a
      WebSocket ping, which clients answer by themselves; an SSE comment).
    - ``dead_after_s``: nothing came for this long: closed (1001).
    - ``blocked_s``: writes held back this long: a slow consumer (I7),
      evicted when ``evicts`` (its cursors handed over), else closed (4008).
    - ``news_ping_s``: a ``face.ping`` message this often once welcomed.
    - ``lifetime_s``: the connection ends (``Framing.close``, 1000) this
      long after it opened (a long-poll).
    """

    hello_s: float | None = None
    ping_s: float | None = None
    dead_after_s: float | None = None
    blocked_s: float | None = None
    news_ping_s: float | None = None
    lifetime_s: float | None = None
    evicts: bool = True


INF = float("inf")
TIME_UP = "time is up"  # the reason a connection ends at its lifetime
# A heartbeat carries every ping of the connection due within this much
# (the maintenance wheel's slot): its ``face.ping`` and its transport ping
# leave together, in one write, instead of drifting a pong's round trip
# apart into two wake-ups and two writes. Only pings are sent early; a
# close (hello timeout, presumed dead, lifetime) happens when due, never before.
BEAT_SLACK_S = 1.0


class Connection:
    """One connection's life, for every door (a Caller of the Mind API)."""

    __slots__ = (
        "_released",
        "_scheduled",
        "bound",
        "checking_since",
        "closed",
        "collect",
        "detail_mode",
        "framing",
        "hub",
        "kind",
        "label",
        "last_inbound",
        "last_news_ping",
        "last_wire_ping",
        "liveness",
        "opened_at",
        "paused",
        "paused_at",
        "principal_id",
        "profile",
        "queue",
        "scopes",
        "state",
        "subscriptions",
    )

    def __init__(
        self, hub: Hub, framing: Framing, liveness: Liveness, queue: OutboundQueue, now: float,
        collect: Replies | None = None,
    ) -> None:
        self.hub = hub
        # A one-shot caller's replies go here, typed, not through the queue.
        self.collect = collect
        self.framing = framing
        self.kind = framing.kind
        self.liveness = liveness
        self.queue = queue
        self.opened_at = self.last_inbound = self.last_wire_ping = self.last_news_ping = now
        self.paused = False
        self.paused_at = now
        self.checking_since: float | None = None  # a hello is being checked
        self.state = CONNECTION.initial
        self.closed = False
        self.bound = False  # counted against the principal's cap
        self._released = False
        self._scheduled = False
        # The principal, bound once welcomed (I8).
        self.principal_id: str | None = None
        self.label = ""
        self.profile = ""
        self.scopes: frozenset[str] = frozenset()
        self.detail_mode: str | None = None  # set by its face.subscribe (DESIGN §6)
        self.subscriptions = hub.subscriptions(self)

    def __repr__(self) -> str:
        return f"<Connection {self.kind} {self.principal_id or '-'} {self.state}>"

    # -- who it is (I8) ----------------------------------------------------------------

    @property
    def welcomed(self) -> bool:
        return self.principal_id is not None

    def welcome(self, credential: Credential, *, capped: bool = True) -> bool:
        """Bind the principal; False (and nothing bound) when its cap is full."""
        if self.closed or (capped and not self.hub.bind(self, credential)):
            return False
        self.bound = capped
        self.principal_id = credential.principal_id
        self.label = credential.label
        self.profile = credential.profile
        self.scopes = credential.scopes
        self.checking_since = None
        self.state = CONNECTION.check(self.state, "open")
        return True

    def checking(self, now: float) -> None:
        """A hello arrived: its check may wait (a throttled one), unhurried."""
        self.checking_since = now

    # -- outbound (I7) -----------------------------------------------------------------

    def send(self, m: Message) -> None:
        """Write ``m`` now when nothing waits (it overtakes nothing); else
        queue it on the bounded queue, written at the end of the loop turn
        with whatever else is ready (one write). Overflow evicts."""
        if self.closed:
            return
        if self.collect is not None:
            # Only a reply that came encoded (from another node) reaches a
            # one-shot caller this way: read once, with its struct.
            kind = REPLIES.get(m.type)
            if kind is not None:
                self.collect.add(msgspec.json.decode(m.encoded_body(), type=kind))
            return
        if not (
            self.paused or self._scheduled or self.subscriptions.replaying or len(self.queue)
        ):
            self.framing.write([self.queue.emit_now(m)])
            return
        if not self.queue.push(m, pressured=self.paused):
            self.evict()
            return
        if not self._scheduled and not self.paused:
            self._scheduled = True
            self.hub.ready(self)

    def reply(self, value: Outbound) -> None:
        """A reply to this connection's command, as the Mind made it."""
        if self.collect is not None:
            if isinstance(value, Accepted | Result | Snapshot | Pong | Error):
                self.collect.add(value)
            return
        self.send(to_message(value))

    def reply_stored(self, type_: str, body: dict[str, object]) -> None:
        """A reply as the request registry stored it (``face.accepted``,
        ``face.result``): typed for a one-shot caller, framed for the rest."""
        if self.collect is not None:
            self.collect.add(msgspec.convert(body, REPLIES[type_]))
            return
        self.send(message(type_, body))

    def send_error(self, exc: HalfpiError, request_id: str | None) -> None:
        """The ``face.error`` that refuses a command (or a hello)."""
        self.send(to_message(Error(
            code=exc.code.value,
            message=exc.message,
            retryable=exc.retryable,
            request_id=UNSET if request_id is None else request_id,
            field=UNSET if exc.field is None else exc.field,
        )))

    def wake(self) -> None:
        """Subscriptions have replayed messages waiting: flush soon."""
        if not self._scheduled and not self.paused and not self.closed:
            self._scheduled = True
            self.hub.ready(self)

    def writable(self, budget: int) -> list[bytes]:
        """What may be written now: the queue, then replay (I4), pulled only
        once the queue is empty — as fast as this connection drains."""
        queue = self.queue
        frames = queue.take(budget) if len(queue) else []
        replay = self.subscriptions
        if not len(queue) and replay.replaying:
            frames.extend(replay.pull_frames(queue, budget))
        return frames

    @property
    def caught_up(self) -> bool:
        """Nothing queued and nothing left to replay."""
        return not len(self.queue) and not self.subscriptions.replaying

    def flush(self) -> None:
        """Write what is ready (the Hub calls it once per loop turn)."""
        self._scheduled = False
        if self.closed or self.paused:
            return
        frames = self.writable(self.framing.budget)
        if frames:
            self.framing.write(frames)
        if (
            (len(self.queue) or self.subscriptions.ready)
            and not self.paused
            and not self.closed
            and not self._scheduled
        ):
            self._scheduled = True
            self.hub.ready(self)

    def pause(self, now: float) -> None:
        """The transport holds writes back: queue (and coalesce) meanwhile."""
        if not self.paused:
            self.paused = True
            self.paused_at = now

    def resume(self) -> None:
        self.paused = False
        self.wake()

    def evict(self) -> None:
        """Slow consumer (I7): drop the queue, hand over the cursors, close 4008."""
        if self.closed:
            return
        if not self.liveness.evicts:
            self.close(CloseCode.SLOW_CONSUMER, "slow consumer: it does not read")
            return
        cursors = self.subscriptions.resume_cursors(self.queue.evict())
        self.framing.write([self.queue.emit_now(to_message(Evicted(cursors=cursors)))])
        self.close(CloseCode.SLOW_CONSUMER, "slow consumer: resume from your cursors")

    # -- inbound -----------------------------------------------------------------------

    def heard(self, now: float) -> None:
        """Any inbound traffic (frames, pings, pongs) proves the peer alive."""
        self.last_inbound = now

    # -- liveness (time passed in) -------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Do what is due at ``now``; return the next deadline (None once
        closed). Traffic only moves deadlines later, so one computed now is
        never late; a pause that starts after it was computed is seen by
        the next heartbeat at the latest (every open connection with a
        ``blocked_s`` has a deadline within ``ping_s``)."""
        if self.closed:
            return None
        rule = self.liveness
        blocked_at = INF
        if rule.blocked_s is not None and self.paused:
            blocked_at = self.paused_at + rule.blocked_s
            if now >= blocked_at:
                if self.welcomed:
                    self.evict()
                else:
                    self.close(CloseCode.SLOW_CONSUMER, "slow consumer: it does not read")
                return None
        deadline = blocked_at
        if rule.lifetime_s is not None:
            ends_at = self.opened_at + rule.lifetime_s
            if now >= ends_at:
                self.close(CloseCode.NORMAL, TIME_UP)
                return None
            deadline = min(deadline, ends_at)
        if not self.welcomed and rule.hello_s is not None:
            if self.checking_since is not None and rule.ping_s is not None:
                # The hello is being checked (a throttled one waits its turn).
                return min(deadline, now + rule.ping_s)
            hello_by = self.opened_at + rule.hello_s
            if now >= hello_by:
                self.close(CloseCode.HELLO_TIMEOUT, "no hello in time")
                return None
            if self.checking_since is None:
                deadline = min(deadline, hello_by)
        if rule.dead_after_s is not None:
            dead_at = self.last_inbound + rule.dead_after_s
            if now >= dead_at:
                self.close(CloseCode.GOING_AWAY, "no traffic: connection presumed dead")
                return None
            deadline = min(deadline, dead_at)
        ping_s = rule.ping_s
        wire_at = INF if ping_s is None else max(self.last_inbound, self.last_wire_ping) + ping_s
        news_s = rule.news_ping_s if self.welcomed else None
        news_at = INF if news_s is None else self.last_news_ping + news_s
        if now >= wire_at or now >= news_at:
            # A heartbeat: whatever of it is due within the slack goes now.
            soon = now + BEAT_SLACK_S
            wire, news = wire_at <= soon, news_at <= soon
            self._beat(now, wire, news)
            if wire and ping_s is not None:
                wire_at = now + ping_s
            if news and news_s is not None:
                news_at = now + news_s
        deadline = min(deadline, wire_at, news_at)
        return None if deadline == INF else deadline

    def _beat(self, now: float, wire: bool, news: bool) -> None:
        """Send the heartbeat: the transport's ping (``wire``), the shared
        ``face.ping`` (``news``; shown: wall time), as one write when the
        framing can and nothing waits ahead of it."""
        if wire:
            self.last_wire_ping = now
        if news:
            self.last_news_ping = now
            m = self.hub.heartbeat(now)
            if wire and not (
                self.paused or self._scheduled or self.subscriptions.replaying or len(self.queue)
            ):
                beat = getattr(self.framing, "beat", None)
                if beat is not None:
                    beat(self.queue.emit_now(m))
                    return
            self.send(m)
        if wire:
            self.framing.ping()

    # -- the end -----------------------------------------------------------------------

    def close(self, code: int, reason: str) -> None:
        """End the connection after what is queued, exactly once, so the
        ``face.error`` that explains a close arrives before it. (An eviction
        empties the queue first: a slow consumer gets only ``face.evicted``.)"""
        if self.closed:
            return
        self.closed = True  # from here on: a framing that closes again is not heard
        if len(self.queue):
            self.framing.write(self.queue.take(self.queue.limits.reliable_bytes))
        self.state = CONNECTION.check(self.state, "closing")
        self.framing.close(code, reason)
        self._release()

    def gone(self) -> None:
        """The transport is gone (either side closed it, or the network died)."""
        self.closed = True
        self._release()
        if self.state != "closed":
            self.state = CONNECTION.check(self.state, "closed")

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self.hub.release(self)


# A door's liveness, from the Mind's configuration (see ``Mind.liveness``).
LivenessOf = Callable[[str], Liveness]

Final = Result | Snapshot | Pong | Error


class Replies:
    """A one-shot caller's replies to its one command, as typed values —
    structs as the Mind made them, or as the request registry stored them;
    never the Mind's own bytes read back."""

    __slots__ = ("items", "on_reply")

    def __init__(self) -> None:
        self.items: list[Reply] = []
        self.on_reply: Callable[[], None] | None = None  # the door's wake-up

    def add(self, reply: Reply) -> None:
        self.items.append(reply)
        if self.on_reply is not None:
            self.on_reply()

    def final(self) -> Final | None:
        """The reply that ends the command (a result, a snapshot, a pong, an error)."""
        for reply in self.items:
            if not isinstance(reply, Accepted):
                return reply
        return None

    def accepted(self) -> Accepted | None:
        for reply in self.items:
            if isinstance(reply, Accepted):
                return reply
        return None

    def outcome(self, type_: str) -> Accepted | Result | Snapshot | Pong:
        """The final reply, else ``face.accepted`` (it still runs); an error
        raised as the refusal it is."""
        reply = self.final() or self.accepted()
        if reply is None:
            raise InternalError(f"{type_} sent no reply")
        if isinstance(reply, Error):
            raise refusal(reply)
        return reply


def refusal(error: Error) -> HalfpiError:
    """A ``face.error`` as the exception it stands for."""
    return Refused(ErrorCode(error.code), error.message,
                   field=None if error.field is UNSET else str(error.field),
                   retryable=error.retryable)
