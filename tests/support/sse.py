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
