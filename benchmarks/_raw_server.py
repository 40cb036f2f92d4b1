"""The raw baseline: the fastest WebSocket server we can write in halfpi's
process model (one process, one asyncio loop, Python).

Like halfpi's ``gateway/native.py`` it drives the Sans-I/O ``websockets``
``ServerProtocol`` from one ``asyncio.Protocol`` (no task per connection)
and writes server frames itself; unlike halfpi it has nothing else to do.
A broadcast frame is built once, header included, and handed to each
subscriber's transport with one ``write`` (one ``send`` system call, the
least per-frame work a Python server can do without batching frames across
events, which halfpi does not do either); a replay is pre-encoded and
written with one ``writelines``. There is no flow control: a frame that
does not fit the socket waits in the transport's buffer.

Commands are JSON text frames:

- ``{"cmd": "hello", "reply_size": S}`` → one frame of S bytes (a welcome);
- ``{"cmd": "subscribe", "request_id": R}`` → joins the broadcast set,
  answers ``face.accepted``;
- ``{"cmd": "chat", "request_id": R, "count": N, "size": S, "period_ms": P,
  "stamp": bool, "durable": bool}`` → (durable: commit the rows of a chat's
  admission with plain sqlite3, ``_rawsql.py``) ``face.accepted`` to the
  caller; N delta-shaped frames of S bytes to every subscriber, yielding to
  the loop between frames (P > 0: one every P ms on a fixed schedule; a
  stamped frame's text is ``time.time_ns()`` at emission); (durable: commit
  the end's rows) ``chat.completed`` to every subscriber, ``face.result``
  to the caller;
- ``{"cmd": "prepare", "request_id": R, "sizes": [S...]}`` → pre-encodes
  frames of these sizes (headers included), answers ``face.result``;
- ``{"cmd": "replay", "request_id": R}`` → writes the prepared frames to the
  caller with one ``writelines``, then a ``chat.completed`` carrying R.

``--ping-interval S`` sends every connection a WebSocket ping every S
seconds (one ``call_later`` per connection: asyncio's own timer heap), as a
server with heartbeats must. ``--db PATH`` is the database for durable
chats. Prints ``{"url": ...}`` once listening; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, cast

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from halfpi import loop

sys.path.insert(0, str(Path(__file__).resolve().parent))

_HEAD = b'{"type":"face.chat.delta","payload":{"event_seq":1,"pad":"'
_MID = b'","text":"'
_TAIL = b'"}}'
_HEADERS = [bytes((0x81, n)) for n in range(126)]


def header(size: int) -> bytes:
    if size < 126:
        return _HEADERS[size]
    if size < 65536:
        return b"\x81\x7e" + size.to_bytes(2, "big")
    return b"\x81\x7f" + size.to_bytes(8, "big")


def framed(payload: bytes) -> bytes:
    return header(len(payload)) + payload


def delta_payload(size: int, text: bytes) -> bytes:
    pad = max(0, size - len(_HEAD) - len(_MID) - len(_TAIL) - len(text))
    return _HEAD + b"p" * pad + _MID + text + _TAIL


def filler(size: int, type_: str = "face.welcome") -> bytes:
    head = b'{"type":"' + type_.encode() + b'","payload":{"pad":"'
    return head + b"p" * max(0, size - len(head) - 3) + b'"}}'


def event(type_: str, payload: dict[str, Any]) -> bytes:
    return json.dumps({"type": type_, "payload": payload}, separators=(",", ":")).encode()


def end_event(request_id: str, size: int = 0) -> bytes:
    body = {"type": "chat.completed", "data": {"request_id": request_id}, "seq": -1}
    frame = event("face.event", body)
    if size > len(frame):  # padded to the size of the event it stands for
        body["pad"] = "p" * (size - len(frame) - 9)
        frame = event("face.event", body)
    return frame


class RawServer:
    def __init__(self, ping_interval: float, db: Path | None) -> None:
        self.subscribers: list[Connection] = []
        self.ping_interval = ping_interval
        self.db_path = db
        self.db: Any = None
        self.chats = 0

    def durable(self) -> Any:
        if self.db is None:
            import _rawsql

            assert self.db_path is not None, "--db is needed for durable chats"
            self.db = _rawsql.open_db(self.db_path)
            _rawsql.add_conversation(self.db, "c_raw", time.time())
        return self.db

    async def chat(self, caller: Connection, cmd: dict[str, Any]) -> None:
        request_id = cmd["request_id"]
        count, size = int(cmd["count"]), int(cmd["size"])
        period = float(cmd.get("period_ms", 0)) / 1000.0
        stamp = bool(cmd.get("stamp"))
        chat = None
        if cmd.get("durable"):
            import _rawsql

            db = self.durable()
            self.chats += 1
            seq = self.chats * (count + 4)
            content = cmd.get("content", "")
            chat = _rawsql.Chat("c_raw", request_id, f"run-{request_id}", seq, content)
            now = time.time()
            _rawsql.commit(db, lambda: _rawsql.admit(db, chat, now))
        caller.write(framed(event("face.accepted", {"request_id": request_id})))
        subscribers = self.subscribers
        fixed = framed(delta_payload(size, b"x"))
        loop = asyncio.get_running_loop()
        start = loop.time()
        for index in range(count):
            if stamp:
                text = str(time.time_ns()).encode()
                frame = framed(delta_payload(size, text if index == 0 else b" " + text))
            else:
                frame = fixed
            for sub in subscribers:
                sub.write(frame)
            if period:
                await asyncio.sleep(max(0.0, start + (index + 1) * period - loop.time()))
            else:
                await asyncio.sleep(0)
        if chat is not None:
            import _rawsql

            db = self.db
            content = "x" + " x" * (count - 1)
            now = time.time()
            end_seq = chat.seq + 2 + count
            _rawsql.commit(db, lambda: _rawsql.complete(db, chat, end_seq, content, now))
        end = framed(end_event(request_id))
        for sub in subscribers:
            sub.write(end)
        caller.write(framed(event("face.result", {"request_id": request_id,
                                                   "status": "succeeded"})))


class Connection(asyncio.Protocol):
    def __init__(self, server: RawServer) -> None:
        self.server = server
        self.ws = ServerProtocol(max_size=None)
        self.transport: asyncio.Transport | None = None
        self.prepared: list[bytes] = []
        self.last_size = 0
        self.ping: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast("asyncio.Transport", transport)  # asyncio's or uvloop's
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        ws.receive_data(data)
        for ev in ws.events_received():
            if isinstance(ev, Request):
                ws.send_response(ws.accept(ev))
                if self.server.ping_interval:
                    self._arm_ping()
            elif isinstance(ev, Frame) and ev.opcode is Opcode.TEXT:
                self.command(json.loads(ev.data))
        self.flush_protocol()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.server.subscribers:
            self.server.subscribers.remove(self)
        if self.ping is not None:
            self.ping.cancel()
        self.ws.receive_eof()

    def _arm_ping(self) -> None:
        loop = asyncio.get_running_loop()
        self.ping = loop.call_later(self.server.ping_interval, self._send_ping)

    def _send_ping(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"\x89\x00")  # an empty ping; the client pongs
            self._arm_ping()

    def write(self, frame: bytes) -> None:
        transport = self.transport
        if transport is not None and self.ws.state is State.OPEN:
            transport.write(frame)

    def flush_protocol(self) -> None:
        chunks = self.ws.data_to_send()
        if chunks and self.transport is not None:
            if chunks[-1] == b"":
                chunks.pop()
                self.transport.writelines(chunks)
                self.transport.close()
            else:
                self.transport.writelines(chunks)

    def command(self, cmd: dict[str, Any]) -> None:
        kind = cmd.get("cmd")
        request_id = cmd.get("request_id", "")
        if kind == "hello":
            self.write(framed(filler(int(cmd.get("reply_size", 100)))))
        elif kind == "subscribe":
            self.server.subscribers.append(self)
            self.write(framed(event("face.accepted", {"request_id": request_id})))
        elif kind == "chat":
            asyncio.get_running_loop().create_task(self.server.chat(self, cmd))
        elif kind == "prepare":
            sizes = [int(s) for s in cmd["sizes"]]
            self.prepared = [framed(delta_payload(s, b"x")) for s in sizes[:-1]]
            self.last_size = sizes[-1]
            self.write(framed(event("face.result", {"request_id": request_id})))
        elif kind == "replay":
            assert self.transport is not None
            self.transport.writelines([*self.prepared,
                                       framed(end_event(request_id, self.last_size))])


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ping-interval", type=float, default=0.0)
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    server = RawServer(args.ping_interval, args.db)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: Connection(server), "127.0.0.1", 0, backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    sys.stdout.write(json.dumps({"url": f"ws://127.0.0.1:{port}/", "port": port}) + "\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    listener.close()


if __name__ == "__main__":
    loop.run(main())  # the loop the Mind runs on (HALFPI_LOOP), for a fair pair
