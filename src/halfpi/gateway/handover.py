"""The native server's HTTP: every request on its port that is not a
WebSocket upgrade of ``/v1/face`` or ``/v1/hand`` is handed to uvicorn's
HTTP protocol running the HTTP door (``gateway/http``), so ``halfpi mind``
serves SSE, HTTP commands, reads and ``/healthz`` on the one port its
Faces already know.

The native connection reads the request line, and when it names anything
else it swaps the socket's protocol (``transport.set_protocol``) for a
fresh uvicorn protocol and feeds it the bytes read so far. From then on
that connection is uvicorn's: keep-alive, chunked bodies, flow control and
the ASGI cycle are a maintained HTTP server's, not ours. The WebSocket path
is untouched (one branch on the first line of a connection).

The native server makes its :class:`HttpHandover` on the first HTTP
request, and only then are uvicorn, Starlette and the door's routes
imported: a Mind whose Faces and Hands speak WebSocket starts without them
(docs/performance.md, "Start-up").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from halfpi.gateway.guard import MAX_REQUEST_LINE, Ticket

if TYPE_CHECKING:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from halfpi.gateway.bounded_http import Bounds
    from halfpi.mind.service import Mind

__all__ = ["MAX_REQUEST_LINE", "HttpHandover", "httptools_chosen", "protocol_for"]

HTTP_CHOICES = ("auto", "httptools", "h11")


@functools.cache
def httptools_chosen() -> bool:
    """httptools where it is installed — it comes with ``pip install halfpi``
    on the platforms that have its wheels — unless ``HALFPI_HTTP=h11`` asks
    for the pure-Python parser (which CI keeps testing). ``HALFPI_HTTP=
    httptools`` insists: a missing httptools is then an error."""
    choice = os.environ.get("HALFPI_HTTP", "auto") or "auto"
    if choice not in HTTP_CHOICES:
        raise ValueError(f"HALFPI_HTTP is one of {', '.join(HTTP_CHOICES)}, not {choice!r}")
    if choice == "h11":
        return False
    try:
        import httptools  # noqa: F401  (only whether it is there)
    except ImportError:
        if choice == "httptools":
            raise
        return False
    return True


def protocol_for(
    request_line: bytes,
) -> Callable[[Config, ServerState, dict[str, Any], Ticket], Bounds]:
    """The bounded protocol for a native connection whose first request
    line is ``request_line``: on httptools (llhttp, C: about a third of
    h11's CPU per request, docs/performance.md) for HTTP/1.1 where it is
    chosen, on h11 otherwise."""
    if request_line.rstrip().endswith(b"HTTP/1.1") and httptools_chosen():
        from halfpi.gateway.bounded_httptools import GuardedHttpTools

        return GuardedHttpTools
    from halfpi.gateway.bounded_http import GuardedH11

    return GuardedH11



class HttpHandover:
    """The uvicorn side of the native server: its configuration, and the
    connections handed to it (for a bounded shutdown)."""

    def __init__(self, serving: Callable[[], Mind | None]) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from uvicorn.server import ServerState

        from halfpi.gateway import http
        from halfpi.gateway.http.door import Door

        app = Starlette(routes=http.routes(Door(serving)))
        self.config = uvicorn.Config(
            app,
            lifespan="off",  # the Mind is started by `halfpi mind`, not by the app
            ws="none",  # WebSockets are the native server's own
            proxy_headers=False,  # the Mind's --trusted-proxy rule applies instead
            server_header=False,
            # The parser is ours to choose per connection (take): unused here.
            http="h11",
            log_config=None,
            log_level=logging.WARNING,
            access_log=False,  # a stream ticket travels in a query string: never log URLs
        )
        self.config.load()
        self.state = ServerState()

    def take(self, transport: asyncio.Transport, data: bytes, ticket: Ticket) -> None:
        """Serve ``transport`` from now on, starting with ``data`` (what the
        native connection already read: at least the request line, which
        picks the parser); the request head stays bounded from the accept on
        (``bounded_http``)."""
        kind = protocol_for(data.partition(b"\n")[0])
        protocol = kind(self.config, self.state, {}, ticket)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)

    @property
    def connections(self) -> int:
        return len(self.state.connections)

    def shutdown(self) -> None:
        """Close idle connections now, the others after their response
        (an event stream ends when the Mind drains)."""
        for connection in list(self.state.connections):
            connection.shutdown()

    def abort(self) -> None:
        for connection in list(self.state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
