"""An in-memory transport: the seam's test double, shipped with the package.

:class:`MemoryTransport` is one connection whose other end is the caller:
``feed()`` puts a frame on its way to the client, ``cut()`` ends the link
the way a network or a close frame would, ``sent`` is what the client said.
:func:`memory_connector` hands out scripted links, so a client's whole
reconnect path runs without a socket (httpx's ``MockTransport``, for
Mind-facing clients).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any

from halfpi.client.transport import ConnectionLost, Connector, Transport


class MemoryTransport:
    def __init__(self, url: str = "") -> None:
        self.url = url
        self.sent: list[str] = []
        self.closed = False
        self._inbox: asyncio.Queue[str | ConnectionLost] = asyncio.Queue()
        self._said = asyncio.Event()

    # -- the client's side (the Transport protocol) --------------------------------

    async def send(self, text: str) -> None:
        if self.closed:
            raise ConnectionLost(1006, "closed")
        self.sent.append(text)
        self._said.set()

    async def recv(self) -> str:
        item = await self._inbox.get()
        if isinstance(item, ConnectionLost):
            self._inbox.put_nowait(item)  # a dead link stays dead
            raise item
        return item

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._inbox.put_nowait(ConnectionLost(1000, "closed by the client"))

    # -- the other end -------------------------------------------------------------

    def feed(self, type_: str, payload: dict[str, Any] | None = None) -> None:
        """Send the client one ``{"type", "payload"}`` frame."""
        self._inbox.put_nowait(json.dumps({"type": type_, "payload": payload or {}}))

    def cut(self, code: int | None = 1006, reason: str = "") -> None:
        """End the link: the client's next ``recv`` raises :class:`ConnectionLost`."""
        self._inbox.put_nowait(ConnectionLost(code, reason))

    def frames(self, type_: str | None = None) -> list[dict[str, Any]]:
        """What the client sent, decoded (only ``type_`` if given)."""
        decoded = [json.loads(text) for text in self.sent]
        return [f for f in decoded if type_ is None or f.get("type") == type_]

    async def said(self, type_: str, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until the client has sent a ``type_`` frame; its payload."""

        async def first() -> dict[str, Any]:
            while True:
                found = self.frames(type_)
                if found:
                    payload: dict[str, Any] = found[0].get("payload") or {}
                    return payload
                self._said.clear()
                await self._said.wait()

        return await asyncio.wait_for(first(), timeout)


def memory_connector(
    script: Iterable[str | None],
    opened: list[MemoryTransport],
    on_open: Callable[[MemoryTransport], None] | None = None,
) -> Connector:
    """Each dial takes the next entry of ``script``: a reason the dial fails
    with, or ``None`` for a new :class:`MemoryTransport` (appended to
    ``opened``, then given to ``on_open``); after the script, every dial
    opens one."""
    plan = list(script)

    async def connect(url: str) -> Transport:
        await asyncio.sleep(0)  # a dial is a scheduling point, as on a network
        why = plan.pop(0) if plan else None
        if why is not None:
            raise ConnectionLost(None, why)
        link = MemoryTransport(url)
        opened.append(link)
        if on_open is not None:
            on_open(link)
        return link

    return connect
