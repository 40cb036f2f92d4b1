"""One Face connection, whatever transport carries it (DESIGN §4, I7, I8).

The session owns the connection: its state machine (``awaiting_hello →
open → closing → closed``), the hello and authentication, the per-command
re-authorisation and scope check (I8), the order of its commands, its
bounded outbound queue and flush (I7), and liveness. What a command means
is the Mind's: the session decodes a frame, checks who may send it, and
calls the Mind API (``mind/api.py``) as a :class:`~halfpi.mind.caller.Caller`
— a principal with a reply sink — then writes what it is sent. It never
touches the store, the journal or an actor (``tests/gateway/test_thin.py``).

A transport adapter feeds it text frames and writability changes and gives
it a :class:`Transport` to write to; the session never touches a socket.

Commands of one connection are handled in arrival order by a worker task
that exists only while there is work (an idle connection costs no task).
Frames leave through :meth:`send`: queue, then flush at the end of the
current loop iteration so several messages share one write. Replayed
events are pulled from the connection's subscriptions as it drains.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from msgspec import UNSET

from halfpi.config import PROTOCOL_VERSION
from halfpi.core import wire
from halfpi.core.events import Error, Evicted, Ping, to_message
from halfpi.core.outbound import Message, OutboundQueue
from halfpi.core.states import CONNECTION
from halfpi.errors import (
    CloseCode,
    HalfpiError,
    InternalError,
    InvalidRequest,
    RateLimited,
    Unauthorized,
)
from halfpi.mind import api

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway")

FLUSH_BUDGET = 256 * 1024  # bytes handed to the transport per flush round
MAX_INBOX = 256
MAX_INBOX_BEFORE_HELLO = 4  # with at most 1 MiB each: bounded before anyone is known
OVERSIZED = b"\x00oversized:"  # stands in the inbox for a frame too large to keep


class Transport(Protocol):
    # The peer's address, as the handshake throttle counts it.
    address: str

    def write_frames(self, frames: list[bytes]) -> None: ...

    def ping(self) -> None:
        """A transport-level ping (a WebSocket ping): clients answer it by
        themselves, so a Face that only reads still shows it is alive."""

    def close(self, code: int, reason: str) -> None: ...


class FaceSession:
    def __init__(self, mind: Mind, transport: Transport) -> None:
        self.mind = mind
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        now = mind.now()
        self.connected_at = now
        self.last_inbound = now
        self.last_ping = now
        self.last_wire_ping = now
        self.paused_at = now
        self.hello_at: float | None = None  # the hello arrived; its check may wait
        self.bound = False  # counted against the principal's connection cap
        self.state = CONNECTION.initial
        self.queue = OutboundQueue(mind.config.queue)
        # The principal, bound at the hello (I8).
        self.principal_id: str | None = None
        self.label = ""
        self.profile = ""
        self.scopes: frozenset[str] = frozenset()
        self.detail_mode: str | None = None
        self.subscriptions = mind.subscriptions_for(self)
        self.paused = False
        self.closed = False
        self._flush_scheduled = False
        self._inbox: deque[bytes] = deque()
        self._worker: asyncio.Task[None] | None = None
        self.invalid_streak = 0
        mind.add_session(self)

    # -- outbound (I7) -----------------------------------------------------------

    def send(self, m: Message) -> None:
        if self.closed:
            return
        if not (
            self.paused or self._flush_scheduled or self.subscriptions.replaying or len(self.queue)
        ):
            # Idle: nothing waits, so writing now overtakes nothing.
            self.transport.write_frames([self.queue.emit_now(m)])
            return
        if not self.queue.push(m, pressured=self.paused):
            self.evict()
            return
        if not self._flush_scheduled and not self.paused:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def send_error(self, exc: HalfpiError, request_id: str | None) -> None:
        error = Error(
            code=exc.code.value,
            message=exc.message,
            retryable=exc.retryable,
            request_id=UNSET if request_id is None else request_id,
            field=UNSET if exc.field is None else exc.field,
        )
        self.send(to_message(error))

    def wake(self) -> None:
        """Subscriptions have replayed messages waiting: flush soon."""
        if not self._flush_scheduled and not self.paused and not self.closed:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self.paused:
            return
        queue = self.queue
        frames = queue.take(FLUSH_BUDGET) if len(queue) else []
        replay = self.subscriptions
        if not len(queue) and replay.replaying:
            # Replay (I4): as fast as this connection drains, never all at once.
            frames.extend(replay.pull_frames(queue, FLUSH_BUDGET))
        if frames:
            self.transport.write_frames(frames)
        if (len(queue) or replay.ready) and not self.paused and not self.closed:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def pause_writing(self) -> None:
        if not self.paused:
            self.paused = True
            self.paused_at = self.mind.now()

    def resume_writing(self) -> None:
        self.paused = False
        if not self._flush_scheduled and not self.closed:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def evict(self) -> None:
        """Slow consumer (I7): drop the queue, hand over the cursors, close 4008."""
        if self.closed:
            return
        cursors = self.subscriptions.resume_cursors(self.queue.evict())
        frame = self.queue.emit_now(to_message(Evicted(cursors=cursors)))
        self.transport.write_frames([frame])
        self.close(CloseCode.SLOW_CONSUMER, "slow consumer: resume from your cursors")

    # -- inbound -------------------------------------------------------------------

    def on_frame(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_inbound = self.mind.now()
        limit = MAX_INBOX if self.state == "open" else MAX_INBOX_BEFORE_HELLO
        if len(self._inbox) >= limit:
            self.send_error(RateLimited("too many commands in flight"), wire.request_id_of(data))
            return
        if len(data) > self.mind.config.max_frame_bytes:
            # Refused in order, but not kept: an oversized frame costs no memory.
            data = OVERSIZED + str(len(data)).encode()
        self._inbox.append(data)
        if self._worker is None:
            self._worker = self.loop.create_task(self._work())

    def on_binary(self) -> None:
        self.on_frame(b"\x00binary")  # not JSON: refused as invalid_request like any garbage

    def on_traffic(self) -> None:
        """Any inbound traffic (pings and pongs included) proves the Face is alive."""
        self.last_inbound = self.mind.now()

    @property
    def busy(self) -> bool:
        """Frames are waiting or being handled."""
        return self._worker is not None or bool(self._inbox)

    async def _work(self) -> None:
        try:
            while self._inbox and not self.closed:
                await self._handle(self._inbox.popleft())
                # Let the replies flush between commands: a pipelining Face
                # that reads promptly must never look like a slow one.
                await asyncio.sleep(0)
        finally:
            self._worker = None

    async def _handle(self, data: bytes) -> None:
        config = self.mind.config
        hello = self.state == "awaiting_hello"
        if data.startswith(OVERSIZED):
            size = data[len(OVERSIZED) :].decode()
            exc = InvalidRequest(f"frame of {size} bytes exceeds {config.max_frame_bytes}")
            if hello:
                self._refuse_hello(exc, CloseCode.UNAUTHORIZED, "hello required")
            else:
                self._invalid(exc, None)
            return
        try:
            type_, payload = wire.decode_command(data)
        except InvalidRequest as exc:
            if hello:  # every failed hello is answered and closed alike (4001)
                self._refuse_hello(exc, CloseCode.UNAUTHORIZED, "invalid hello")
            else:
                self._invalid(exc, wire.request_id_of(data))
            return
        self.invalid_streak = 0
        if hello:
            if type_ != "face.hello":
                self._refuse_hello(
                    InvalidRequest("the first frame must be face.hello", field="type"),
                    CloseCode.UNAUTHORIZED,
                    "hello required",
                )
                return
            try:
                await self._hello(payload)
            except Exception:  # a bug or a store failure: say so, never hang
                log.exception("hello failed")
                self._refuse_hello(
                    InternalError("internal error"), CloseCode.INTERNAL_ERROR, "internal error"
                )
            return
        request_id = getattr(payload, "request_id", None)
        if type_ == "face.hello":
            self.send_error(InvalidRequest("hello was already received", field="type"), None)
            return
        # I8: every command re-checks the credential as it is now.
        credential = self.mind.credential(self.principal_id or "")
        if credential is None:
            self.close(CloseCode.REVOKED, "credential revoked")
            return
        try:
            api.authorize(credential.scopes, type_)
            await api.handle(self.mind, self, type_, payload)
        except HalfpiError as exc:
            self.send_error(exc, request_id)
        except Exception:
            log.exception("command %s failed", type_)
            self.send_error(InternalError("internal error"), request_id)

    def _invalid(self, exc: InvalidRequest, request_id: str | None) -> None:
        self.invalid_streak += 1
        self.send_error(exc, request_id)
        if self.invalid_streak >= self.mind.config.invalid_frames_before_close:
            self.close(CloseCode.PROTOCOL_VIOLATION, "too many invalid frames")

    def _refuse_hello(self, exc: HalfpiError, code: int, reason: str) -> None:
        """A failed hello: the ``face.error`` that explains it, then the close."""
        self.send_error(exc, None)
        self.close(code, reason)

    async def _hello(self, hello: wire.Hello) -> None:
        if hello.protocol != PROTOCOL_VERSION:
            self._refuse_hello(
                InvalidRequest(
                    f"protocol {hello.protocol} is not supported; "
                    f"this Mind speaks {PROTOCOL_VERSION}",
                    field="protocol",
                ),
                CloseCode.UNAUTHORIZED,
                "unsupported protocol",
            )
            return
        self.hello_at = self.mind.now()
        try:
            credential = await self.mind.authenticate(hello.token, "face", self.transport.address)
        except RateLimited as exc:
            self._refuse_hello(exc, CloseCode.RATE_LIMITED, "too many failed handshakes")
            return
        if self.closed:
            return
        if credential is None:
            self._refuse_hello(
                Unauthorized("unknown or revoked token"), CloseCode.UNAUTHORIZED, "unauthorized"
            )
            return
        if not self.mind.bind(credential.principal_id):
            limit = self.mind.config.max_connections_per_principal
            self._refuse_hello(
                RateLimited(f"this credential already has {limit} live connections"),
                CloseCode.RATE_LIMITED,
                "too many connections",
            )
            return
        self.bound = True
        self.principal_id = credential.principal_id
        self.label = credential.label
        self.profile = credential.profile
        self.scopes = credential.scopes
        self.state = CONNECTION.check(self.state, "open")
        welcome = api.welcome(self.mind, credential)
        self.send(to_message(welcome))

    # -- liveness and closing ------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Called by the Mind's maintenance loop when this session's deadline
        came; time is passed in. Returns the next deadline (None once closed):
        traffic only moves deadlines later, so one computed now is never late,
        and every open session has one within a heartbeat, so a pause that
        starts after it was computed is still seen in time.

        Liveness (docs/protocol.md §11): a connection idle for a heartbeat
        gets a WebSocket ping, which every client library answers by itself;
        any frame or pong is life; ``dead_after_s`` without any closes it
        (1001). Writes blocked that long make it a slow consumer (4008),
        whatever it sends: a peer that does not read is not alive for us.
        """
        if self.closed:
            return None
        config = self.mind.config
        if self.paused and now - self.paused_at >= config.dead_after_s:
            if self.state == "awaiting_hello":
                self.close(CloseCode.SLOW_CONSUMER, "slow consumer: it does not read")
            else:
                self.evict()
            return None
        if self.state == "awaiting_hello":
            hello_by = self.connected_at + config.hello_timeout_s
            if self.hello_at is not None:
                # The hello is being checked (a throttled one waits its turn).
                return self._blocked_deadline(now + config.heartbeat_s)
            if now >= hello_by:
                self.close(CloseCode.HELLO_TIMEOUT, "no hello in time")
                return None
            return self._blocked_deadline(hello_by)
        dead_at = self.last_inbound + config.dead_after_s
        if now >= dead_at:
            self.close(CloseCode.GOING_AWAY, "no traffic: connection presumed dead")
            return None
        ping_at = max(self.last_inbound, self.last_wire_ping) + config.heartbeat_s
        if now >= ping_at:
            self.last_wire_ping = now
            self.transport.ping()
            ping_at = now + config.heartbeat_s
        if now >= self.last_ping + config.heartbeat_s:
            self.last_ping = now
            self.send(to_message(Ping(ts=self.mind.wall())))  # shown: wall time
        return self._blocked_deadline(min(dead_at, ping_at, self.last_ping + config.heartbeat_s))

    def _blocked_deadline(self, deadline: float) -> float:
        """``deadline``, or earlier if blocked writes would close this first."""
        if self.paused:
            return min(deadline, self.paused_at + self.mind.config.dead_after_s)
        return deadline

    def close(self, code: int, reason: str) -> None:
        """Close after writing what is already queued, so the ``face.error``
        that explains a close arrives before it. (An eviction empties the
        queue first: a slow consumer gets only ``face.evicted``.)"""
        if self.closed:
            return
        if len(self.queue):
            self.transport.write_frames(self.queue.take(self.mind.config.queue.reliable_bytes))
        self.closed = True
        self.state = CONNECTION.check(self.state, "closing")
        self.transport.close(code, reason)
        self._cleanup()

    def on_closed(self) -> None:
        """The transport is gone (either side closed, or the network died)."""
        if not self.closed:
            self.closed = True
            self._cleanup()
        if self.state != "closed":
            self.state = CONNECTION.check(self.state, "closed")

    def _cleanup(self) -> None:
        api.disconnected(self.mind, self)
        self.mind.remove_session(self)
        if self.bound and self.principal_id is not None:
            self.bound = False
            self.mind.unbind(self.principal_id)
        # The command in progress (if any) runs to its end: a chat admitted on
        # a connection that closes meanwhile must still start (I1). Replies
        # to a closed session are dropped; a replay re-attaches.
        self._inbox.clear()
