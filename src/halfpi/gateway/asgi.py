"""The ASGI adapter: ``/v1/face`` and ``/v1/hand`` as a Starlette application.

It sits beside ``gateway/native.py`` with the same job and the same
sessions (``FaceSession``, ``HandSession``, driven through their
``Transport``); only the carrier differs. ``halfpi mind --server asgi``
serves it with uvicorn (``gateway/asgi_server.py``); ``halfpi.asgi.MindApp`` mounts
it in someone else's Starlette/FastAPI app (docs/asgi.md).

What ASGI changes, and how the adapter keeps the protocol's rules intact:

- **Writes are awaitable, sessions write synchronously.** Frames go into a
  per-connection buffer drained by one writer task, which exists only while
  there is something to write (an idle connection costs no extra task). It
  outlives an empty buffer by one turn of the loop, so that a stream (a
  frame, the agent yields, the next frame) is written by one task, not one
  task per frame.
  The pressure signal of I7: the session is paused when the buffer holds
  more than ``HIGH_WATER`` bytes, or as soon as a send does not complete at
  once (uvicorn's ``send`` waits only when its transport is over its own
  high-water mark: native's ``pause_writing``, one layer down); it resumes
  when sends complete again and the buffer is below ``LOW_WATER``. The
  queue policy (coalesce, drop, evict 4008) then works unchanged. An ASGI
  application cannot ask how much the server still holds, so pressure is
  felt at the send after the one that filled the server's buffer. A send
  that did not complete at once is seen by one callback per turn of the
  loop for every connection (:meth:`AsgiGateway.watch_sends`), not one per
  frame.
- **Control frames belong to the server.** An ASGI application can neither
  send a ping nor see a pong, so liveness is the server's: uvicorn pings
  every ``heartbeat_s`` and closes a peer silent for ``ws_ping_timeout``
  (1011), and the session's request for a ping is answered by the
  transport reporting the peer alive (:meth:`AsgiConnection.ping`).
- **The socket belongs to the server.** The adapter cannot abort a TCP
  connection: a peer that takes nothing is *released* (writer stopped,
  ASGI call ended, session closed) and the server closes the socket.

Only moves frames: everything the protocol means lives in the sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.types import Receive, Scope, Send

from halfpi.core.throttle import client_address
from halfpi.errors import CloseCode
from halfpi.gateway import http
from halfpi.gateway.guard import scope_ticket
from halfpi.gateway.hand_session import HandSession
from halfpi.gateway.http.door import Door
from halfpi.gateway.native import CLOSE_TIMEOUT_S, FACE_PATH, HAND_PATH, HIGH_WATER, LOW_WATER
from halfpi.gateway.session import FaceSession

if TYPE_CHECKING:
    from halfpi.gateway.session import Transport
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.asgi")

Session = FaceSession | HandSession
SessionFactory = Callable[["Mind", "Transport"], Session]


class AsgiConnection:
    """One WebSocket under ASGI: the sessions' ``Transport``.

    The ASGI call's own task reads (:meth:`run`); a writer task drains the
    outgoing buffer while it is not empty.
    """

    __slots__ = (
        "_buffer",
        "_buffered",
        "_closing",
        "_gone",
        "_loop",
        "_paused",
        "_receive",
        "_released",
        "_send",
        "_task",
        "_timer",
        "_writer",
        "address",
        "gateway",
        "scope",
        "session",
        "ticket",
    )

    def __init__(
        self, gateway: AsgiGateway, scope: Scope, receive: Receive, send: Send, address: str
    ) -> None:
        self.gateway = gateway
        self.scope = scope
        self.address = address  # the peer's IP address (or the proxy's client's)
        self.session: Session | None = None
        # Counted as unauthenticated until its hello is welcomed (gateway/guard.py).
        self.ticket = scope_ticket(scope)
        self._receive = receive
        self._send = send
        self._loop = asyncio.get_running_loop()
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._writer: asyncio.Task[None] | None = None
        self._closing: tuple[int, str] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._released = False
        self._gone = False

    # -- reading: the ASGI call ------------------------------------------------------

    async def run(self) -> None:
        """Feed the session until the peer or the server ends the connection."""
        session = self.session
        assert session is not None
        self._task = asyncio.current_task()
        receive = self._receive
        limit = self.gateway.hard_limit
        try:
            while True:
                message = await receive()
                kind = message["type"]
                if kind == "websocket.receive":
                    text = message.get("text")
                    data = text.encode() if text is not None else message.get("bytes") or b""
                    if len(data) > limit:
                        # The server's own limit is higher (a mounted app): same
                        # rule as native, enforced here.
                        self.close(CloseCode.MESSAGE_TOO_BIG, "message too big")
                    elif text is not None:
                        session.on_frame(data)
                    else:
                        session.on_binary()
                elif kind == "websocket.disconnect":
                    return
        except asyncio.CancelledError:
            task = self._task
            if not self._released or task is None:
                raise
            task.uncancel()  # our own release, not the server's cancellation
        finally:
            self._gone = True
            self._buffer.clear()
            if self._timer is not None:
                self._timer.cancel()
            if self._writer is not None:
                self._writer.cancel()
            self.gateway.connections.discard(self)
            session.on_closed()

    # -- the session's Transport ------------------------------------------------------

    def write_frames(self, frames: list[bytes]) -> None:
        if self._closing is not None or self._gone:
            return
        if self.ticket is not None and getattr(self.session, "bound", False):
            self.ticket.settle()  # the hello was accepted: the principal's connection now
            self.ticket = None
        self._buffer.extend(frames)
        self._buffered += sum(map(len, frames))
        if self._buffered > HIGH_WATER:
            self.held_back()
        if self._writer is None:
            self._writer = self._loop.create_task(self._write())

    def held_back(self) -> None:
        if not self._paused:
            self._paused = True
            assert self.session is not None
            self.session.pause_writing()

    def ping(self) -> None:
        """An ASGI application cannot ping: the server pings this peer itself
        (uvicorn: ``ws_ping_interval``) and closes it when it stops answering
        (``ws_ping_timeout``, close 1011). While the server keeps the
        connection, the peer is alive as far as this transport can know."""
        if self.session is not None and not self._gone:
            self.session.on_traffic()

    def close(self, code: int, reason: str) -> None:
        """Write what is buffered, then the close frame; give up on a peer
        that takes nothing within ``close_timeout_s``."""
        if self._closing is not None or self._gone:
            return
        self._closing = (code, reason)
        if self._writer is None:
            self._writer = self._loop.create_task(self._write())
        self._timer = self._loop.call_later(self.gateway.close_timeout_s, self.release)

    def release(self) -> None:
        """Stop writing and end the ASGI call: the adapter's part of an abort.
        The socket is the server's, which closes it once the call returns."""
        if self._gone:
            return
        self._released = True
        if self._writer is not None:
            self._writer.cancel()
        if self._task is not None:
            self._task.cancel()

    async def _write(self) -> None:
        send = self._send
        buffer = self._buffer
        gateway = self.gateway
        sending = gateway.sending
        lingered = False
        try:
            while True:
                if buffer:
                    lingered = False
                    frame = buffer.popleft()
                    size = len(frame)
                    # ASGI carries text as str: one more copy of every frame (and
                    # the server encodes it again); drop ours before the await.
                    message = {"type": "websocket.send", "text": frame.decode()}
                    del frame
                    # A send that does not complete at once is the server holding
                    # writes back (uvicorn: its transport is over its high-water
                    # mark): the pressure signal of I7, as native's pause_writing.
                    # While this connection is in ``sending`` across a turn of the
                    # loop, the gateway's watch pauses its session.
                    sending.add(self)
                    if not gateway.watching:
                        gateway.watch_sends()
                    await send(message)
                    sending.discard(self)
                    del message
                    self._buffered -= size
                    if self._paused and self._buffered <= LOW_WATER:
                        self._paused = False
                        assert self.session is not None
                        self.session.resume_writing()
                elif self._closing is not None or lingered:
                    break
                else:
                    # Wait one turn of the loop for the stream's next frame: a
                    # yield costs less than a new task for it.
                    lingered = True
                    await asyncio.sleep(0)
            if self._closing is not None and not self._gone:
                code, reason = self._closing
                await send({"type": "websocket.close", "code": code, "reason": reason})
        except Exception as exc:  # the server says the peer is gone (ClientDisconnected)
            log.debug("send to %s failed: %r", self.address, exc)
            self._loop.call_soon(self.release)
        finally:
            sending.discard(self)
            self._writer = None


class _Endpoint:
    """A raw ASGI endpoint for one path (Starlette routes to it as an app)."""

    def __init__(self, gateway: AsgiGateway, session: SessionFactory) -> None:
        self.gateway = gateway
        self.session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.gateway.serve(scope, receive, send, self.session)


class AsgiGateway:
    """The Starlette application for one Mind: ``/v1/face``, ``/v1/hand``,
    ``/healthz``. ``mind`` may be set after construction (a mounted app
    routes before its lifespan has started the Mind: it answers 503 until
    then)."""

    def __init__(
        self,
        mind: Mind | None = None,
        *,
        lifespan: Callable[[Any], contextlib.AbstractAsyncContextManager[None]] | None = None,
    ) -> None:
        self.mind = mind
        self.connections: set[AsgiConnection] = set()
        # Connections inside an ASGI send; ``watching``: a check of them is
        # scheduled for the loop's next turn (see watch_sends).
        self.sending: set[AsgiConnection] = set()
        self.watching = False
        self.accepting = True
        self.close_timeout_s = CLOSE_TIMEOUT_S
        self.app = Starlette(
            routes=[
                WebSocketRoute(FACE_PATH, _Endpoint(self, FaceSession)),
                WebSocketRoute(HAND_PATH, _Endpoint(self, HandSession)),
                *http.routes(Door(self.serving)),
            ],
            lifespan=lifespan,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def serving(self) -> Mind | None:
        """The Mind, while new requests are served (the HTTP door's view)."""
        return self.mind if self.accepting else None

    def watch_sends(self) -> None:
        """Check, at the loop's next turn, which connections are still inside
        a send: a send that completes at once leaves ``sending`` before its
        task yields, so one still there did not (the server holds writes
        back) and its session is paused. One callback per turn for every
        connection, instead of one per frame."""
        self.watching = True
        asyncio.get_running_loop().call_soon(self._held_back)

    def _held_back(self) -> None:
        self.watching = False
        for connection in list(self.sending):
            connection.held_back()

    @property
    def hard_limit(self) -> int:
        """The frame limit the WebSocket layer enforces (close 1009); frames
        between ``max_frame_bytes`` and this get a ``face.error`` instead."""
        return self.mind.config.max_frame_bytes * 4 if self.mind is not None else 0

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, factory: SessionFactory
    ) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        mind = self.mind
        if mind is None or mind.draining or not self.accepting:
            await _refuse(scope, send, 503, "the Mind is restarting\n")
            return
        headers = scope.get("headers") or []
        origin = _header(headers, b"origin")
        if origin is not None:  # no Origin: not a browser, not checked
            server = scope.get("server")
            port = server[1] if server and server[1] else None
            if origin not in mind.config.origins(port):
                # A close before accepting: servers answer it 403 (and, unlike
                # a denial response, uvicorn logs nothing for it: anyone's
                # page can cause these).
                await send({"type": "websocket.close", "code": 1008})
                return
        client = scope.get("client")
        peer = str(client[0]) if client else "unknown"
        forwarded = [
            value.decode("latin-1") for name, value in headers if name == b"x-forwarded-for"
        ]
        address = client_address(peer, forwarded, frozenset(mind.config.trusted_proxies))
        await send({"type": "websocket.accept"})
        connection = AsgiConnection(self, scope, receive, send, address)
        connection.session = factory(mind, connection)
        self.connections.add(connection)
        await connection.run()

    def stop_accepting(self) -> None:
        self.accepting = False

    async def wait_closed(self, timeout: float) -> None:
        """Wait (bounded) for connections to finish, then release the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.release()


def _header(headers: Any, name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _refuse(scope: Scope, send: Send, status: int, body: str) -> None:
    """Refuse before accepting: an HTTP response where the server supports
    the denial extension, else a plain close (which servers answer 403).
    (uvicorn logs an error after each denial response; they are rare: only
    while the Mind starts or drains.)"""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body.encode()})
    else:
        await send({"type": "websocket.close", "code": 1008})
