"""The raw SSE baseline: the fastest SSE server we can write in halfpi's
process model (one process, one asyncio loop, Python).

Like ``_raw_server.py`` for WebSocket, it is one ``asyncio.Protocol`` per
connection (no task per connection, no framework) speaking the least
HTTP/1.1 an SSE stream needs, on the loop the Mind runs on
(``halfpi.loop.run``, ``HALFPI_LOOP``), and it has nothing else to do:

- ``GET /events`` answers ``200`` with ``text/event-stream`` and a chunked
  body (as halfpi's own server streams SSE over HTTP/1.1), writes
  ``retry: 2000`` and joins the broadcast set. No resume token, no queue,
  no flow control, no per-reader state beyond the protocol object: an
  event that does not fit the socket waits in the transport's buffer.
- ``POST /chat?request_id=R&count=N&size=S`` answers ``202`` and closes,
  then, in one task: commits the rows of a chat's admission with plain
  ``sqlite3`` (``_rawsql.py``: the same schema, PRAGMAs and sizes as the
  WebSocket baselines), builds one delta event of S bytes on the wire
  (chunk header and trailer included) **once**, writes it to every reader
  with one ``transport.write`` each, N times, yielding to the loop between
  events (as the Mind's scripted agent does between deltas), commits the
  end's rows, then writes a ``chat.completed`` event naming R to every
  reader.

Everything else is answered 404. ``--db PATH`` is the database for the
durable rows (default: a new temporary directory). Prints
``{"url": "http://127.0.0.1:PORT", "port": PORT}`` once it listens; stops on
SIGTERM. The Starlette ``StreamingResponse`` version of the same server,
the ASGI adapter's reference, is ``_raw_asgi_sse.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import cast
from urllib.parse import parse_qs

from halfpi import loop

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _rawsql

HEADERS = (b"HTTP/1.1 200 OK\r\n"
           b"content-type: text/event-stream; charset=utf-8\r\n"
           b"cache-control: no-cache\r\n"
           b"x-accel-buffering: no\r\n"
           b"transfer-encoding: chunked\r\n\r\n")
ACCEPTED = (b"HTTP/1.1 202 Accepted\r\ncontent-type: text/plain\r\ncontent-length: 9\r\n"
            b"connection: close\r\n\r\naccepted\n")
NOT_FOUND = (b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def delta(size: int) -> bytes:
    """A delta event whose chunk is ``size`` bytes on the wire (at least the
    smallest such event)."""
    head = b'event: face.chat.delta\ndata: {"type":"face.chat.delta","payload":{"text":"'
    tail = b'"}}\nid: raw\n\n'
    least = len(head) + 1 + len(tail)
    for digits in range(1, 9):  # the chunk's hex length is part of its size
        body = size - 4 - digits
        if body >= least and len(b"%x" % body) == digits:
            return chunk(head + b"x" * (body - len(head) - len(tail)) + tail)
    return chunk(head + b"x" + tail)


def completed(request_id: str) -> bytes:
    frame = json.dumps({"type": "face.event", "payload": {
        "type": "chat.completed", "data": {"request_id": request_id}}}, separators=(",", ":"))
    return chunk(b"event: face.event\ndata: %b\nid: raw\n\n" % frame.encode())


class RawSse:
    def __init__(self, db_path: Path) -> None:
        self.readers: list[Reader] = []
        self.db = _rawsql.open_db(db_path)
        _rawsql.add_conversation(self.db, "c_raw", time.time())
        self.chats = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def chat(self, request_id: str, count: int, size: int) -> None:
        db = self.db
        self.chats += 1
        first = self.chats * (count + 4)
        chat = _rawsql.Chat("c_raw", request_id, f"run-{request_id}", first,
                            f"/repeat {count} x")
        now = time.time()
        _rawsql.commit(db, lambda: _rawsql.admit(db, chat, now))
        readers = self.readers
        frame = delta(size)  # built once, header and chunk framing included
        for _ in range(count):
            for reader in readers:
                reader.write(frame)
            await asyncio.sleep(0)
        content = "x" + " x" * (count - 1)
        end_seq = first + 2 + count
        now = time.time()
        _rawsql.commit(db, lambda: _rawsql.complete(db, chat, end_seq, content, now))
        end = completed(request_id)
        for reader in readers:
            reader.write(end)


class Reader(asyncio.Protocol):
    """One HTTP/1.1 connection: a request, then (for ``/events``) a stream."""

    def __init__(self, server: RawSse) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # asyncio's or uvloop's

    def data_received(self, data: bytes) -> None:
        if self.streaming:
            return  # a reader says nothing more
        self.head += data
        if b"\r\n\r\n" not in self.head:
            return
        method, target, _ = self.head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        path, _, query = target.partition("?")
        transport = self.transport
        assert transport is not None
        if method == "GET" and path == "/events":
            self.streaming = True
            self.server.readers.append(self)
            transport.write(HEADERS + chunk(b"retry: 2000\n\n"))
        elif method == "POST" and path == "/chat":
            q = {k: v[0] for k, v in parse_qs(query).items()}
            task = asyncio.get_running_loop().create_task(
                self.server.chat(q["request_id"], int(q["count"]), int(q["size"])))
            self.server.tasks.add(task)
            task.add_done_callback(self.server.tasks.discard)
            transport.write(ACCEPTED)
            transport.close()
        else:
            transport.write(NOT_FOUND)
            transport.close()

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None:
            transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streaming:
            self.server.readers.remove(self)
        self.transport = None


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp(prefix="raw-sse-")) / "raw.db"
    server = RawSse(db)
    running = asyncio.get_running_loop()
    listener = await running.create_server(lambda: Reader(server), "127.0.0.1", 0,
                                           backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    sys.stdout.write(json.dumps({"url": f"http://127.0.0.1:{port}", "port": port}) + "\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        running.add_signal_handler(signum, stop.set)
    await stop.wait()
    listener.close()


if __name__ == "__main__":
    loop.run(main())  # the loop the Mind runs on (HALFPI_LOOP), for a fair pair
