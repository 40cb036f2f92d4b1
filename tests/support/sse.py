"""SSE in tests: an event parser, and an ASGI server's side of one HTTP call
in memory (to drive the HTTP door without sockets, on a fake clock)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from halfpi.gateway.asgi import AsgiGateway
from tests.support.wait import until

Message = dict[str, Any]


@dataclass
class Event:
    """One SSE event (or a block with no data: a comment, a retry, an id alone)."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None
    comments: list[str] = field(default_factory=list)

    @property
    def frame(self) -> dict[str, Any]:
        return json.loads(self.data)  # type: ignore[no-any-return]

    @property
    def payload(self) -> dict[str, Any]:
        return self.frame["payload"]  # type: ignore[no-any-return]


def parse_events(text: str) -> list[Event]:
    """Every complete block of ``text`` (as EventSource reads it; a block
    cut in the middle is not an event)."""
    out: list[Event] = []
    blocks = text.replace("\r\n", "\n").split("\n\n")
    for block in blocks[:-1]:
        ev = Event()
        for line in block.split("\n"):
            if line.startswith(":"):
                ev.comments.append(line[1:].strip())
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                ev.event = value
            elif name == "data":
                ev.data = value if not ev.data else ev.data + "\n" + value
            elif name == "id":
                ev.id = value
            elif name == "retry":
                ev.retry = int(value)
        out.append(ev)
    return out


def data_events(events: list[Event]) -> list[Event]:
    return [e for e in events if e.data]


class HttpPeer:
    """An ASGI server's side of one HTTP request, in memory. ``gate``
    holds ``http.response.body`` sends back, as a server whose buffer is
    full does (a reader that stopped reading)."""

    def __init__(self, method: str, path: str, *, query: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1", "method": method, "scheme": "http", "path": path,
            "raw_path": path.encode(), "root_path": "",
            "query_string": urlencode(query or {}).encode(),
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
        }
        self.body = body
        self.gone = asyncio.Event()
        self.sent: list[Message] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.task: asyncio.Task[None] | None = None
        self._asked = False

    async def receive(self) -> Message:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            await self.gate.wait()
        self.sent.append(message)

    def start(self, app: AsgiGateway) -> HttpPeer:
        self.task = asyncio.create_task(app(self.scope, self.receive, self.send))
        return self

    def disconnect(self) -> None:
        """The reader goes away."""
        self.gone.set()

    @property
    def status(self) -> int | None:
        for m in self.sent:
            if m["type"] == "http.response.start":
                return int(m["status"])
        return None

    @property
    def headers(self) -> dict[str, str]:
        for m in self.sent:
            if m["type"] == "http.response.start":
                return {k.decode(): v.decode() for k, v in m["headers"]}
        return {}

    @property
    def text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent
                        if m["type"] == "http.response.body").decode()

    @property
    def ended(self) -> bool:
        return any(m["type"] == "http.response.body" and not m.get("more_body", False)
                   for m in self.sent)

    def json(self) -> Any:
        return json.loads(self.text)

    def events(self) -> list[Event]:
        return parse_events(self.text)

    def frames(self) -> list[dict[str, Any]]:
        return [e.frame for e in data_events(self.events())]

    async def until(self, predicate: Callable[[HttpPeer], bool], timeout: float = 10.0) -> None:
        await until(lambda: predicate(self), timeout)

    async def answered(self, timeout: float = 10.0) -> HttpPeer:
        await until(lambda: self.status is not None, timeout)
        return self


# -- a real HTTP client (httpx + httpx-sse) ------------------------------------------------


@dataclass
class Reading:
    """What one SSE request got: its status, the events with data, the last
    id seen (what EventSource would send back), and how it ended."""

    status: int = 0
    events: list[Event] = field(default_factory=list)
    last_id: str | None = None
    error: str | None = None  # the transport's error when the stream was cut
    body: str = ""

    def frames(self) -> list[dict[str, Any]]:
        return [e.frame for e in self.events]


def chat_completed(request_id: str) -> Callable[[Reading], bool]:
    """A ``stop`` for :func:`read_sse`: the chat ``request_id`` completed
    (only the newest event is looked at: a stream is long)."""

    def check(reading: Reading) -> bool:
        f = reading.events[-1].frame
        return (f["type"] == "face.event" and f["payload"]["type"] == "chat.completed"
                and f["payload"]["data"].get("request_id") == request_id)

    return check


async def read_sse(url: str, *, headers: dict[str, str] | None = None,
                   params: dict[str, str] | None = None,
                   stop: Callable[[Reading], bool] | None = None,
                   timeout: float = 20.0, on_event: Callable[[Reading], None] | None = None,
                   ) -> Reading:
    """Read one SSE response with httpx-sse until ``stop`` holds, the
    server ends it, or the connection is cut (recorded in ``error``)."""
    import httpx
    from httpx_sse import aconnect_sse

    reading = Reading()

    async def run() -> None:
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0)) as client,
            aconnect_sse(client, "GET", url, headers=headers or {}, params=params or {}) as source,
        ):
            reading.status = source.response.status_code
            if reading.status != 200:
                await source.response.aread()
                reading.body = source.response.text
                return
            async for sse in source.aiter_sse():
                if sse.id:
                    reading.last_id = sse.id
                if not sse.data:
                    continue
                reading.events.append(Event(sse.event, sse.data, sse.id or None, sse.retry))
                if on_event is not None:
                    on_event(reading)
                if stop is not None and stop(reading):
                    return

    try:
        await asyncio.wait_for(run(), timeout)
    except (OSError, ConnectionError) as exc:
        reading.error = repr(exc)
    except Exception as exc:  # httpx's transport errors (a cut mid-stream)
        if type(exc).__module__.startswith(("httpx", "httpcore", "h11")):
            reading.error = repr(exc)
        else:
            raise
    return reading


class StalledReader:
    """An SSE reader that stops reading: a raw socket with a small receive
    buffer (so the Mind feels it at once), HTTP/1.1 parsed with h11."""

    def __init__(self, sock: Any, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        import h11

        self.sock = sock
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.CLIENT)
        self.status = 0
        self.body = bytearray()
        self.ended = False

    @classmethod
    async def open(cls, port: int, target: str, headers: dict[str, str],
                   rcvbuf: int = 4096) -> StalledReader:
        import socket

        import h11

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        # A small read limit: the stream reader must not drain the socket for us.
        reader, writer = await asyncio.open_connection(sock=sock, limit=rcvbuf)
        self = cls(sock, reader, writer)
        request = h11.Request(method="GET", target=target, headers=[
            ("Host", f"127.0.0.1:{port}"), *headers.items()])
        writer.write(self.conn.send(request) + self.conn.send(h11.EndOfMessage()))
        await writer.drain()
        return self

    async def read_until(self, predicate: Callable[[StalledReader], bool],
                         timeout: float = 10.0) -> None:
        """Read (a little at a time) until ``predicate`` holds or the response ends."""
        import h11

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self) and not self.ended:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(self.reader.read(4096), deadline - loop.time())
                self.conn.receive_data(data)
                if not data:
                    self.ended = True
            elif isinstance(event, h11.Response):
                self.status = event.status_code
            elif isinstance(event, h11.Data):
                self.body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                self.ended = True

    def events(self) -> list[Event]:
        return parse_events(self.body.decode())

    def frames(self) -> list[dict[str, Any]]:
        return [e.frame for e in data_events(self.events())]

    def close(self) -> None:
        self.writer.close()
