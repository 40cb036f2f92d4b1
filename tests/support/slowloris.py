"""Peers that never finish a request head (a "slowloris"): each opens a
connection, sends a request line, then one more header line every
``every_s`` seconds for as long as the server keeps it open. What a test
reads: whether, and when, the server closed each one (and what it said)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class Dribbler:
    port: int
    path: str = "/v1/conversations"
    source: str = "127.0.0.1"  # another loopback address counts as another client
    every_s: float = 1.0
    # True: a TLS handshake that never ends instead (a record header that
    # announces a ClientHello, then one byte of it every ``every_s``).
    tls: bool = False
    opened_at: float | None = None
    closed_after: float | None = None  # seconds from connect to the server's close
    answer: bytes = b""  # what the server wrote before closing, if anything
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    async def open(self) -> None:
        """Connect and send the request line; then dribble in the background."""
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, local_addr=(self.source, 0)
        )
        self.opened_at = loop.time()
        writer.write(b"\x16\x03\x01\x02\x00\x01" if self.tls else
                     f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        self.task = asyncio.create_task(self._dribble(reader, writer))

    async def _dribble(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        reading = asyncio.ensure_future(reader.read())  # returns at the server's close
        try:
            line = 0
            while not reading.done():
                await asyncio.wait({reading}, timeout=self.every_s)
                if not reading.done():
                    writer.write(b"\x00" if self.tls else f"X-Line-{line}: slow\r\n".encode())
                    line += 1
            self.answer = reading.result()
        except (ConnectionError, OSError):
            pass
        finally:
            assert self.opened_at is not None
            self.closed_after = loop.time() - self.opened_at
            reading.cancel()
            writer.close()

    @property
    def closed(self) -> bool:
        return self.closed_after is not None

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


@contextlib.asynccontextmanager
async def flood(port: int, sources: list[str], per_source: int, path: str = "/v1/conversations",
                every_s: float = 1.0, tls: bool = False) -> AsyncIterator[list[Dribbler]]:
    """``per_source`` dribblers from each source address, all open; stopped on exit."""
    dribblers = [Dribbler(port, path, source, every_s, tls) for source in sources
                 for _ in range(per_source)]
    try:
        for i in range(0, len(dribblers), 50):
            await asyncio.gather(*(d.open() for d in dribblers[i:i + 50]))
        yield dribblers
    finally:
        for d in dribblers:
            d.stop()
        await asyncio.gather(*(d.task for d in dribblers if d.task is not None),
                             return_exceptions=True)
