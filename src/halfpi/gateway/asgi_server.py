"""``halfpi mind --server asgi``: the ASGI adapter (``gateway/asgi.py``) served
by uvicorn, with the interface of ``native.FaceServer`` (``start``, ``port``,
``stop_accepting``, ``wait_closed``) so that ``halfpi/process.py`` wires, drains
and tests either the same way. The Mind's numbers become uvicorn's settings
(:meth:`AsgiServer.uvicorn_config`, docs/asgi.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from halfpi.gateway.asgi import AsgiGateway
from halfpi.gateway.bounded_http import GuardedH11
from halfpi.gateway.guard import TICKET, Acceptor, Guard, Ticket, listen
from halfpi.gateway.native import LatestPongProtocol, server_tls_context

if TYPE_CHECKING:
    from halfpi.mind.service import Mind


class BoundedPongs(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol with control frames bounded as in
    ``native.py`` (I7): uvicorn writes a pong for every ping even while its
    transport is full, so a peer that floods pings and never reads would
    make it hold every pong. Here only the latest ping is answered, and only
    while the transport takes writes (RFC 6455 §5.5.3 allows it).

    It relies on uvicorn's ``conn``, ``writable``, ``transport`` and
    ``handle_ping`` (uvicorn ≥ 0.52.1; tests/gateway/test_asgi_server.py
    checks the behaviour)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Same settings as uvicorn's own (no compression: see uvicorn_config).
        self.conn = self.pongs = LatestPongProtocol(
            max_size=self.config.ws_max_size, logger=logging.getLogger("uvicorn.error")
        )

    def handle_ping(self) -> None:
        self.answer_ping()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        ticket = self.app_state.get(TICKET)
        if isinstance(ticket, Ticket):  # upgraded before its hello was welcomed
            ticket.settle()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.answer_ping()

    def answer_ping(self) -> None:
        pongs = self.pongs
        if pongs.pending_pong is None or not self.writable.is_set():
            return
        data, pongs.pending_pong = pongs.pending_pong, None
        if pongs.state is State.OPEN and not self.transport.is_closing():
            pongs.send_pong(data)
            self.transport.write(b"".join(pongs.data_to_send()))


class _Server(uvicorn.Server):
    """uvicorn's server, except for signals and accepting. The Mind's
    process owns the signals (halfpi/process.py drains on SIGINT/SIGTERM);
    uvicorn must not take them over. Accepting is the guard's
    (gateway/guard.py: descriptors, caps on unauthenticated connections,
    failed accepts told once per interval), and each connection is uvicorn's
    h11 protocol with its request head bounded (gateway/bounded_http.py)."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], guard: Guard,
                 tls: ssl.SSLContext | None) -> None:
        super().__init__(config)
        self.sockets = sockets
        self.guard = guard
        self.tls = tls
        self.acceptors: list[Acceptor] = []

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        config, state = self.config, self.lifespan.state

        def protocol(ticket: Ticket) -> GuardedH11:
            return GuardedH11(config, self.server_state, state, ticket)

        self.servers = []
        self.acceptors = [Acceptor(sock, protocol, self.guard, self.tls) for sock in self.sockets]
        self.started = True

    def stop_accepting(self) -> None:
        for acceptor in self.acceptors:
            acceptor.close()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.stop_accepting()  # however uvicorn was stopped, the sockets close
        await super().shutdown(sockets)


class AsgiServer:
    """The ASGI adapter served by uvicorn on the Mind's host and port."""

    def __init__(self, mind: Mind) -> None:
        self.mind = mind
        self.gateway = AsgiGateway(mind)
        self.connections = self.gateway.connections
        self._sockets: list[socket.socket] = []
        self.server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    def uvicorn_config(self) -> uvicorn.Config:
        """The Mind's numbers in uvicorn's terms."""
        config = self.mind.config
        return uvicorn.Config(
            self.gateway,
            interface="asgi3",
            lifespan="off",  # the Mind is started and drained by halfpi/process.py
            http="h11",  # the base of GuardedH11, which _Server makes per connection
            ws=BoundedPongs,
            # The same hard limit as native: over it, close 1009.
            ws_max_size=self.gateway.hard_limit,
            # Liveness is the server's under ASGI (docs/asgi.md): a ping
            # every heartbeat, and a peer silent for the rest of dead_after
            # is closed (1011).
            ws_ping_interval=config.heartbeat_s,
            ws_ping_timeout=max(config.dead_after_s - config.heartbeat_s, config.heartbeat_s),
            ws_per_message_deflate=False,  # as native: no compression, no zlib state per connection
            # The Mind's own --trusted-proxy rule names clients, not uvicorn's.
            proxy_headers=False,
            server_header=False,
            # TLS: the guard's acceptor wraps connections (AsgiServer.start).
            backlog=4096,
            timeout_graceful_shutdown=1,
            log_config=None,
            log_level=logging.WARNING,  # no line per connection, as native
            access_log=False,
        )

    async def start(self) -> None:
        config = self.mind.config
        # Bound here, as native binds: an address in use raises OSError now.
        self._sockets = listen(config.host, config.port, backlog=4096)
        guard = Guard(config.hello_timeout_s, frozenset(config.trusted_proxies))
        tls = None
        if config.tls_cert is not None:
            assert config.tls_key is not None, "a TLS certificate needs its key"
            tls = server_tls_context(config.tls_cert, config.tls_key)
        self.server = _Server(self.uvicorn_config(), self._sockets, guard, tls)
        self._task = asyncio.create_task(self.server.serve(), name="uvicorn")
        while not self.server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        assert self._sockets
        return int(self._sockets[0].getsockname()[1])

    def stop_accepting(self) -> None:
        self.gateway.stop_accepting()
        if self.server is not None:
            self.server.stop_accepting()

    async def wait_closed(self, timeout: float) -> None:
        """Bounded, as native: sessions end and connections finish their
        close handshakes within ``timeout``; then what is left is aborted
        and uvicorn stops."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self.gateway.wait_closed(timeout)
        server, task = self.server, self._task
        if server is None or task is None:
            return
        # uvicorn stops listening, closes idle HTTP connections, and sends
        # 1012 to any WebSocket still open; it then waits for them.
        server.should_exit = True
        connections = server.server_state.connections
        while connections and not task.done() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for protocol in list(connections):  # peers that took nothing in time
            protocol.transport.abort()
        with contextlib.suppress(asyncio.CancelledError):
            await task
