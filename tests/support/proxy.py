"""A fault-injecting TCP proxy on 127.0.0.1 for end-to-end tests.

Sits between a client and the Mind and can, on command or on a trigger:
cut every connection (now, or once N bytes have passed in a direction),
delay forwarding, or black-hole traffic (accept and forward nothing) so a
peer sees a silent, half-dead connection. Bounded: it only forwards for
connections the test opened and stops with the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class Link:
    def __init__(self, client_w: asyncio.StreamWriter, server_w: asyncio.StreamWriter) -> None:
        self.client_w = client_w
        self.server_w = server_w
        self.to_client = 0
        self.to_server = 0
        self.tasks: list[asyncio.Task[None]] = []

    def cut(self) -> None:
        for writer in (self.client_w, self.server_w):
            with contextlib.suppress(Exception):
                transport = writer.transport
                transport.abort()  # type: ignore[attr-defined]
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.links: list[Link] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.delay_s = 0.0
        self.blackhole = False
        # Cut when this many bytes have gone Mind → client on a link (then reset to None).
        self.cut_to_client_after: int | None = None
        self.cut_to_server_after: int | None = None
        # Called with each chunk Mind → client; returning True cuts before forwarding it.
        self.cut_when: Callable[[bytes], bool] | None = None
        # Called with each chunk Mind → client; what it returns is forwarded
        # instead (e.g. a frame repeated: a duplicate storm).
        self.rewrite_to_client: Callable[[bytes], bytes] | None = None
        self.cuts = 0
        # Cleared: Mind → client bytes stay unread in the Mind's socket, as if
        # the client had stopped reading (TCP back-pressure, no loss).
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def start(self) -> FaultProxy:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/face"

    async def stop(self) -> None:
        self.cut_all()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def pause_to_client(self) -> None:
        self.flowing.clear()

    def resume_to_client(self) -> None:
        self.flowing.set()

    async def refuse(self) -> None:
        """Cut every link and stop listening: new connections are refused
        (the network is down) until :meth:`listen_again`."""
        self.cut_all()
        if self.server is not None:
            self.server.close()
            self.server = None

    async def listen_again(self) -> None:
        """Accept connections again, on the same port."""
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def cut_all(self) -> None:
        for link in self.links:
            link.cut()
        self.links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        link = Link(writer, up_w)
        self.links.append(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_w, link, to_client=False)),
            asyncio.create_task(self._pump(up_r, writer, link, to_client=True)),
        ]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: Link, *, to_client: bool) -> None:
        try:
            while True:
                if to_client:
                    await self.flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                if to_client:
                    # A read already waiting when the flow was paused holds
                    # its chunk too: nothing reaches the client while paused.
                    await self.flowing.wait()
                if self.blackhole:
                    continue
                if to_client and self.cut_when is not None and self.cut_when(data):
                    self._cut(link)
                    return
                limit = self.cut_to_client_after if to_client else self.cut_to_server_after
                sent = link.to_client if to_client else link.to_server
                if limit is not None and sent + len(data) >= limit:
                    head = data[: max(0, limit - sent)]
                    if head:
                        writer.write(head)
                        with contextlib.suppress(Exception):
                            await writer.drain()
                    if to_client:
                        self.cut_to_client_after = None
                    else:
                        self.cut_to_server_after = None
                    self._cut(link)
                    return
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if to_client and self.rewrite_to_client is not None:
                    data = self.rewrite_to_client(data)
                writer.write(data)
                if to_client:
                    link.to_client += len(data)
                else:
                    link.to_server += len(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if link in self.links:
                link.cut()
                self.links.remove(link)

    def _cut(self, link: Link) -> None:
        self.cuts += 1
        link.cut()
        if link in self.links:
            self.links.remove(link)


def cut_on(marker: bytes) -> Callable[[bytes], bool]:
    """A ``cut_when`` predicate: cut before forwarding the chunk that completes
    ``marker`` (the tail of the previous chunk counts, so a marker split
    across two reads is still caught before its end reaches the client)."""
    tail = b""

    def predicate(chunk: bytes) -> bool:
        nonlocal tail
        hit = marker in tail + chunk
        tail = chunk[-len(marker):]
        return hit

    return predicate
