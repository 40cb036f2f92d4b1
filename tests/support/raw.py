"""A Face on a bare socket, for tests that need full control of the bytes.

``FaceClient`` reads eagerly in the background (that is what a WebSocket
library does). Some tests need the opposite: a peer that does the
handshake and then reads *nothing* — its kernel receive buffer fills and
the Mind sees a stalled consumer — or that writes many frames in a single
``send`` so the Mind receives them in one chunk. :class:`RawFace` drives
the Sans-I/O ``websockets`` client protocol over a non-blocking socket and
reads only when asked.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Close, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

Frame = dict[str, Any]


class RawFace:
    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock = sock
        self.protocol = protocol
        self.frames: list[Frame] = []
        self._pending: list[Frame] = []
        self.close_code: int | None = None
        self.eof = False
        self.pongs: list[bytes] = []  # payloads of the pongs received, in order

    @classmethod
    async def connect(cls, url: str, *, rcvbuf: int | None = None,
                      timeout: float = 10.0) -> RawFace:
        """Open the WebSocket. ``rcvbuf`` shrinks the kernel receive buffer
        (set before ``connect`` so the TCP window is small from the start)."""
        uri = parse_uri(url)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.sock_connect(sock, (uri.host, uri.port)), timeout)
        protocol = ClientProtocol(uri, max_size=None)
        protocol.send_request(protocol.connect())
        face = cls(sock, protocol)
        await face._flush()
        deadline = loop.time() + timeout
        while protocol.state is State.CONNECTING:
            await face._read_once(deadline - loop.time())
            for event in protocol.events_received():
                if isinstance(event, Response) and protocol.handshake_exc is not None:
                    raise protocol.handshake_exc
        return face

    async def _flush(self) -> None:
        data = b"".join(self.protocol.data_to_send())
        if data:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def _read_once(self, timeout: float) -> None:
        if timeout <= 0:
            raise TimeoutError("nothing to read in time")
        loop = asyncio.get_running_loop()
        data = await asyncio.wait_for(loop.sock_recv(self.sock, 1 << 20), timeout)
        if data:
            self.protocol.receive_data(data)
        else:
            self.eof = True
            self.protocol.receive_eof()

    async def send(self, type_: str, payload: dict[str, Any]) -> None:
        await self.send_many([json.dumps({"type": type_, "payload": payload})])

    async def send_many(self, texts: list[str | bytes]) -> None:
        """Frame every text and write them all with one ``sendall``."""
        for text in texts:
            data = text.encode() if isinstance(text, str) else text
            self.protocol.send_text(data)
        await self._flush()

    async def send_pings(self, count: int, *, numbered: bool = False) -> None:
        """``count`` WebSocket pings in one write, their answers not read.
        Each carries 125 bytes (the most a ping may), or ``ping-<i>``."""
        for i in range(count):
            self.protocol.send_ping(f"ping-{i}".encode() if numbered else b"p" * 125)
        await self._flush()

    async def hello(self, token: str) -> Frame:
        await self.send("face.hello", {"token": token, "client": {"name": "raw", "version": "0"},
                                       "protocol": 3})
        return await self.expect(lambda f: f["type"] == "face.welcome")

    def _collect(self) -> None:
        for event in self.protocol.events_received():
            if event.opcode is Opcode.TEXT:
                frame: Frame = json.loads(event.data)
                self.frames.append(frame)
                self._pending.append(frame)
            elif event.opcode is Opcode.PONG:
                self.pongs.append(bytes(event.data))
            elif event.opcode is Opcode.CLOSE:
                self.close_code = Close.parse(event.data).code

    async def expect(self, predicate: Any, timeout: float = 10.0) -> Frame:
        """Read until a frame matches (frames read meanwhile stay in ``frames``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._collect()
            while self._pending:
                frame = self._pending.pop(0)
                if predicate(frame):
                    return frame
            if self.close_code is not None or self.eof:
                raise ConnectionError(f"closed ({self.close_code}) before a matching frame")
            await self._read_once(deadline - loop.time())

    async def read_until_closed(self, timeout: float = 10.0) -> int | None:
        """Read everything the Mind sent, up to its close; return the close code."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.close_code is None and not self.eof:
            await self._read_once(deadline - loop.time())
            self._collect()
            await self._flush()  # answer the closing handshake
        self._pending.clear()
        return self.close_code

    def close(self) -> None:
        self.sock.close()
