"""uvicorn's protocol on httptools (llhttp, C), bounded as ``bounded_http``
bounds h11's: the native server's HTTP/1.1 connections where httptools is
installed (``bounded_http.protocol_for``). Its own module: httptools is
imported only where it is used."""

from __future__ import annotations

from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from halfpi.gateway.bounded_http import Bounds
from halfpi.gateway.guard import MAX_REQUEST_HEAD, TICKET, TOO_LARGE, Ticket


class GuardedHttpTools(Bounds, HttpToolsProtocol):
    """uvicorn's protocol on httptools (llhttp, C), bounded: the native
    server's HTTP/1.1 connections. Its request head is also bounded in
    size here (h11 bounds its own): over :data:`MAX_REQUEST_HEAD` it is
    answered 431. HTTP/1.0 stays on :class:`GuardedH11`, which frames a
    streamed body as 1.0 wants it (as-is, to the close)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        ticket: Ticket,
    ) -> None:
        HttpToolsProtocol.__init__(self, config, server_state, {**app_state, TICKET: ticket})
        self.bind_ticket(ticket)
        self.head = 0  # bytes of the head under way (-1: none is being read)
        self.heads = 0  # heads read whole
        self.body_pending = False

    def reading_head(self) -> bool:
        return self.head >= 0

    def may_answer(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def body_unread(self) -> bool:
        return self.body_pending

    def data_received(self, data: bytes) -> None:
        heads = self.heads
        super().data_received(data)
        if self.head < 0 or self.transport.is_closing():
            return
        if self.heads == heads:  # no head ended here: all of it was this head's
            self.head += len(data)
        if self.head > MAX_REQUEST_HEAD:
            self.refuse(TOO_LARGE)

    def on_headers_complete(self) -> None:
        self.head = -1
        self.heads += 1
        self.body_pending = True
        self.head_read()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.head = 0  # what comes next is the next request's head
        self.body_pending = False
        super().on_message_complete()

    def chunk(self, data: bytes) -> bytes | None:
        if self.cycle is None or self.cycle.chunked_encoding is not True:
            return None
        return b"%x\r\n%b\r\n" % (len(data), data)
