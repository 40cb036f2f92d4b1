"""The ASGI reference for SSE: a plain Starlette ``StreamingResponse`` under uvicorn.

``GET /events`` streams, to each reader, events from its own unbounded
queue (no resume token, no queue policy, no subscription, no store).
``POST /chat?request_id=R&count=N&size=S`` commits the rows a chat's
admission commits with plain ``sqlite3`` (``_rawsql.py``: same schema,
PRAGMAs and sizes, as the WebSocket baselines do), broadcasts N
pre-framed delta events of S bytes each to every reader, yielding to the
loop between events (as the Mind's scripted agent does between deltas),
commits the end's rows, then sends a ``chat.completed`` event naming R; it
answers 202 at once. ``sse_fanout.py`` pairs ``halfpi mind --server asgi``
with it (what the ASGI adapter adds on top of a Starlette endpoint); the
raw baseline for halfpi's own server is ``_raw_sse.py`` (an
``asyncio.Protocol``, no framework).

Prints ``{"url": "http://127.0.0.1:PORT"}`` once it listens.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _rawsql

readers: set[asyncio.Queue[bytes]] = set()
_tasks: set[asyncio.Task[None]] = set()
_db: dict[str, Any] = {}


def database() -> Any:
    if "conn" not in _db:
        path = Path(tempfile.mkdtemp(prefix="raw-sse-")) / "raw.db"
        _db["conn"] = _rawsql.open_db(path)
        _rawsql.add_conversation(_db["conn"], "c_raw", time.time())
        _db["chats"] = 0
    return _db["conn"]


def delta(seq: int, size: int) -> bytes:
    head = (b'event: face.chat.delta\ndata: {"type":"face.chat.delta",'
            b'"payload":{"seq":%d,"text":"' % seq)
    tail = b'"}}\nid: raw\n\n'
    return head + b"x" * max(1, size - len(head) - len(tail)) + tail


def completed(request_id: str) -> bytes:
    frame = json.dumps({"type": "face.event", "payload": {
        "type": "chat.completed", "data": {"request_id": request_id}}}, separators=(",", ":"))
    return b"event: face.event\ndata: %b\nid: raw\n\n" % frame.encode()


async def events(request: Request) -> Response:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    readers.add(queue)

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield b"retry: 2000\n\n"
            while True:
                yield await queue.get()
        finally:
            readers.discard(queue)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def broadcast(request_id: str, count: int, size: int) -> None:
    db = database()
    _db["chats"] += 1
    first = _db["chats"] * (count + 4)
    chat = _rawsql.Chat("c_raw", request_id, f"run-{request_id}", first, f"/repeat {count} x")
    now = time.time()
    _rawsql.commit(db, lambda: _rawsql.admit(db, chat, now))
    for seq in range(1, count + 1):
        data = delta(seq, size)
        for queue in list(readers):
            queue.put_nowait(data)
        await asyncio.sleep(0)
    content = "x" + " x" * (count - 1)
    end_seq = first + 2 + count
    now = time.time()
    _rawsql.commit(db, lambda: _rawsql.complete(db, chat, end_seq, content, now))
    end = completed(request_id)
    for queue in list(readers):
        queue.put_nowait(end)


async def chat(request: Request) -> Response:
    q = request.query_params
    task = asyncio.create_task(broadcast(q["request_id"], int(q["count"]), int(q["size"])))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return PlainTextResponse("accepted\n", status_code=202)


app = Starlette(routes=[Route("/events", events), Route("/chat", chat, methods=["POST"])])


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    print(json.dumps({"url": f"http://127.0.0.1:{port}"}), flush=True)
    sys.stdout.flush()
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
