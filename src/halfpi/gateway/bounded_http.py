"""uvicorn's h11 protocol, bounded (docs/operations.md, "Limits"): the HTTP
side of ``guard.py`` for both servers (the native server hands its HTTP
connections over to it, uvicorn under ``--server asgi`` makes one per
connection).

- A request head must arrive whole within ``hello_timeout_s``: from the
  accept for the first request, from its first byte for the next ones on a
  kept-alive connection; else ``408`` and the connection is closed (uvicorn
  bounds only the wait *between* requests, and any byte resets it: a peer
  sending one header line a second was held for ever).
- A request line over :data:`~halfpi.gateway.guard.MAX_REQUEST_LINE` is
  answered ``414`` and the connection closed.
- A response sent before its request's body ended closes the connection:
  a body nobody reads is not waited for.
- Its ASGI scopes carry the connection's ticket in ``scope["state"]``, so
  a request that authenticates settles it (``guard.settle``).
- uvicorn warns once per malformed request; anyone can send them, so only
  the 1st, 2nd, 4th, 8th… reach the log, with the running count.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, cast

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from halfpi.core.throttle import worth_logging
from halfpi.gateway.guard import MAX_REQUEST_LINE, TICKET, TOO_LONG, TOO_SLOW, Ticket
from halfpi.gateway.http.sse_stream import BODY_WRITER

# What uvicorn's HTTP protocol says about a peer's bad request (one line each).
PEER_MISTAKES = frozenset({"Invalid HTTP request received.", "Unsupported upgrade request."})


class PeerMistakes(logging.Filter):
    """Lets the 1st, 2nd, 4th, 8th… of uvicorn's per-request warnings
    through, each with the running count."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in PEER_MISTAKES:
            return True
        self.count += 1
        if not worth_logging(self.count):
            return False
        record.msg = f"{record.msg} ({self.count} bad requests so far)"
        return True


_UVICORN = logging.getLogger("uvicorn.error")
if not any(isinstance(f, PeerMistakes) for f in _UVICORN.filters):
    _UVICORN.addFilter(PeerMistakes())


class Bounds(asyncio.Protocol):
    """The bounds both parsers get (module docstring). A subclass says when
    a request head is being read (``reading_head``), calls :meth:`head_read`
    once one is whole, says whether a response may still be written
    (``may_answer``) and whether its request's body is still arriving
    (``body_unread``), and frames a body chunk (``chunk``)."""

    # Set by the uvicorn protocol this is mixed into.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    flow: Any
    app: Any

    def bind_ticket(self, ticket: Ticket) -> None:
        self.ticket = ticket
        # Each request's scope names where a streamed body may be written
        # straight to the socket (``BodyWriter``).
        self.app = partial(_with_body_writer, self, self.app)
        self.head_timer: asyncio.TimerHandle | None = None
        self.line = 0  # bytes of the request line read so far (-1: it is whole)

    def reading_head(self) -> bool:
        raise NotImplementedError

    def may_answer(self) -> bool:
        raise NotImplementedError

    def body_unread(self) -> bool:
        raise NotImplementedError

    def chunk(self, data: bytes) -> bytes | None:
        """``data`` framed as a chunk of the body under way (None: it cannot
        be written around the ASGI send chain)."""
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.ticket.attach(cast("asyncio.Transport", transport))
        # The first head is due from the accept (native read its first line already).
        when = self.ticket.accepted_at + self.ticket.guard.head_timeout_s
        self.head_timer = self.loop.call_at(when, self.head_timeout)

    def data_received(self, data: bytes) -> None:
        if self.reading_head():
            if self.head_timer is None:  # the next request on a kept-alive connection
                self.head_timer = self.loop.call_later(
                    self.ticket.guard.head_timeout_s, self.head_timeout
                )
            if self.line >= 0 and self.line_too_long(data):
                return
        super().data_received(data)

    def head_read(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        self.line = 0

    def line_too_long(self, data: bytes) -> bool:
        """Answer 414 (and close) once the request line passes its bound."""
        end = data.find(b"\n")
        length = self.line + (len(data) if end < 0 else end)
        if length > MAX_REQUEST_LINE:
            self.refuse(TOO_LONG)
            return True
        self.line = length if end < 0 else -1
        return False

    def head_timeout(self) -> None:
        self.head_timer = None
        if self.reading_head() and not self.transport.is_closing():
            self.ticket.guard.head_timed_out(self.ticket.address)
            self.refuse(TOO_SLOW)

    def refuse(self, answer: bytes) -> None:
        if self.may_answer():  # no response of ours under way
            self.transport.write(answer)
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self.body_unread() and not self.transport.is_closing():
            self.transport.close()  # a body nobody will read is not waited for

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        self.ticket.settle()


class GuardedH11(Bounds, H11Protocol):
    """uvicorn's h11 protocol, bounded: HTTP/1.0, and every connection of
    ``--server asgi`` (whose parser is chosen before a byte is read)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        ticket: Ticket,
    ) -> None:
        H11Protocol.__init__(self, config, server_state, {**app_state, TICKET: ticket})
        self.bind_ticket(ticket)

    def reading_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def may_answer(self) -> bool:
        return self.conn.our_state is h11.IDLE

    def body_unread(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY

    def data_received(self, data: bytes) -> None:
        reading = self.reading_head()
        super().data_received(data)
        if reading and not self.reading_head():  # the head is whole
            self.head_read()

    def chunk(self, data: bytes) -> bytes | None:
        if self.conn.their_http_version == b"1.0":
            return data  # the body runs until the connection closes
        return b"%x\r\n%b\r\n" % (len(data), data)


class BodyWriter:
    """Writes a streamed response's body chunks straight to the socket, as
    the connection's parser frames them (chunked for HTTP/1.1, as they are
    for 1.0) — without the ASGI send chain (Starlette's wrappers, uvicorn's
    cycle, the parser's event machinery) that costs more than the write
    itself for a small SSE event. Only while the response is under way and
    the transport takes writes: otherwise :meth:`write` declines (False) and
    the response sends through ASGI as usual (which waits for a drain). The
    response's start and end always go through ASGI, so the parser keeps its
    state: it does not count the body's bytes in either framing."""

    __slots__ = ("cycle", "protocol")

    def __init__(self, protocol: Bounds) -> None:
        self.protocol = protocol
        self.cycle = protocol.cycle

    def write(self, data: bytes) -> bool:
        if not data:
            return True  # an empty chunk would end a chunked body
        protocol = self.protocol
        cycle = self.cycle
        if (
            cycle is not protocol.cycle
            or protocol.flow.write_paused
            or cycle.disconnected
            or not cycle.response_started
            or cycle.response_complete
            or cycle.scope["method"] == "HEAD"
            or protocol.transport.is_closing()
        ):
            return False
        framed = protocol.chunk(data)
        if framed is None:
            return False
        protocol.transport.write(framed)
        return True


async def _with_body_writer(
    protocol: Bounds, app: Any, scope: Any, receive: Any, send: Any
) -> None:
    if scope["type"] == "http":
        scope.setdefault("extensions", {})[BODY_WRITER] = BodyWriter(protocol)
    await app(scope, receive, send)
