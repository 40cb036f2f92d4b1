"""The raw ASGI baseline: a WebSocket broadcast written as fast as a
Starlette WebSocket endpoint under uvicorn allows, for the ASGI adapter's
figures (``halfpi mind --server asgi``).

What it is: one ``starlette.applications.Starlette`` with one
``WebSocketRoute`` whose endpoint takes a ``starlette.websockets.WebSocket``,
served by ``uvicorn.Server`` on the standard asyncio loop (as the Mind runs
it; no uvloop) with uvicorn's default WebSocket implementation
(``websockets-sansio``, the one ``halfpi mind --server asgi`` subclasses)
and the same uvicorn settings as the Mind's (no compression, a ping every
15 s, no access log). Nothing else: no queue, no writer task, no flow
control of its own.

It speaks the command protocol of ``_raw_server.py`` (``hello``,
``subscribe``, ``chat``; see there) with the same bytes: a hello is
answered with a frame of the asked size, a chat commits the same durable
rows with plain ``sqlite3`` (``_rawsql.py``, ``--db``), then broadcasts N
pre-built frames of the same size to every subscriber, yielding to the loop
between frames, then ``chat.completed`` to all and ``face.result`` to the
caller. A broadcast frame is decoded to ``str`` once (ASGI carries text as
``str``) and its ASGI message dict built once; each delivery is one
``await websocket.send(message)`` in the chat's task, which completes at
once while uvicorn's transport takes writes (uvicorn then encodes the text
and writes the frame with one ``transport.write``). That is the least a
Starlette endpoint can do per frame per subscriber.

Prints ``{"url": ...}`` once listening; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _raw_server import delta_payload, end_event, event, filler

HEARTBEAT_S = 15.0  # as the Mind's heartbeat_s (uvicorn's ws_ping_interval under --server asgi)


def text(payload: bytes) -> dict[str, Any]:
    """The ASGI message carrying one text frame (built once per frame content)."""
    return {"type": "websocket.send", "text": payload.decode()}


class Hub:
    def __init__(self, db: Path | None) -> None:
        self.subscribers: list[WebSocket] = []
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

    async def chat(self, caller: WebSocket, cmd: dict[str, Any]) -> None:
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
        await caller.send(text(event("face.accepted", {"request_id": request_id})))
        subscribers = list(self.subscribers)
        fixed = text(delta_payload(size, b"x"))
        loop = asyncio.get_running_loop()
        start = loop.time()
        for index in range(count):
            if stamp:
                stamp_text = str(time.time_ns()).encode()
                message = text(delta_payload(size, stamp_text if index == 0 else
                                             b" " + stamp_text))
            else:
                message = fixed
            for sub in subscribers:
                await sub.send(message)
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
        end = text(end_event(request_id))
        for sub in subscribers:
            await sub.send(end)
        await caller.send(text(event("face.result", {"request_id": request_id,
                                                     "status": "succeeded"})))

    async def endpoint(self, websocket: WebSocket) -> None:
        await websocket.accept()
        chats: set[asyncio.Task[None]] = set()
        try:
            while True:
                cmd = json.loads(await websocket.receive_text())
                kind = cmd.get("cmd")
                request_id = cmd.get("request_id", "")
                if kind == "hello":
                    await websocket.send(text(filler(int(cmd.get("reply_size", 100)))))
                elif kind == "subscribe":
                    self.subscribers.append(websocket)
                    await websocket.send(text(event("face.accepted",
                                                    {"request_id": request_id})))
                elif kind == "chat":  # its own task, as _raw_server: this one keeps reading
                    task = asyncio.get_running_loop().create_task(self.chat(websocket, cmd))
                    chats.add(task)
                    task.add_done_callback(chats.discard)
        except WebSocketDisconnect:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self.subscribers.remove(websocket)


class _Server(uvicorn.Server):
    """Signals are this script's (as in the Mind's AsgiServer)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    hub = Hub(args.db)
    app = Starlette(routes=[WebSocketRoute("/", hub.endpoint)])
    config = uvicorn.Config(
        app,
        loop="none",  # the loop asyncio.run made: the standard asyncio loop, as the Mind's
        lifespan="off",
        ws="websockets-sansio",  # uvicorn's default ("auto") with websockets installed
        ws_per_message_deflate=False,
        ws_max_size=4 * 1024 * 1024,
        ws_ping_interval=HEARTBEAT_S,
        ws_ping_timeout=30.0,
        backlog=4096,
        log_config=None,
        log_level=logging.WARNING,
        access_log=False,
        server_header=False,
    )
    sock = socket.create_server(("127.0.0.1", 0), backlog=4096)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    port = sock.getsockname()[1]
    sys.stdout.write(json.dumps({"url": f"ws://127.0.0.1:{port}/", "port": port}) + "\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: setattr(server, "should_exit", True))
    await task


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main())
