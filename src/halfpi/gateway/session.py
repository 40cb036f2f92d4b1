"""The WebSocket door of one Face (DESIGN §4, I8): the hello, the order of
its commands, and its frames.

The connection's life — its bounded queue and flush (I7), liveness,
revocation, the cap, closing once — is the Mind's
:class:`~halfpi.mind.connection.Connection`; this door gives it a
:class:`WebSocketFraming` and keeps only what is a WebSocket's: the hello
and its authentication, the per-command re-authorisation and scope check
(I8), and the inbox that keeps commands in arrival order. What a command
means is the Mind's: the session decodes a frame, checks who may send it
and calls the Mind API (``mind/api.py``) with its connection as the
caller. It never touches the store, the journal or an actor
(``tests/gateway/test_thin.py``).

A transport adapter feeds it text frames and writability changes and gives
it a :class:`Transport` to write to; the session never touches a socket.
Commands of one connection are handled in arrival order by a worker task
that exists only while there is work (an idle connection costs no task).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from halfpi.config import PROTOCOL_VERSION
from halfpi.core import wire
from halfpi.core.events import to_message
from halfpi.core.outbound import Message, OutboundQueue
from halfpi.errors import (
    CloseCode,
    HalfpiError,
    InternalError,
    InvalidRequest,
    RateLimited,
    Unauthorized,
)
from halfpi.mind import api
from halfpi.mind.connection import FLUSH_BUDGET

if TYPE_CHECKING:
    from halfpi.mind.service import Mind
    from halfpi.mind.subscriptions import Subscriptions

log = logging.getLogger("halfpi.gateway")

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


class WebSocketFraming:
    """Frames on a WebSocket (the native server's or an ASGI server's):
    each frame one text message, all of one flush in one write."""

    __slots__ = ("kind", "transport")
    budget = FLUSH_BUDGET

    def __init__(self, transport: Transport, kind: str) -> None:
        self.transport = transport
        self.kind = kind

    def write(self, frames: list[bytes]) -> None:
        self.transport.write_frames(frames)

    def ping(self) -> None:
        self.transport.ping()

    def beat(self, frame: bytes) -> None:
        """A heartbeat (``mind/connection.py``, ``Beats``): the ``face.ping``
        ``frame`` and the ping in one write where the transport can
        (the native server's ``beat``), else one after the other."""
        beat = getattr(self.transport, "beat", None)
        if beat is not None:
            beat(frame)
            return
        self.transport.write_frames([frame])
        self.transport.ping()

    def close(self, code: int, reason: str) -> None:
        self.transport.close(code, reason)


class FaceSession:
    """The WebSocket door of one Face: the hello, the inbox's order and the
    transport's frames; the connection's life is its :attr:`conn`'s (it is
    that connection's :class:`~halfpi.mind.connection.Framing`).

    Slotted, and its inbox made on the first command: an idle Face is
    thousands of these (an empty deque alone is ~760 bytes)."""

    __slots__ = ("_inbox", "_worker", "conn", "invalid_streak", "loop", "mind", "transport")

    def __init__(self, mind: Mind, transport: Transport) -> None:
        self.mind = mind
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self._inbox: deque[bytes] | None = None  # made by the first frame
        self._worker: asyncio.Task[None] | None = None
        self.invalid_streak = 0
        framing = WebSocketFraming(transport, "websocket")
        self.conn = mind.connect(None, framing, mind.liveness("face"))

    # -- the connection, as tests and the transports see it --------------------------

    @property
    def state(self) -> str:
        return self.conn.state

    @property
    def closed(self) -> bool:
        return self.conn.closed

    @property
    def paused(self) -> bool:
        return self.conn.paused

    @property
    def principal_id(self) -> str | None:
        return self.conn.principal_id

    @property
    def queue(self) -> OutboundQueue:
        return self.conn.queue

    @property
    def subscriptions(self) -> Subscriptions:
        return self.conn.subscriptions

    @property
    def bound(self) -> bool:
        return self.conn.bound

    def send(self, m: Message) -> None:
        self.conn.send(m)

    def send_error(self, exc: HalfpiError, request_id: str | None) -> None:
        self.conn.send_error(exc, request_id)

    def evict(self) -> None:
        self.conn.evict()

    def tick(self, now: float) -> float | None:
        return self.conn.tick(now)

    def pause_writing(self) -> None:
        self.conn.pause(self.mind.now())

    def resume_writing(self) -> None:
        self.conn.resume()

    # -- inbound -------------------------------------------------------------------

    def on_frame(self, data: bytes) -> None:
        conn = self.conn
        if conn.closed:
            return
        conn.heard(self.mind.now())
        limit = MAX_INBOX if conn.state == "open" else MAX_INBOX_BEFORE_HELLO
        inbox = self._inbox
        if inbox is None:
            inbox = self._inbox = deque()
        if len(inbox) >= limit:
            self.send_error(RateLimited("too many commands in flight"), wire.request_id_of(data))
            return
        if len(data) > self.mind.config.max_frame_bytes:
            # Refused in order, but not kept: an oversized frame costs no memory.
            data = OVERSIZED + str(len(data)).encode()
        inbox.append(data)
        if self._worker is None:
            self._worker = self.loop.create_task(self._work())

    def on_binary(self) -> None:
        self.on_frame(b"\x00binary")  # not JSON: refused as invalid_request like any garbage

    def on_traffic(self) -> None:
        """Any inbound traffic (pings and pongs included) proves the Face is alive."""
        self.conn.heard(self.mind.now())

    @property
    def busy(self) -> bool:
        """Frames are waiting or being handled."""
        return self._worker is not None or bool(self._inbox)

    async def _work(self) -> None:
        inbox = self._inbox
        try:
            while inbox and not self.closed:
                await self._handle(inbox.popleft())
                # Let the replies flush between commands: a pipelining Face
                # that reads promptly must never look like a slow one.
                await asyncio.sleep(0)
        finally:
            self._worker = None
            if not inbox and self._inbox is inbox:
                self._inbox = None  # idle again: the deque goes

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
            await api.handle(self.mind, self.conn, type_, payload)
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
        self.conn.checking(self.mind.now())
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
        if not self.conn.welcome(credential):
            limit = self.mind.config.max_connections_per_principal
            self._refuse_hello(
                RateLimited(f"this credential already has {limit} live connections"),
                CloseCode.RATE_LIMITED,
                "too many connections",
            )
            return
        welcome = api.welcome(self.mind, credential)
        self.send(to_message(welcome))

    # -- closing ---------------------------------------------------------------------

    def close(self, code: int, reason: str) -> None:
        """As the connection closes (what is queued first); the inbox goes."""
        self.conn.close(code, reason)

    def on_closed(self) -> None:
        """The transport is gone (either side closed, or the network died)."""
        self.conn.gone()
        # The command in progress (if any) runs to its end: a chat admitted on
        # a connection that closes meanwhile must still start (I1). Replies
        # to a closed connection are dropped; a replay re-attaches.
        if self._inbox is not None:
            self._inbox.clear()
            self._inbox = None
