"""A small fault-injecting TCP proxy on 127.0.0.1 for the conformance kit.

It forwards bytes both ways between a client and the target and can cut
every connection at once (a broken link) or stop forwarding to the client
(a reader that stops reading: the target's writes back up, nothing is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket


class KitProxy:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port_target = port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter,
                                list[asyncio.Task[None]]]] = []
        self.cuts = 0
        # Cleared: nothing is read from the target for the client any more,
        # so the target's writes back up as if the client had stopped reading.
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def start(self) -> KitProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.cut_all()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def cut_all(self) -> None:
        """Abort every open link on both sides (the network broke)."""
        for client_w, server_w, tasks in self._links:
            for writer in (client_w, server_w):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
            for task in tasks:
                task.cancel()
        if self._links:
            self.cuts += 1
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A small receive buffer (set before connecting, so the window starts
        # small): a paused link backs up into the target quickly.
        loop = asyncio.get_running_loop()
        try:
            info = await loop.getaddrinfo(self.host, self.port_target, type=socket.SOCK_STREAM)
        except OSError:
            writer.transport.abort()
            return
        family, _, _, _, address = info[0]
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        upstream.setblocking(False)
        try:
            await asyncio.wait_for(
                loop.sock_connect(upstream, address), 5)
            up_r, up_w = await asyncio.open_connection(sock=upstream)
        except (OSError, TimeoutError):
            upstream.close()
            writer.transport.abort()
            return
        tasks: list[asyncio.Task[None]] = []
        self._links.append((writer, up_w, tasks))
        tasks.append(asyncio.create_task(self._pump(reader, up_w, to_client=False)))
        tasks.append(asyncio.create_task(self._pump(up_r, writer, to_client=True)))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    *, to_client: bool) -> None:
        try:
            while True:
                if to_client:
                    await self.flowing.wait()
                data = await reader.read(4096 if to_client else 65536)
                if not data:
                    break
                if to_client:
                    await self.flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            # Gracefully: what was already read (a close frame) still reaches the peer.
            with contextlib.suppress(Exception):
                writer.close()
