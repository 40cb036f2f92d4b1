"""The load generator's side: a lean WebSocket client and Face helpers.

:class:`WsClient` is an ``asyncio.Protocol`` with a minimal RFC 6455 frame
parser. A load generator that shares two cores with the server must not be
the bottleneck, so delta frames are counted by their byte prefix and never
JSON-decoded (a coalesced delta, recognised by its ``first_seq`` field, is
the one exception); every other frame is decoded and kept for
:meth:`WsClient.expect`. With ``decode_all`` every frame is decoded with
``json.loads``, as a real Face must (the resume benchmark reports both).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

# Every delta frame, from the Mind and from the raw baseline, starts so.
DELTA_PREFIX = b'{"type":"face.chat.delta","payload":{"event_seq":'
_FIRST_SEQ = b'"first_seq":'
_TEXT = b'"text":"'
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_ids = itertools.count(1)


def rid(prefix: str = "r") -> str:
    return f"{prefix}-{next(_ids)}"


# -- a lean WebSocket client ----------------------------------------------------


def client_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """One masked, unfragmented client frame (RFC 6455 §5.2-5.3)."""
    n = len(payload)
    if n < 126:
        header = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        header = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    key = os.urandom(4)
    if not n:
        return header + key
    mask = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return header + key + (int.from_bytes(payload, "big") ^ mask).to_bytes(n, "big")


class WsClient(asyncio.Protocol):
    """One client connection. Delta frames update counters; every other text
    frame is decoded and kept in ``messages`` for :meth:`expect`."""

    def __init__(self, host: str, port: int, path: str) -> None:
        loop = asyncio.get_running_loop()
        self.host, self.port, self.path = host, port, path
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.upgraded = False
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._key = base64.b64encode(os.urandom(16))
        self.messages: list[dict[str, Any]] = []
        self._waiters: list[tuple[Callable[[dict[str, Any]], bool], asyncio.Future[Any]]] = []
        self.latencies: list[int] | None = None  # set to a list to parse /stamp deltas
        self.raw_sizes: list[int] | None = None  # set to a list to record every frame size
        # > 0: after each read, stop reading for this long (seconds) so that
        # one recv() carries several frames; a throughput knob, never used
        # when measuring latency.
        self.read_pause = 0.0
        self.decode_all = False  # json.loads every frame, deltas included
        self._loop = loop
        self.reset_counters()

    def reset_counters(self) -> None:
        self.events = 0  # delta events (a coalesced frame counts seq - first_seq + 1)
        self.frames = 0  # delta frames
        self.delta_bytes = 0
        self.coalesced = 0
        self.first_ns = 0  # arrival of the first / last delta
        self.last_ns = 0

    @classmethod
    async def connect(cls, url: str) -> WsClient:
        rest = url.split("://", 1)[1]
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.rpartition(":")
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(
            lambda: cls(host, int(port), "/" + path), host, int(port)
        )
        await asyncio.wait_for(client.opened, 30)
        return client

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(
            b"GET "
            + self.path.encode()
            + b" HTTP/1.1\r\nHost: "
            + f"{self.host}:{self.port}".encode()
            + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "
            + self._key
            + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"closed before upgrade: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(ConnectionError("connection closed"))
        self._waiters.clear()

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        buf = self.buf
        buf += data
        if not self.upgraded and not self._upgrade():
            return
        n = len(buf)
        pos = 0
        if not self.decode_all and self.latencies is None and self.raw_sizes is None:
            pos = self._count_deltas(buf, n, now)
        while n - pos >= 2:
            b0 = buf[pos]
            length = buf[pos + 1] & 0x7F
            start = pos + 2
            if length == 126:
                if n - pos < 4:
                    break
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                start = pos + 4
            elif length == 127:
                if n - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                start = pos + 10
            end = start + length
            if end > n:
                break
            opcode = b0 & 0x0F
            if opcode == 0x1 or opcode == 0x2:
                if not b0 & 0x80:
                    raise RuntimeError("fragmented frames are not expected here")
                self._text(buf, start, end, now)
            elif opcode == 0x9 and self.transport is not None:  # ping → pong
                self.transport.write(client_frame(bytes(buf[start:end]), 0xA))
            elif opcode == 0x8 and self.transport is not None:  # close
                self.transport.close()
            pos = end
        if pos:
            del buf[:pos]
        if self.read_pause and self.transport is not None:
            self.transport.pause_reading()
            self._loop.call_later(self.read_pause, self._resume)

    def _count_deltas(self, buf: bytearray, n: int, now: int) -> int:
        """The load generator's hot path: walk small unmasked text frames,
        counting plain deltas by their prefix without a call per frame; stop
        at the first frame that is anything else (the general loop takes it
        from there). Returns the position reached."""
        if buf.find(_FIRST_SEQ) >= 0:  # a coalesced delta: the general loop decodes it
            return 0
        pos = count = size = 0
        prefix = DELTA_PREFIX
        while n - pos >= 2:
            length = buf[pos + 1]
            if buf[pos] != 0x81 or length >= 126:
                break
            end = pos + 2 + length
            if end > n or not buf.startswith(prefix, pos + 2):
                break
            count += 1
            size += length
            pos = end
        if count:
            self.events += count
            self.frames += count
            self.delta_bytes += size
            if not self.first_ns:
                self.first_ns = now
            self.last_ns = now
        return pos

    def _resume(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def _upgrade(self) -> bool:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(buf[:end]).decode("latin-1")
        del buf[: end + 4]
        accept = base64.b64encode(hashlib.sha1(self._key + _WS_GUID).digest()).decode()
        if " 101 " not in head.split("\r\n", 1)[0] or accept not in head:
            self.opened.set_exception(ConnectionError(f"upgrade refused: {head[:200]}"))
            if self.transport is not None:
                self.transport.close()
            return False
        self.upgraded = True
        self.opened.set_result(None)
        return True

    def _text(self, buf: bytearray, start: int, end: int, now: int) -> None:
        if self.raw_sizes is not None:
            self.raw_sizes.append(end - start)
        if self.decode_all:
            decoded = json.loads(bytes(buf[start:end]))
            if decoded["type"] == "face.chat.delta":
                p = decoded["payload"]
                events = p["seq"] - p["first_seq"] + 1 if "first_seq" in p else 1
                self.events += events
                self.frames += 1
                self.delta_bytes += end - start
                if not self.first_ns:
                    self.first_ns = now
                self.last_ns = now
                return
            decoded["_at"] = now
            self._deliver(decoded)
            return
        if buf.startswith(DELTA_PREFIX, start, end):
            events = 1
            if buf.find(_FIRST_SEQ, start, end) >= 0:  # a coalesced delta (lossless)
                p = _decode(bytes(buf[start:end]))["payload"]
                events = p["seq"] - p["first_seq"] + 1
                self.coalesced += 1
            self.events += events
            self.frames += 1
            self.delta_bytes += end - start
            if not self.first_ns:
                self.first_ns = now
            self.last_ns = now
            if self.latencies is not None:
                i = buf.find(_TEXT, start, end) + len(_TEXT)
                j = buf.find(b'"', i, end)
                append = self.latencies.append
                for stamp in bytes(buf[i:j]).split():
                    append(now - int(stamp))
            return
        message = _decode(bytes(buf[start:end]))
        message["_at"] = now
        self._deliver(message)

    def _deliver(self, message: dict[str, Any]) -> None:
        waiters = self._waiters
        for index, (predicate, fut) in enumerate(waiters):
            if not fut.done() and predicate(message):
                del waiters[index]
                fut.set_result(message)
                return
        self.messages.append(message)

    # sending and waiting

    def send_json(self, obj: Any) -> None:
        assert self.transport is not None
        self.transport.write(client_frame(_encode(obj)))

    def send(self, type_: str, payload: dict[str, Any]) -> None:
        self.send_json({"type": type_, "payload": payload})

    async def expect(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0
    ) -> dict[str, Any]:
        for index, message in enumerate(self.messages):
            if predicate(message):
                del self.messages[index]
                return message
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, fut))
        return await asyncio.wait_for(fut, timeout)

    def close(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(client_frame((1000).to_bytes(2, "big"), 0x8))
            transport.close()


# -- Face protocol helpers --------------------------------------------------------

HELLO_CLIENT = {"name": "halfpi-bench", "version": "1"}


def is_reply(request_id: str, *types: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["type"] in types and m["payload"].get("request_id") == request_id


CHAT_ENDS = frozenset({"chat.completed", "chat.failed", "chat.cancelled", "chat.interrupted"})


def is_chat_end(request_id: str) -> Callable[[dict[str, Any]], bool]:
    """Any end of the chat: a round that ended otherwise than completed is
    refused by whoever checks its ``face.result`` (a cluster node that lost
    its lease ends the chat ``interrupted``; waiting for ``completed`` then
    held every load process until its timeout)."""
    def predicate(m: dict[str, Any]) -> bool:
        p = m["payload"]
        return (
            m["type"] == "face.event"
            and p.get("type") in CHAT_ENDS
            and p["data"].get("request_id") == request_id
        )

    return predicate


async def face(url: str, token: str) -> WsClient:
    """A connected Face that completed face.hello."""
    client = await WsClient.connect(url)
    client.send("face.hello", {"token": token, "client": HELLO_CLIENT, "protocol": 3})
    await client.expect(lambda m: m["type"] in ("face.welcome", "face.error"))
    return client


async def many(factory: Callable[[], Any], count: int, batch: int = 100) -> list[Any]:
    """Open ``count`` connections, ``batch`` at a time."""
    out: list[Any] = []
    while len(out) < count:
        k = min(batch, count - len(out))
        out.extend(await asyncio.gather(*(factory() for _ in range(k))))
    return out


async def create_conversation(client: WsClient, name: str = "bench") -> str:
    request_id = rid("create")
    client.send("face.conversation.create", {"request_id": request_id, "name": name})
    result = await client.expect(is_reply(request_id, "face.result", "face.error"))
    if result["type"] != "face.result":
        raise RuntimeError(f"create failed: {result}")
    return str(result["payload"]["data"]["conversation_id"])


async def subscribe(
    client: WsClient, conversation_id: str, since: str | None = None
) -> dict[str, Any]:
    request_id = rid("sub")
    payload: dict[str, Any] = {"request_id": request_id, "conversation_ids": [conversation_id]}
    if since is not None:
        payload["since"] = {conversation_id: since}
    client.send("face.subscribe", payload)
    reply = await client.expect(is_reply(request_id, "face.accepted", "face.error"))
    if reply["type"] != "face.accepted":
        raise RuntimeError(f"subscribe failed: {reply}")
    return reply


def chat(client: WsClient, conversation_id: str, content: str) -> str:
    request_id = rid("chat")
    client.send(
        "face.chat",
        {"request_id": request_id, "conversation_id": conversation_id, "content": content},
    )
    return request_id


async def chat_to_end(
    client: WsClient, conversation_id: str, content: str, timeout: float = 120.0
) -> dict[str, Any]:
    request_id = chat(client, conversation_id, content)
    result = await client.expect(is_reply(request_id, "face.result", "face.error"), timeout)
    if result["type"] != "face.result" or result["payload"]["status"] != "succeeded":
        raise RuntimeError(f"chat failed: {result}")
    return result


async def close_all(clients: Iterable[WsClient], timeout: float = 5.0) -> None:
    """Close and wait until the transports are gone (the loop must run for that)."""
    clients = list(clients)
    for client in clients:
        client.close()
    if clients:
        await asyncio.wait([asyncio.ensure_future(c.closed) for c in clients], timeout=timeout)
