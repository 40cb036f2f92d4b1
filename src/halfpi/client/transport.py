"""The transport seam every client shares: what a connection must do, and the WebSocket one.

A Face (the SDK) and a Hand both dial the Mind through a :data:`Connector`,
``async (url) -> Transport``. Tests inject their own (a scripted Mind, or
:class:`halfpi.client.memory.MemoryTransport`); the default speaks
WebSocket through ``websockets``, whose exceptions are mapped here, at the
boundary, to :class:`ConnectionLost` (with the close code, when there was one).

``wss://`` is verified like any TLS client does: against the system's CAs,
or the CA file named by ``HALFPI_CA_FILE``, or whatever :func:`tls_connector`
was given (an ``ssl.SSLContext`` or a CA path: a self-signed set-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from halfpi.client.errors import AUTH_CLOSE_CODES, CLOSE_MEANINGS, ConnectionLost

# The WebSocket library logs frames at DEBUG; the first frame carries the
# token, so its logger never goes below WARNING whatever the root level is.
_wire_log = logging.getLogger("halfpi.client.wire")
_wire_log.setLevel(logging.WARNING)

__all__ = [
    "AUTH_CLOSE_CODES",
    "CA_FILE_ENV",
    "CLOSE_MEANINGS",
    "OPEN_TIMEOUT_S",
    "ConnectionLost",
    "Connector",
    "Transport",
    "Trust",
    "client_tls_context",
    "pinned_tls_context",
    "tls_connector",
    "websocket_connector",
]


class Transport(Protocol):
    async def send(self, text: str) -> None: ...

    async def recv(self) -> str:
        """Next text frame; raises :class:`ConnectionLost` when the link ends."""
        ...

    async def close(self) -> None: ...


Connector = Callable[[str], Awaitable[Transport]]
# What a client may be told to trust: a ready context, or a PEM CA file.
Trust = ssl.SSLContext | str | os.PathLike[str]
CA_FILE_ENV = "HALFPI_CA_FILE"
_PEM_BEGIN = "-----BEGIN CERTIFICATE-----"
_PEM_END = "-----END CERTIFICATE-----"


class _WebSocketTransport:
    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, text: str) -> None:
        import websockets

        try:
            await self.ws.send(text)
        except websockets.ConnectionClosed as exc:
            raise _lost(exc) from None

    async def recv(self) -> str:
        import websockets

        try:
            data = await self.ws.recv()
        except websockets.ConnectionClosed as exc:
            raise _lost(exc) from None
        return data if isinstance(data, str) else data.decode()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 2.0)


def _lost(exc: Any) -> ConnectionLost:
    rcvd = getattr(exc, "rcvd", None)
    return ConnectionLost(rcvd.code if rcvd else None, rcvd.reason if rcvd else "")


def client_tls_context(ca_file: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """Verify the Mind against ``ca_file`` (PEM) instead of the system's CAs
    (or against the system's CAs when ``None``); hostnames are checked."""
    return ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file is not None else None)


def pinned_tls_context(cert_file: str | os.PathLike[str]) -> ssl.SSLContext:
    """Trust exactly one certificate: the first in ``cert_file``.

    For a process that dials its own Mind (the in-process Hand): the address
    it dials (loopback) need not be a name on the certificate, and trusting
    the certificate itself (not its issuer) accepts no other server.
    """
    pem = Path(cert_file).read_text()
    start = pem.index(_PEM_BEGIN)
    end = pem.index(_PEM_END, start) + len(_PEM_END)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=pem[start:end])
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf is the anchor
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    context.check_hostname = False  # the certificate is pinned, whatever its names
    return context


def tls_connector(trust: Trust) -> Connector:
    """A connector that verifies ``wss://`` against ``trust``."""
    context = trust if isinstance(trust, ssl.SSLContext) else client_tls_context(trust)

    async def connect(url: str) -> Transport:
        return await websocket_connector(url, ssl_context=context)

    return connect


async def websocket_connector(url: str, *, ssl_context: ssl.SSLContext | None = None) -> Transport:
    import websockets

    try:
        options: dict[str, Any] = {}
        if url.startswith("wss://"):
            ca_file = os.environ.get(CA_FILE_ENV)
            if ssl_context is None and ca_file:
                ssl_context = client_tls_context(ca_file)
            if ssl_context is not None:
                options["ssl"] = ssl_context
        ws = await websockets.connect(
            url,
            max_size=None,
            open_timeout=OPEN_TIMEOUT_S,
            ping_interval=None,
            logger=_wire_log,
            **options,
        )
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        # ssl.SSLError (a certificate that does not verify) is an OSError too.
        raise ConnectionLost(None, _why_not(exc)) from None
    return _WebSocketTransport(ws)


OPEN_TIMEOUT_S = 10.0


def _why_not(exc: BaseException) -> str:
    """A failed connect, in words (never the library's repr)."""
    import socket

    import websockets

    if isinstance(exc, TimeoutError):
        return f"no answer within {OPEN_TIMEOUT_S:.0f} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listening there: is the Mind running?)"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, websockets.InvalidStatus):
        return f"the server refused the WebSocket upgrade (HTTP {exc.response.status_code})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return str(exc) or type(exc).__name__
