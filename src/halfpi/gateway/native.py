"""The native WebSocket adapter: an ``asyncio.Protocol`` driving the Sans-I/O
``websockets`` server protocol.

Why not a framework server: an idle connection here is one Protocol object
and one parser generator — no reader task, no keepalive task — and the
transport's ``pause_writing``/``resume_writing`` are exactly the pressure
signal the outbound queue policy (I7) needs. Frames are written with
``writelines`` so a flush of many messages is one system call.

Control frames are bounded like data (I7): pongs are answered by this
adapter, not queued by the protocol — only the most recent ping's, and only
while the transport takes writes (RFC 6455 §5.5.3 allows answering just the
latest), so a peer that floods pings and never reads costs one pending pong,
and the session closes it as a slow consumer once its writes have stayed
blocked for ``dead_after_s``.

Only moves bytes: everything the protocol means lives in the session.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol
from websockets.typing import Origin

from halfpi.core.throttle import client_address
from halfpi.gateway.guard import TOO_LONG, Acceptor, Guard, Ticket, listen
from halfpi.gateway.hand_session import HandSession
from halfpi.gateway.handover import MAX_REQUEST_LINE, HttpHandover
from halfpi.gateway.session import FaceSession

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.native")
_ws_log = logging.getLogger("halfpi.gateway.ws")
_ws_log.setLevel(logging.WARNING)

FACE_PATH = "/v1/face"
HAND_PATH = "/v1/hand"
HIGH_WATER = 128 * 1024
LOW_WATER = 32 * 1024
CLOSE_TIMEOUT_S = 10.0
_FACE_PATH = FACE_PATH.encode()
_HAND_PATH = HAND_PATH.encode()
# FIN + text opcode, then a 7-bit length: the header of every small frame.
_HEADERS = [bytes((0x81, size)) for size in range(126)]
# A server's ping with no payload (FIN + ping opcode, length 0, unmasked):
# what ``ServerProtocol.send_ping(b"")`` serialises, written without making
# a Frame each heartbeat.
PING_FRAME = b"\x89\x00"
# A client's answer to it: FIN + pong, masked, length 0, then the 4-byte mask.
_PONG_HEAD = b"\x8a\x80"


def server_tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """``wss://``: the certificate chain (PEM) and its key; TLS 1.2 or later.
    Raises ``OSError``/``ssl.SSLError`` for a missing or unusable file."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class LatestPongProtocol(ServerProtocol):
    """websockets' server protocol, except that a ping is not answered by
    queueing a pong: the latest ping's payload waits in ``pending_pong``
    for the adapter to answer when the transport takes writes."""

    pending_pong: bytes | None = None

    def recv_frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.PING:
            self.pending_pong = bytes(frame.data)
            self.events.append(frame)
            return
        super().recv_frame(frame)

    def at_frame_start(self) -> bool:
        """The parser waits for the first byte of a frame (nothing of one was
        consumed): its innermost wait is the reader's ``at_eof``, which it
        enters only between frames (generators' ``gi_yieldfrom``)."""
        gen: Any = self.parser
        while gen is not None:
            if gen.gi_code.co_name == "at_eof":
                return True
            gen = gen.gi_yieldfrom
        return False

    def restart_parser(self) -> None:
        """Let go of what the parser's locals hold. websockets' server parser
        reads the handshake's request into a local and then delegates to the
        frame parser for the connection's life, which in turn keeps its last
        frame: an idle connection kept its request with all its headers
        (~2 KiB) and its hello (with the token) for good. Between frames the
        frame parser alone, started afresh, is in the same state without
        them; mid-frame nothing is done."""
        if self.state is State.OPEN and not self.reader.eof and self.at_frame_start():
            self.parser = Protocol.parse(self)
            next(self.parser)  # to its first wait, as the one it replaces was


class FaceServer:
    """Listens on host:port and serves ``/v1/face`` and ``/v1/hand``; any
    other HTTP request goes to the HTTP door (``gateway/handover.py``)."""

    def __init__(self, mind: Mind) -> None:
        self.mind = mind
        self.acceptors: list[Acceptor] = []
        self.connections: set[WebSocketConnection] = set()
        self.origins: list[Origin | None] = [None, *(Origin(o) for o in mind.config.origins())]
        self.trusted_proxies = frozenset(mind.config.trusted_proxies)
        self.ssl: ssl.SSLContext | None = None
        if mind.config.tls_cert is not None:
            assert mind.config.tls_key is not None, "a TLS certificate needs its key"
            self.ssl = server_tls_context(mind.config.tls_cert, mind.config.tls_key)
        # The hard limit the WebSocket layer enforces (close 1009). Frames
        # between max_frame_bytes and this get a face.error instead, so a
        # client learns why rather than just losing its connection.
        self.hard_limit = mind.config.max_frame_bytes * 4
        self.accepting = True
        self.guard: Guard | None = None
        self._http: HttpHandover | None = None

    @property
    def http(self) -> HttpHandover:
        """The HTTP door's server, made on the first HTTP request: a Mind
        serving only WebSockets never imports uvicorn and Starlette."""
        if self._http is None:
            self._http = HttpHandover(self.serving)
        return self._http

    def _http_connections(self) -> int:
        return 0 if self._http is None else self._http.connections

    def serving(self) -> Mind | None:
        """The Mind, while new requests are served (the HTTP door's view)."""
        return self.mind if self.accepting else None

    async def start(self) -> None:
        config = self.mind.config
        # Descriptors, caps on unauthenticated connections, a bounded accept
        # loop (gateway/guard.py): the port stays open for Faces and Hands.
        guard = self.guard = Guard(config.hello_timeout_s, self.trusted_proxies)
        self.acceptors = [
            Acceptor(sock, lambda ticket: WebSocketConnection(self, ticket), guard, self.ssl)
            for sock in listen(config.host, config.port, backlog=4096)
        ]
        # The Mind's own origin is on the port actually bound (``--port 0``).
        self.origins = [None, *(Origin(o) for o in self.mind.config.origins(self.port))]

    @property
    def port(self) -> int:
        assert self.acceptors
        return int(self.acceptors[0].sock.getsockname()[1])

    def stop_accepting(self) -> None:
        self.accepting = False
        for acceptor in self.acceptors:
            acceptor.close()

    async def wait_closed(self, timeout: float) -> None:
        """Wait (bounded) for connections to finish their close handshakes
        and HTTP responses."""
        if self._http is not None:
            self._http.shutdown()
        deadline = asyncio.get_running_loop().time() + timeout
        while (self.connections or self._http_connections()) and (
            asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.abort()
        if self._http is not None:
            self._http.abort()


class WebSocketConnection(asyncio.Protocol):
    __slots__ = (
        "_fragments",
        "_head",
        "_paused",
        "_timer",
        "address",
        "server",
        "session",
        "ticket",
        "transport",
        "ws",
    )

    def __init__(self, server: FaceServer, ticket: Ticket) -> None:
        self.server = server
        self.ticket: Ticket | None = ticket  # None once authenticated
        self.ws = LatestPongProtocol(
            origins=server.origins, max_size=server.hard_limit, logger=_ws_log
        )
        self.transport: asyncio.Transport | None = None
        self.session: FaceSession | HandSession | None = None
        self.address = ""  # the peer's IP address (or the proxy's client's)
        self._fragments: list[bytes] | None = None
        # What was read before the request line was whole (then None).
        self._head: bytes | None = b""
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's (not a subclass of asyncio.Transport): duck-typed
        transport = cast("asyncio.Transport", transport)
        self.transport = transport
        if self.ticket is not None:
            self.ticket.attach(transport)
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        self.server.connections.add(self)
        # Until the upgrade completes no session watches this socket: a
        # connection that never finishes its handshake is aborted in time.
        self._timer = asyncio.get_running_loop().call_later(
            self.server.mind.config.hello_timeout_s, self.abort
        )

    def data_received(self, data: bytes) -> None:
        session = self.session
        if (
            len(data) == 6
            and data.startswith(_PONG_HEAD)
            and session is not None
            and self.ws.state is State.OPEN
            and self.ws.at_frame_start()
        ):
            # The answer to a heartbeat, whole and alone: what the parser
            # would do with it is nothing (RFC 6455 §5.5.3) but note the
            # traffic, so it is not parsed — an idle connection's one
            # inbound frame per heartbeat costs a check, not a Frame.
            session.on_traffic()
            return
        if self._head is not None:
            data = self._head + data
            if not self._upgrade(data):
                return
            self._head = None
        ws = self.ws
        ws.receive_data(data)
        opened = False
        for event in ws.events_received():
            if isinstance(event, Request):
                self._handshake(event)
                opened = True
                continue
            session = self.session
            if session is None or not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                if event.fin:
                    if opcode is Opcode.TEXT:
                        session.on_frame(bytes(event.data))
                    else:
                        session.on_binary()
                else:
                    self._fragments = [bytes(event.data)] if opcode is Opcode.TEXT else None
            elif opcode is Opcode.CONT:
                if self._fragments is not None:
                    self._fragments.append(bytes(event.data))
                if event.fin:
                    if self._fragments is None:
                        session.on_binary()
                    else:
                        session.on_frame(b"".join(self._fragments))
                    self._fragments = None
            else:  # ping, pong, close: the protocol answers; we note the traffic
                session.on_traffic()
        if opened:
            ws.restart_parser()  # the request goes
        self._answer_ping()
        self._write_pending()

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self._write_pending()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.ticket is not None:
            self.ticket.settle()
        if self._timer is not None:
            self._timer.cancel()
        self.ws.receive_eof()
        if self.session is not None:
            self.session.on_closed()

    def pause_writing(self) -> None:
        self._paused = True
        if self.session is not None:
            self.session.pause_writing()

    def resume_writing(self) -> None:
        self._paused = False
        self._answer_ping()
        self._write_pending()
        if self.session is not None:
            self.session.resume_writing()

    def _answer_ping(self) -> None:
        """Pong the most recent ping, if the transport takes writes (I7)."""
        ws = self.ws
        if ws.pending_pong is None or self._paused:
            return
        data, ws.pending_pong = ws.pending_pong, None
        if ws.state is State.OPEN:
            ws.send_pong(data)

    # -- handshake ----------------------------------------------------------------

    def _upgrade(self, head: bytes) -> bool:
        """True when the connection stays here (a WebSocket for ``/v1/face``
        or ``/v1/hand``); False while the request line is incomplete, or
        once the connection was handed to the HTTP door."""
        end = head.find(b"\n")
        if end < 0 and len(head) < MAX_REQUEST_LINE:
            self._head = head
            return False
        if end < 0 or end > MAX_REQUEST_LINE:  # docs/protocol.md §1: 414
            self._head = None
            assert self.transport is not None
            self.transport.write(TOO_LONG)
            self.transport.close()
            return False
        method, _, rest = head[:end].partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0]
        if method == b"GET" and path in (_FACE_PATH, _HAND_PATH):
            return True
        self._head = None
        self.server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        assert self.transport is not None and self.ticket is not None
        self.server.http.take(self.transport, head, self.ticket)
        self.ticket = None  # the HTTP protocol's from now on
        return False

    def _handshake(self, request: Request) -> None:
        ws = self.ws
        path = request.path.partition("?")[0]
        if path == "/healthz":
            ws.send_response(ws.reject(200, "ok\n"))
            return
        if path not in (FACE_PATH, HAND_PATH):
            ws.send_response(ws.reject(404, "not found\n"))
            return
        if self.server.mind.draining:
            ws.send_response(ws.reject(503, "the Mind is restarting\n"))
            return
        forwarded = request.headers.get_all("X-Forwarded-For")
        self.address = client_address(self.address, forwarded, self.server.trusted_proxies)
        response = ws.accept(request)  # checks Upgrade headers and the Origin allowlist
        ws.send_response(response)
        if response.status_code == 101:
            if self._timer is not None:
                self._timer.cancel()  # the session's own hello timeout takes over
                self._timer = None
            if path == FACE_PATH:
                self.session = FaceSession(self.server.mind, self)
            else:
                self.session = HandSession(self.server.mind, self)

    # -- the session's Transport ----------------------------------------------------

    def write_frames(self, frames: list[bytes]) -> None:
        """Frame and write text messages. A server's frames are unmasked and,
        without extensions, are a 2-10 byte header and the payload: written
        here directly (several times cheaper than building Frame objects);
        the websockets protocol object still owns the handshake, control
        frames and the close handshake, and is consulted for its state."""
        transport = self.transport
        if self.ws.state is not State.OPEN or transport is None:
            return
        if self.ticket is not None and getattr(self.session, "bound", False):
            # The first frames after the hello was accepted: the connection
            # is the principal's now, no longer counted as unauthenticated.
            self.ticket.settle()
            self.ticket = None
            self.ws.restart_parser()  # the hello (and its token) goes
        self._write_pending()  # anything the protocol queued (a pong) goes first
        out: list[bytes] = []
        for frame in frames:
            size = len(frame)
            if size < 126:
                out.append(_HEADERS[size])
            elif size < 65536:
                out.append(b"\x81\x7e" + size.to_bytes(2, "big"))
            else:
                out.append(b"\x81\x7f" + size.to_bytes(8, "big"))
            out.append(frame)
        transport.writelines(out)

    def ping(self) -> None:
        """A WebSocket ping: any client library answers it by itself."""
        transport = self.transport
        if self.ws.state is State.OPEN and transport is not None:
            self._write_pending()  # anything the protocol queued (a pong) goes first
            transport.write(PING_FRAME)

    def beat(self, frame: bytes) -> None:
        """A heartbeat: the text ``frame`` (a ``face.ping``) and a ping, one
        write (one system call) for both."""
        transport = self.transport
        if self.ws.state is not State.OPEN or transport is None or self.ticket is not None:
            self.write_frames([frame])
            self.ping()
            return
        self._write_pending()
        size = len(frame)
        if size < 126:
            transport.write(b"%b%b%b" % (_HEADERS[size], frame, PING_FRAME))
        else:
            self.write_frames([frame])
            transport.write(PING_FRAME)

    def close(self, code: int, reason: str) -> None:
        ws = self.ws
        if ws.state is State.OPEN:
            ws.send_close(code, reason)
        self._write_pending()
        if self.transport is not None and self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(CLOSE_TIMEOUT_S, self.abort)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _write_pending(self) -> None:
        transport = self.transport
        if transport is None:
            return
        chunks = self.ws.data_to_send()
        if not chunks:
            return
        if chunks[-1] == b"":  # SEND_EOF: the protocol is done with TCP
            chunks.pop()
            if chunks:
                transport.writelines(chunks)
            transport.close()  # flushes what is buffered, then closes
            return
        transport.writelines(chunks)
