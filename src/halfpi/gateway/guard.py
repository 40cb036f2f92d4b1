"""What keeps the Mind's port open for its Faces and Hands, whoever else
reaches it (docs/operations.md, "Limits"). Both servers use it: the native
one (``native.py``, whose HTTP goes through ``handover.py``) and uvicorn
under ``--server asgi`` (``asgi_server.py``).

- **Descriptors.** :func:`raise_descriptor_limit` raises the soft
  ``RLIMIT_NOFILE`` to the hard limit at start: the default 1,024 is a
  few hundred sockets.
- **Pending connections.** Every accepted socket gets a :class:`Ticket`;
  until it authenticates it counts against the caps of ``core/pending.py``
  (per address and in total, half the descriptor limit), and one displaced
  by a newer connection is aborted. A trusted proxy's connections are
  counted in the total only (all its clients share its address).
- **Accepting.** :class:`Acceptor` is the accept loop. asyncio's own logs a
  traceback for every failed ``accept`` and, before Python 3.12, retries
  within the same turn of the loop: with its descriptors full the Mind
  wrote tens of thousands of tracebacks a second. Here a failed accept
  pauses accepting for :data:`ACCEPT_RETRY_S` and is told once per
  interval with a count (``core.pending.Tally``).
- **Request heads** are bounded in time (``hello_timeout_s``) and their
  request line in length (:data:`MAX_REQUEST_LINE`): by ``native.py``
  until it knows where a connection goes, then by ``bounded_http.py``
  (uvicorn's h11 protocol, bounded) for HTTP.

This module imports no HTTP server: a Mind whose Faces and Hands speak
WebSocket starts without uvicorn (docs/performance.md, "Start-up").

Only applies the rules: the rules themselves are ``core/pending.py``'s.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import ssl
from collections.abc import Callable, MutableMapping
from functools import partial
from typing import Any, cast

from halfpi.core.pending import PendingConnections, PendingLimits, Tally, limits_for
from halfpi.core.throttle import worth_logging

log = logging.getLogger("halfpi.gateway.guard")

# The longest request line read (RFC 9112 advises servers to accept at
# least 8000 octets); longer is answered 414.
MAX_REQUEST_LINE = 8192
# The largest request head read, as h11's own bound (uvicorn's default):
# a larger one is answered 431 (the h11 parser answers 400).
MAX_REQUEST_HEAD = 16 * 1024
ACCEPT_RETRY_S = 0.1  # after a failed accept (no descriptor left), accept again after this
ACCEPTS_PER_TURN = 64  # then the loop's other work has its turn
FAILURE_LOG_INTERVAL_S = 10.0
# Where a connection's ticket travels in an ASGI scope (``scope["state"]``).
TICKET = "halfpi.ticket"
TOO_LONG = b"HTTP/1.1 414 URI Too Long\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)
UNLIMITED_TARGET = 1_048_576  # the soft limit sought when the hard one is unlimited
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (an unlimited hard
    limit: to :data:`UNLIMITED_TARGET`); returns (before, now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # a sandbox may refuse: keep what there is
        return soft, soft
    return soft, target


def listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` names (as asyncio's
    ``create_server`` binds them), all on one port (the first one's, when
    ``port`` is 0). Raises ``OSError`` (an address in use, …)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, type_, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Ticket:
    """One accepted connection, pending until it authenticates or closes."""

    __slots__ = ("accepted_at", "address", "connecting", "displaced", "guard", "transport")

    def __init__(self, guard: Guard, address: str, accepted_at: float) -> None:
        self.guard = guard
        self.address = address
        self.accepted_at = accepted_at  # the loop's time
        self.transport: asyncio.Transport | None = None
        self.displaced = False
        # Making the connection (its TLS handshake): cancelled if displaced
        # before it has a transport, which closes the socket at once.
        self.connecting: asyncio.Task[None] | None = None

    def attach(self, transport: asyncio.BaseTransport) -> None:
        """The connection's transport exists (after a TLS handshake)."""
        self.transport = cast(asyncio.Transport, transport)
        if self.displaced:
            self.transport.abort()

    def displace(self) -> None:
        self.displaced = True
        if self.transport is not None:
            self.transport.abort()
        elif self.connecting is not None:
            self.connecting.cancel()

    def settle(self) -> None:
        """Authenticated, or closed: no longer pending."""
        self.guard.pending.settle(self)


def scope_ticket(scope: MutableMapping[str, Any]) -> Ticket | None:
    """The ticket of an ASGI scope's connection (``None`` from another server)."""
    state = scope.get("state")
    ticket = state.get(TICKET) if isinstance(state, dict) else None
    return ticket if isinstance(ticket, Ticket) else None


def settle(scope: MutableMapping[str, Any]) -> None:
    """A request of this ASGI scope authenticated: its connection is no
    longer pending."""
    ticket = scope_ticket(scope)
    if ticket is not None:
        ticket.settle()


class Guard:
    """The rules applied to one server's connections."""

    def __init__(self, head_timeout_s: float, trusted_proxies: frozenset[str],
                 failure_log_interval_s: float = FAILURE_LOG_INTERVAL_S) -> None:
        before, descriptors = raise_descriptor_limit()
        self.descriptors = descriptors
        self.limits: PendingLimits = limits_for(descriptors)
        self.pending: PendingConnections[Ticket] = PendingConnections(self.limits)
        self.head_timeout_s = head_timeout_s
        self.trusted_proxies = trusted_proxies
        self.failures = Tally(failure_log_interval_s)
        self.heads_timed_out = 0
        self.failure = ""  # what the last failed accept said
        log.info(
            "descriptors: %d%s; connections not yet authenticated: at most %d, %d per "
            "address; a request head or a hello within %g s",
            descriptors, f" (raised from {before})" if before != descriptors else "",
            self.limits.total, self.limits.per_address, head_timeout_s,
        )

    def admit(self, peer: str, now: float) -> Ticket:
        # A trusted proxy carries many clients: its connections share the total only.
        ticket = Ticket(self, peer, now)
        key = f"{peer}#{id(ticket)}" if peer in self.trusted_proxies else peer
        displaced = self.pending.admit(ticket, key)
        for old in displaced:
            old.displace()
        if displaced and worth_logging(self.pending.displaced):
            log.warning(
                "closed the oldest unauthenticated connection from %s to make room "
                "(%d so far; at most %d pending, %d per address)",
                displaced[-1].address, self.pending.displaced, self.limits.total,
                self.limits.per_address,
            )
        return ticket

    def accept_failed(self, exc: OSError, now: float) -> None:
        self.failure = exc.strerror or str(exc)
        self._tell_failures(self.failures.note(now))

    def flush_failures(self, now: float) -> None:
        """The end of an interval: failures held back since the last line."""
        self._tell_failures(self.failures.flush(now))

    def _tell_failures(self, count: int | None) -> None:
        if count is not None:
            log.warning(
                "accept failed %d time(s) since the last such line: %s (descriptor limit %d, "
                "%d connections pending); accepting again in %g s",
                count, self.failure, self.descriptors, self.pending.count, ACCEPT_RETRY_S,
            )

    def head_timed_out(self, address: str) -> None:
        self.heads_timed_out += 1
        if worth_logging(self.heads_timed_out):
            log.info(
                "closed a connection from %s that sent no whole request head within %g s "
                "(%d so far)", address, self.head_timeout_s, self.heads_timed_out,
            )


def _close_if_cancelled(conn: socket.socket, ticket: Ticket, task: asyncio.Task[None]) -> None:
    if task.cancelled():
        conn.close()
        ticket.settle()


class Acceptor:
    """Accepts on ``sock`` for ``factory`` (a protocol per connection, given
    its ticket), applying the guard; :meth:`close` stops."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[Ticket], asyncio.Protocol],
        guard: Guard,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.sock = sock
        self.factory = factory
        self.guard = guard
        self.ssl = ssl_context
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                conn, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                # No descriptor left (or another resource): told once per
                # interval, and accepting pauses, as the kernel keeps
                # reporting the socket readable.
                self._failed(exc)
                if exc.errno not in _OUT_OF_RESOURCES:
                    log.debug("accept failed", exc_info=True)
                self._pause()
                return
            conn.setblocking(False)
            peer = str(addr[0]) if isinstance(addr, tuple) and addr else "unknown"
            ticket = self.guard.admit(peer, self.loop.time())
            task = ticket.connecting = self.loop.create_task(self._connect(conn, ticket))
            self._tasks.add(task)
            # Cancelled before it began (displaced in this same turn): its
            # socket is closed here, as the coroutine never ran.
            task.add_done_callback(partial(_close_if_cancelled, conn, ticket))
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket, ticket: Ticket) -> None:
        try:
            await self.loop.connect_accepted_socket(
                lambda: self.factory(ticket), conn, ssl=self.ssl,
                # A TLS handshake that never ends is dropped like a missing hello.
                ssl_handshake_timeout=self.guard.head_timeout_s if self.ssl else None,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("connection from %s ended before it was made: %r", ticket.address, exc)
            conn.close()
            ticket.settle()
        except asyncio.CancelledError:  # displaced mid-handshake, or the server stops
            conn.close()
            ticket.settle()
        finally:
            ticket.connecting = None

    def _failed(self, exc: OSError) -> None:
        """Told now, or counted and told when the interval ends (a burst
        that stops is told in full, not forgotten)."""
        guard = self.guard
        guard.accept_failed(exc, self.loop.time())
        due = guard.failures.due()
        if due is not None and self._flush is None:
            self._flush = self.loop.call_at(due, self._flush_failures)

    def _flush_failures(self) -> None:
        self._flush = None
        self.guard.flush_failures(self.loop.time())

    def _pause(self) -> None:
        if self.closed:
            return
        self.loop.remove_reader(self.sock.fileno())
        self._retry = self.loop.call_later(ACCEPT_RETRY_S, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for timer in (self._retry, self._flush):
            if timer is not None:
                timer.cancel()
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
