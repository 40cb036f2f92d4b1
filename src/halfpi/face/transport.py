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
            url, max_size=None, open_timeout=10, ping_interval=None, logger=_wire_log
        )
    except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
        raise ConnectionLost(None, str(exc)) from None
    return _WebSocketTransport(ws)
