"""A Face SDK connected to an in-process Mind with no socket in between.

:func:`session_connector` is a :data:`~halfpi.client.transport.Connector`:
each dial opens a real :class:`~halfpi.gateway.session.FaceSession` of the
test's Mind (``tests/support/rig.py``, on a fake clock) and hands the client
a :class:`SessionLink` whose other end is that session. Every rule of the
Mind and of the SDK runs as in production; only the bytes skip the network,
so a whole Face (the terminal face under Textual's ``Pilot``, say) is tested
fast and without sleeping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from halfpi.client.transport import ConnectionLost, Connector, Transport
from halfpi.gateway.session import FaceSession
from halfpi.mind.service import Mind


class SessionLink:
    """Both ends of one connection: the client's transport and the session's."""

    address = "192.0.2.7"

    def __init__(self, mind: Mind, url: str) -> None:
        self.url = url
        self.closed = False
        self.sent: list[dict[str, Any]] = []  # what the client said, decoded
        self._inbox: asyncio.Queue[str | ConnectionLost] = asyncio.Queue()
        self.session = FaceSession(mind, self)

    # -- the session's side (gateway.session.Transport) -----------------------------

    def write_frames(self, frames: list[bytes]) -> None:
        for frame in frames:
            self._inbox.put_nowait(frame.decode())

    def ping(self) -> None:
        pass

    def close(self, code: int, reason: str) -> None:  # the Mind closes
        self._inbox.put_nowait(ConnectionLost(code, reason))
        self.session.on_closed()

    # -- the client's side (client.transport.Transport) -------------------------------

    async def send(self, text: str) -> None:
        if self.closed:
            raise ConnectionLost(1006, "closed")
        self.sent.append(json.loads(text))
        self.session.on_frame(text.encode())

    async def recv(self) -> str:
        item = await self._inbox.get()
        if isinstance(item, ConnectionLost):
            self._inbox.put_nowait(item)  # a dead link stays dead
            raise item
        return item

    def cut(self) -> None:
        """The network dies: both ends learn it."""
        if not self.closed:
            self.closed = True
            self._inbox.put_nowait(ConnectionLost(1006, "cut"))
            self.session.on_closed()


class _ClientEnd:
    """What the client holds: :class:`SessionLink` with an awaitable close."""

    def __init__(self, link: SessionLink) -> None:
        self.link = link

    async def send(self, text: str) -> None:
        await self.link.send(text)

    async def recv(self) -> str:
        return await self.link.recv()

    async def close(self) -> None:
        self.link.cut()


def session_connector(
    mind: Mind, opened: list[SessionLink] | None = None, down: Callable[[], bool] | None = None
) -> Connector:
    """Each dial: a new session of ``mind`` (appended to ``opened``, if
    given); refused while ``down()`` says the Mind is unreachable."""

    async def connect(url: str) -> Transport:
        await asyncio.sleep(0)  # a dial is a scheduling point, as on a network
        if down is not None and down():
            raise ConnectionLost(None, "connection refused")
        link = SessionLink(mind, url)
        if opened is not None:
            opened.append(link)
        return _ClientEnd(link)

    return connect
