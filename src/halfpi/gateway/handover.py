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
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from halfpi.gateway.guard import MAX_REQUEST_LINE, Ticket

if TYPE_CHECKING:
    from halfpi.gateway.bounded_http import GuardedH11
    from halfpi.mind.service import Mind

__all__ = ["MAX_REQUEST_LINE", "HttpHandover"]


class HttpHandover:
    """The uvicorn side of the native server: its configuration, and the
    connections handed to it (for a bounded shutdown)."""

    def __init__(self, serving: Callable[[], Mind | None]) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from uvicorn.server import ServerState

        from halfpi.gateway import http
        from halfpi.gateway.bounded_http import GuardedH11
        from halfpi.gateway.http.door import Door

        app = Starlette(routes=http.routes(Door(serving)))
        self.config = uvicorn.Config(
            app,
            lifespan="off",  # the Mind is started by `halfpi mind`, not by the app
            ws="none",  # WebSockets are the native server's own
            proxy_headers=False,  # the Mind's --trusted-proxy rule applies instead
            server_header=False,
            http="h11",  # GuardedH11's base: the request head is bounded there
            log_config=None,
            log_level=logging.WARNING,
            access_log=False,  # a stream ticket travels in a query string: never log URLs
        )
        self.config.load()
        self.state = ServerState()
        self.protocol: type[GuardedH11] = GuardedH11

    def take(self, transport: asyncio.Transport, data: bytes, ticket: Ticket) -> None:
        """Serve ``transport`` from now on, starting with ``data`` (what the
        native connection already read); the request head stays bounded
        from the accept on (``guard.GuardedH11``)."""
        protocol = self.protocol(self.config, self.state, {}, ticket)
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
