"""A fake OpenAI-compatible model server: real HTTP on 127.0.0.1, scripted per test.

It speaks the Chat Completions wire format the way servers do — ``POST
/v1/chat/completions`` answered with a ``text/event-stream`` of ``data:
{chunk}`` lines in HTTP/1.1 chunked encoding, ending with ``data: [DONE]``;
errors as ``{"error": {"message", "type", "code"}}`` with their status; ``GET
/v1/models`` — so the Mind's provider goes through the real ``openai`` SDK,
its HTTP client and its error mapping. Nothing of the SDK is mocked.

A test scripts the next answers (:meth:`FakeModel.script`), each a
:class:`Reply`: chunks, pauses, a gate to hold the first byte, a cut of the
connection mid-stream, or an error status. With nothing scripted the server
answers from the last user message, with the scripted agent's grammar
(docs/agent.md): the message echoed word by word, ``/pace MS TEXT``,
``/repeat N TEXT``, ``/stamp N`` (each chunk the wall clock in ns). So the
end-to-end suite runs its chats against a model as it does against the
scripted agent.

Every request is recorded (:attr:`FakeModel.requests`) with its JSON body,
so a test can check what the second request carried (the ``role: tool``
message and its ``tool_call_id``), and whether the client went away before
the answer ended (:attr:`Recorded.gone`: a cancel closed the stream).

Given an ``upstream`` (a real model server's ``http://host:port``) it
answers nothing itself: it records each request and passes it on, and the
answer back byte for byte — a recording proxy in front of a real model.

Run alone (``python -m tests.support.fake_openai``) it serves until killed
and prints ``{"port": N, "url": base_url}`` once it listens (the benchmark does this).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MODEL = "fake-model"


@dataclass
class Pause:
    seconds: float


@dataclass
class Gate:
    """Wait until the test sets :attr:`event` (the client may go away meanwhile)."""

    event: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Cut:
    """Close the connection here, without ending the response (a dropped stream)."""


Event = dict[str, Any] | Pause | Gate | Cut


@dataclass
class Reply:
    """One scripted answer: ``status`` 200 streams ``events`` (chunks as
    dicts, :class:`Pause`, :class:`Gate`, :class:`Cut`) then ``[DONE]``;
    another status answers ``{"error": …}`` at once. ``before`` holds the
    response's very first byte (a slow first byte)."""

    events: list[Event] = field(default_factory=list)
    status: int = 200
    message: str = ""
    code: str | None = None
    retry_after: float | None = None
    before: Gate | Pause | None = None
    # Compress the stream (``content-encoding: gzip``), each event flushed.
    gzip: bool = False


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    # The client closed the connection before the answer ended.
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    # The answer was written to its end (or cut, as scripted).
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])


# -- chunk builders --------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def text(*parts: str, finish: str | None = "stop") -> list[Event]:
    """A reply streaming ``parts`` one chunk each, then its finish chunk."""
    events: list[Event] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": p}) for p in parts]
    if finish is not None:
        events.append(chunk({}, finish))
    return events


def call(index: int, id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    """One tool-call fragment (``id``/``name`` only in the first, as OpenAI does)."""
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    fragment: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        fragment["id"] = id
        fragment["type"] = "function"
    return chunk({"tool_calls": [fragment]})


def tool_calls(*calls: tuple[str, str, str], pieces: int = 3) -> list[Event]:
    """A step that calls ``(id, name, arguments)`` tools, each call's
    arguments split into ``pieces`` fragments, the calls interleaved."""
    events: list[Event] = [chunk({"role": "assistant", "content": None})]
    splits = [_split(arguments, pieces) for _, _, arguments in calls]
    for index, (id, name, _) in enumerate(calls):
        events.append(call(index, id, name, ""))
    for piece in range(pieces):
        for index, parts in enumerate(splits):
            events.append(call(index, None, None, parts[piece]))
    events.append(chunk({}, "tool_calls"))
    return events


def usage(prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk of a stream asked ``include_usage``: no choices, a usage."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _split(text: str, pieces: int) -> list[str]:
    size = -(-len(text) // pieces) if text else 0
    return [text[i * size:(i + 1) * size] for i in range(pieces)]


# -- the server ----------------------------------------------------------------------------

_WORDS = re.compile(r"\s*\S+\s*$|\s*\S+")


class FakeModel:
    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.arrived = asyncio.Event()  # set on every request (clear it to wait for the next)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def start(self, port: int = 0) -> FakeModel:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> FakeModel:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_requests(self, n: int, timeout: float = 20.0) -> list[Recorded]:
        """Once ``n`` requests arrived: them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.requests) < n:
            self.arrived.clear()
            assert loop.time() < deadline, f"{len(self.requests)} requests, waited for {n}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), max(0.01, deadline - loop.time()))
        return self.requests

    # -- HTTP/1.1 ---------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while await self._request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.transport.abort()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        line, *lines = head.decode("latin-1").split("\r\n")
        method, path, _ = line.split(" ", 2)
        headers = {}
        for header in lines:
            if ":" in header:
                name, _, value = header.partition(":")
                headers[name.strip().lower()] = value.strip()
        size = int(headers.get("content-length") or 0)
        raw = await reader.readexactly(size) if size else b""
        if self.upstream is not None:
            if method == "POST":
                self.requests.append(Recorded(path, headers, json.loads(raw) if raw else {}))
                self.arrived.set()
            await _forward(self.upstream, head, raw, writer)
            return True
        if method == "GET" and path.endswith("/models"):
            body = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            await _json(writer, 200, body)
            return True
        body = json.loads(raw) if raw else {}
        record = Recorded(path, headers, body)
        self.requests.append(record)
        self.arrived.set()
        reply = self.replies.popleft() if self.replies else self._default(body)
        watcher = asyncio.create_task(_watch(reader, writer, record))
        try:
            return await self._answer(writer, reply, record)
        finally:
            watcher.cancel()
            record.answered.set()

    async def _answer(self, writer: asyncio.StreamWriter, reply: Reply, record: Recorded) -> bool:
        if reply.before is not None and not await _wait(reply.before, record):
            return False
        if reply.status != 200:
            error = {"message": reply.message, "type": "fake_error", "code": reply.code}
            extra = {} if reply.retry_after is None else {"retry-after": str(reply.retry_after)}
            await _json(writer, reply.status, {"error": error}, extra)
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + (b"content-encoding: gzip\r\n" if reply.gzip else b"")
            + b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        sse = _Gzipped().sse if reply.gzip else _sse
        for event in reply.events:
            if isinstance(event, Cut):
                await writer.drain()
                writer.transport.abort()
                return False
            if isinstance(event, Pause | Gate):
                await writer.drain()
                if not await _wait(event, record):
                    return False
                continue
            data = event.get("_stamp")
            if data is not None:  # a chunk whose content is the wall clock, at sending
                event = chunk({"content": f"{data}{time.time_ns()}"})
            writer.write(sse(json.dumps(event)))
            if writer.transport.get_write_buffer_size() > 65536:
                await writer.drain()
            if record.gone.is_set():
                return False
        writer.write(sse("[DONE]", end=True) + b"0\r\n\r\n")
        await writer.drain()
        return True

    def _default(self, body: dict[str, Any]) -> Reply:
        """No script: answer the last user message with the scripted grammar."""
        said = next(
            (str(m.get("content") or "") for m in reversed(body.get("messages") or [])
             if m.get("role") == "user"),
            "",
        )
        command, _, rest = said.partition(" ")
        events: list[Event] = [chunk({"role": "assistant", "content": ""})]
        pace = 0.0
        parts: Iterable[str]
        if command == "/repeat":
            count, _, what = rest.partition(" ")
            parts = (what if i == 0 else " " + what for i in range(int(count)))
        elif command == "/stamp":
            count, _, ms = rest.partition(" ")
            pace = float(ms or 0) / 1000
            parts = ()
            for i in range(int(count)):
                events.append({"_stamp": "" if i == 0 else " "})
                if pace:
                    events.append(Pause(pace))
        elif command == "/pace":
            ms, _, what = rest.partition(" ")
            pace = float(ms) / 1000
            parts = _WORDS.findall(what)
        else:
            parts = _WORDS.findall(said) or [said]
        produced = 0
        for part in parts:
            events.append(chunk({"content": part}))
            produced += 1
            if pace:
                events.append(Pause(pace))
        events.append(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages") or [])
            events.append(usage(prompt // 4 + 1, produced))
        return Reply(events)


async def _forward(upstream: str, head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
    """One request to ``upstream`` (asked to close after it: its answer ends
    with the connection) and its answer back, as it comes."""
    host, _, port = upstream.removeprefix("http://").partition(":")
    up_reader, up_writer = await asyncio.open_connection(host, int(port or 80))
    lines = [line for line in head.decode("latin-1").split("\r\n")
             if line and not line.lower().startswith("connection:")]
    up_writer.write(("\r\n".join([*lines, "connection: close"]) + "\r\n\r\n").encode() + body)
    try:
        while data := await up_reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        up_writer.close()


def _sse(data: str, end: bool = False) -> bytes:
    payload = f"data: {data}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class _Gzipped:
    """One gzip stream over the whole body, flushed after every event."""

    def __init__(self) -> None:
        self.zip = zlib.compressobj(wbits=31)

    def sse(self, data: str, end: bool = False) -> bytes:
        payload = self.zip.compress(f"data: {data}\n\n".encode())
        payload += self.zip.flush(zlib.Z_FINISH if end else zlib.Z_SYNC_FLUSH)
        return b"%x\r\n%s\r\n" % (len(payload), payload)


async def _json(
    writer: asyncio.StreamWriter, status: int, body: dict[str, Any],
    extra: dict[str, str] | None = None,
) -> None:
    raw = json.dumps(body).encode()
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            "content-type: application/json", f"content-length: {len(raw)}"]
    head += [f"{k}: {v}" for k, v in (extra or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + raw)
    await writer.drain()


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


async def _watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 record: Recorded) -> None:
    """The client sends nothing while it reads an answer: its connection
    ending means it left. Polled, so that no byte of a next request is taken."""
    while not (reader.at_eof() or writer.transport.is_closing()):
        await asyncio.sleep(0.005)
    record.gone.set()


async def _wait(what: Gate | Pause, record: Recorded) -> bool:
    """Wait for ``what``; False if the client left meanwhile."""
    waiter = asyncio.ensure_future(
        what.event.wait() if isinstance(what, Gate) else asyncio.sleep(what.seconds)
    )
    gone = asyncio.ensure_future(record.gone.wait())
    try:
        await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        gone.cancel()
    return not record.gone.is_set()


async def _serve(port: int) -> None:
    model = await FakeModel().start(port)
    sys.stdout.write(json.dumps({"port": model.port, "url": model.base_url}) + "\n")
    sys.stdout.flush()
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a fake OpenAI-compatible model server")
    parser.add_argument("--port", type=int, default=0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(parser.parse_args().port))
