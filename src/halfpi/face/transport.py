"""The SDK's transport seam: what a Face connection must do, and the WebSocket one.

Tests inject their own :data:`Connector` (a scripted Mind); the default speaks
WebSocket through ``websockets``, whose exceptions are mapped here, at the
boundary, to :class:`ConnectionLost` (with the close code, when there was one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

# The WebSocket library logs frames at DEBUG; the first frame carries the
# token, so its logger never goes below WARNING whatever the root level is.
_wire_log = logging.getLogger("halfpi.face.wire")
_wire_log.setLevel(logging.WARNING)


class ConnectionLost(Exception):
    def __init__(self, code: int | None = None, reason: str = "") -> None:
        super().__init__(f"connection lost ({code}): {reason}")
        self.code = code
        self.reason = reason

    def describe(self) -> str:
        """Why, in words a person can act on (what a status line shows)."""
        known = CLOSE_MEANINGS.get(self.code) if self.code is not None else None
        if known is not None:
            return known
        if self.code is None:
            return self.reason or "the connection dropped"
        return f"closed with code {self.code}" + (f": {self.reason}" if self.reason else "")


CLOSE_MEANINGS = {
    1000: "the connection was closed",
    1001: "the Mind closed the connection (no traffic, or going away)",
    1006: "the connection dropped",
    1011: "the Mind hit an internal error",
    1012: "the Mind is restarting",
    4008: "too slow to keep up: the Mind closed the connection",
    4009: "the Mind saw a protocol violation",
    4010: "no hello in time",
}


class Transport(Protocol):
    async def send(self, text: str) -> None: ...

    async def recv(self) -> str:
        """Next text frame; raises :class:`ConnectionLost` when the link ends."""
        ...

    async def close(self) -> None: ...


Connector = Callable[[str], Awaitable[Transport]]


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


async def websocket_connector(url: str) -> Transport:
    import websockets

    try:
        ws = await websockets.connect(
            url, max_size=None, open_timeout=OPEN_TIMEOUT_S, ping_interval=None, logger=_wire_log
        )
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
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
