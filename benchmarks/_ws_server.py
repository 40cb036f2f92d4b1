"""A default ``websockets.asyncio.server`` (a handler task per connection,
``broadcast()``): the memory baseline "what a typical Python WebSocket
server holds per connection". The throughput baselines use the faster
``_raw_server.py``.

It speaks just enough of a JSON command protocol for the benchmarks to drive
it the way they drive a Mind, and it answers with frames of the sizes it is
asked for, so both sides put the same bytes on the wire:

- ``{"cmd": "hello", "reply_size": S}`` → one text frame of S bytes (a welcome);
- ``{"cmd": "subscribe", "request_id": R}`` → joins the broadcast set, answers
  ``face.accepted``;
- ``{"cmd": "broadcast", "request_id": R, "count": N, "size": S,
  "period_ms": P, "stamp": bool}`` → ``broadcast()`` N delta-shaped frames of
  S bytes to every subscriber, yielding to the loop between frames (with
  P > 0, one frame every P ms on a fixed schedule; a stamped frame's text is
  ``time.time_ns()`` at emission), then a
  ``chat.completed`` event to all and a ``face.result`` to the caller;
- ``{"cmd": "send", "request_id": R, "sizes": [S...]}`` → one ``send()`` per
  size to the caller alone, then ``chat.completed``;
- ``{"cmd": "blast", ...}`` → the same, but with ``broadcast([caller], …)``
  in a loop that never yields: the fastest way websockets can queue frames.

Prints ``{"url": ...}`` once listening; stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

from websockets.asyncio.server import ServerConnection, broadcast, serve

subscribers: set[ServerConnection] = set()

_HEAD = b'{"type":"face.chat.delta","payload":{"event_seq":1,"pad":"'
_MID = b'","text":"'
_TAIL = b'"}}'


def delta_frame(size: int, text: bytes) -> bytes:
    pad = max(0, size - len(_HEAD) - len(_MID) - len(_TAIL) - len(text))
    return _HEAD + b"p" * pad + _MID + text + _TAIL


def filler(size: int) -> bytes:
    head = b'{"type":"face.welcome","payload":{"pad":"'
    pad = max(0, size - len(head) - 3)
    return head + b"p" * pad + b'"}}'


def event(type_: str, payload: dict[str, Any]) -> bytes:
    return json.dumps({"type": type_, "payload": payload}).encode()


def end_event(request_id: str) -> bytes:
    return event("face.event", {"type": "chat.completed", "data": {"request_id": request_id}})


async def run_broadcast(cmd: dict[str, Any]) -> None:
    count, size = int(cmd["count"]), int(cmd["size"])
    period = float(cmd.get("period_ms", 0)) / 1000.0
    stamp = bool(cmd.get("stamp"))
    fixed = delta_frame(size, b"x")
    loop = asyncio.get_running_loop()
    start = loop.time()
    for index in range(count):
        if stamp:
            text = str(time.time_ns()).encode()
            frame = delta_frame(size, text if index == 0 else b" " + text)
        else:
            frame = fixed
        broadcast(subscribers, frame, text=True)
        if period:
            await asyncio.sleep(max(0.0, start + (index + 1) * period - loop.time()))
        else:
            await asyncio.sleep(0)
    broadcast(subscribers, end_event(cmd["request_id"]), text=True)


async def handler(ws: ServerConnection) -> None:
    try:
        async for raw in ws:
            cmd = json.loads(raw)
            kind = cmd.get("cmd")
            if kind == "hello":
                await ws.send(filler(int(cmd.get("reply_size", 100))), text=True)
            elif kind == "subscribe":
                subscribers.add(ws)
                await ws.send(event("face.accepted", {"request_id": cmd["request_id"]}), text=True)
            elif kind == "broadcast":
                await run_broadcast(cmd)
                await ws.send(
                    event("face.result", {"request_id": cmd["request_id"], "status": "succeeded"}),
                    text=True,
                )
            elif kind == "send":
                for size in cmd["sizes"]:
                    await ws.send(delta_frame(int(size), b"x"), text=True)
                await ws.send(end_event(cmd["request_id"]), text=True)
            elif kind == "blast":
                for size in cmd["sizes"]:
                    broadcast([ws], delta_frame(int(size), b"x"), text=True)
                await ws.send(end_event(cmd["request_id"]), text=True)
    finally:
        subscribers.discard(ws)


async def main() -> None:
    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        sys.stdout.write(json.dumps({"url": f"ws://127.0.0.1:{port}/", "port": port}) + "\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
