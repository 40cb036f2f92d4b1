"""The Durable Streams read side (DESIGN §9, docs/protocol.md §20).

``GET /v1/conversations/{id}/stream?offset=…[&live=long-poll|sse]`` serves
one conversation's log as a Durable Streams JSON stream: each message is a
frame as the WebSocket frames it (``face.event``, ``face.chat.delta``, …),
and an offset is a cursor made sortable (``core/durable.py``).

Every read is a caller of the Mind API with one ``face.subscribe`` from the
offset's cursor: where it starts and what it replays (the journal, below
it the Store, or a reset) is the Mind's, as for a WebSocket or an SSE
stream; the reader's queue is the bounded one (I7); the Mind's maintenance
re-checks its credential (I8) and times its long-poll out (on the Mind's
clock). A reset — an offset of another epoch, past the head, or below
what the journal and the Store can replay — is the protocol's answer for
expired history: ``410 Gone``; the reader re-reads the snapshot
(``GET /v1/conversations/{id}``) and follows on from its ``cursor``.

- catch-up (no ``live``): what follows the offset, up to ``CHUNK_BYTES``;
  ``Stream-Up-To-Date`` once it reached the head.
- ``live=long-poll``: the same, but with nothing to give it waits up to
  ``LONG_POLL_S`` for the next event; ``204`` when nothing came.
- ``live=sse``: an :class:`~halfpi.gateway.http.sse_stream.SseStream`
  whose frames are framed as ``data`` (a JSON array) and ``control``
  events instead of one event per frame.

Writes stay with the Mind: there is no append, create, close or delete.
The route answers only ``GET``/``HEAD``/``OPTIONS``; any other method gets
``405 Method Not Allowed`` with ``Allow`` (PROTOCOL.md §5.2). A conversation
never closes: ``Stream-Closed`` is never sent.
"""

from __future__ import annotations

import asyncio
import random
import time
from functools import partial
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from halfpi.core import durable, wire
from halfpi.core.sse import POSITIONED, position_of, type_of
from halfpi.errors import (
    CloseCode,
    ErrorCode,
    HalfpiError,
    InvalidRequest,
    Unauthorized,
    Unavailable,
)
from halfpi.gateway.http import spec
from halfpi.gateway.http.door import Door, cors_headers, error_response, preflight
from halfpi.gateway.http.sse_stream import SseStream
from halfpi.mind import api
from halfpi.mind.connection import TIME_UP, Connection, Liveness

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.service import Mind

STREAM_PATH = "/v1/conversations/{conversation_id}/stream"
SUBSCRIBE_REQUEST_ID = "durable-read"
CHUNK_BYTES = 256 * 1024  # frames per catch-up answer (PROTOCOL.md §5.6: server-defined)
LONG_POLL_S = 20.0  # how long a long-poll waits for the next event (Mind's clock)
EXPOSED = "Stream-Next-Offset, Stream-Up-To-Date, Stream-Cursor, ETag"
# The frames that are the log: each at its seq (its cursor is the offset after it).
# Anything else a subscription carries (news of the Mind's, face.evicted) is not.
LOGGED = POSITIONED - {"face.snapshot", "face.reset"}


class _Heads(msgspec.Struct):
    heads: dict[str, str] = {}


class _Accepted(msgspec.Struct):
    payload: _Heads


class _Reason(msgspec.Struct):
    reason: str = "cursor_expired"


class _Reset(msgspec.Struct):
    payload: _Reason


_decode_accepted = msgspec.json.Decoder(_Accepted).decode
_decode_reset = msgspec.json.Decoder(_Reset).decode


def routes(door: Door) -> list[BaseRoute]:
    return [Route(STREAM_PATH, partial(stream, door), methods=["GET", "HEAD", "OPTIONS"])]


# -- the OpenAPI description ------------------------------------------------------------

_CONVERSATION = spec.Parameter("conversation_id", "path", {"type": "string"}, required=True)


def describe() -> list[spec.Operation]:
    return [
        spec.Operation(
            method="get", path=STREAM_PATH, operation_id="get_v1_conversation_stream",
            summary="One conversation's log as a Durable Streams JSON stream", tag="streams",
            description=(
                "Durable Streams read side (docs/protocol.md §20). Offsets: -1, now, or a "
                "Stream-Next-Offset. 410 Gone: the offset is expired history (another epoch, "
                "past the head, or below what can be replayed): re-read "
                "GET /v1/conversations/{conversation_id} and follow on from its cursor. "
                "Read-only: other methods get 405."
            ),
            parameters=(
                _CONVERSATION,
                spec.Parameter("offset", "query", {"type": "string", "maxLength": 64},
                               description="-1 (the start), now (the tail) or an offset"),
                spec.Parameter("live", "query", {"enum": ["long-poll", "sse"]},
                               description="wait for what comes next"),
                spec.Parameter("cursor", "query", {"type": "string", "maxLength": 20},
                               description="the last Stream-Cursor (CDN collapsing)"),
                spec.Parameter("detail", "query", {"enum": ["summary", "transparent"]},
                               description="the detail mode (default: the profile's)"),
            ),
            responses={
                200: spec.Body({"type": "array"}, "the frames after the offset"),
                204: spec.Body({}, "long-poll: nothing came before the timeout", ""),
            },
            errors=frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.CONVERSATION_NOT_FOUND}),
        ),
        spec.Operation(
            method="options", path=STREAM_PATH, operation_id="options_v1_conversation_stream",
            summary="A browser's CORS preflight (an allowed Origin only)", tag="streams",
            parameters=(_CONVERSATION,), public=True,
            responses={204: spec.Body({}, "allowed: Access-Control-Allow-* headers", "")},
            errors=frozenset({ErrorCode.FORBIDDEN}),
        ),
    ]


# -- one read ------------------------------------------------------------------------------


class DurableRead:
    """A catch-up or long-poll read: the framing of a connection that
    gathers the log's frames into one answer (its one ``face.subscribe``
    fills it; its bounded queue, revocation (I8) and the long-poll's end
    are the connection's)."""

    kind = "durable"

    def __init__(self, mind: Mind, credential: Credential, conversation_id: str,
                 wait_s: float | None) -> None:
        self.mind = mind
        self.credential = credential
        self.conversation_id = conversation_id
        self.wait_s = wait_s
        self.frames: list[bytes] = []
        self.size = 0
        self.last: str | None = None  # the offset after the last frame gathered
        self.head: str | None = None  # the log's head when the read began
        self.reset: str | None = None  # a reset's reason: 410
        self.refusal: HalfpiError | None = None
        self.up_to_date = False
        self.gone = False  # the reader went away before the answer
        self.done = asyncio.Event()
        self._conn: Connection | None = None
        self._settling = False

    def open(self) -> Connection:
        """The read's connection (:class:`RateLimited` when the cap is full)."""
        self._conn = self.mind.connect(
            self.credential, self, Liveness(lifetime_s=self.wait_s, evicts=False)
        )
        return self._conn

    # -- the Framing ---------------------------------------------------------------

    @property
    def budget(self) -> int:
        return max(CHUNK_BYTES - self.size, 1)

    def write(self, frames: list[bytes]) -> None:
        for frame in frames:
            self._gather(frame)
        if not self._settling:
            # Decided once what was sent this turn is in (a subscribe's
            # face.accepted comes before its replay is installed).
            self._settling = True
            asyncio.get_running_loop().call_soon(self._settle)

    def _settle(self) -> None:
        self._settling = False
        conn = self._conn
        if conn is None or conn.closed:
            return
        caught_up = conn.caught_up
        if self.reset is not None:
            conn.close(CloseCode.NORMAL, "reset")
        elif (self.frames and (caught_up or self.size >= CHUNK_BYTES)) or (
            caught_up and self.wait_s is None
        ):
            self.up_to_date = caught_up
            conn.close(CloseCode.NORMAL, "answered")

    def ping(self) -> None:
        """A read is answered within its lifetime: nothing to keep alive."""

    def close(self, code: int, reason: str) -> None:
        """The read ends: answered, its long-poll's time up (it is at the
        head), over its bounds (answered with what it gathered; the reader
        asks again from its Stream-Next-Offset), revoked (401) or drained
        (503, without its frames)."""
        if code == CloseCode.REVOKED:
            self.refusal = Unauthorized("unknown or revoked token")
        elif code == CloseCode.RESTARTING:
            self.refusal = Unavailable("the Mind is restarting; retry shortly")
        elif code == CloseCode.NORMAL and reason == TIME_UP:
            self.up_to_date = True  # nothing came: the reader is at the head
        self.done.set()

    def finish(self) -> None:
        """The reader's answer is made (or it went away): the read ends."""
        if self._conn is not None:
            self._conn.gone()
        self.done.set()

    def _gather(self, frame: bytes) -> None:
        type_ = type_of(frame)
        if type_ == "face.accepted":
            head = _decode_accepted(frame).payload.heads.get(self.conversation_id)
            if head is not None:
                self.head = durable.offset_of_text(head)
            return
        if type_ == "face.reset":
            self.reset = _decode_reset(frame).payload.reason
            return
        position = position_of(frame, type_) if type_ in LOGGED else None
        if position is None:
            return  # not at a place in the log (news of the Mind's): no offset to give
        self.last = durable.offset_of_text(position[1])
        self.frames.append(frame)
        self.size += len(frame)

    def next_offset(self, asked: str | None) -> str:
        """Where the reader goes on from: after the last frame; at the head
        when it caught up (frames a detail mode does not show are passed)."""
        offset = self.last
        if self.up_to_date:
            offset = durable.later(offset, self.head)
        offset = durable.later(offset, asked)
        assert offset is not None
        return offset


class DurableSseStream(SseStream):
    """``live=sse``: the same stream as ``/events``, framed as Durable
    Streams ``data`` and ``control`` events (PROTOCOL.md §5.8)."""

    def __init__(self, mind: Mind, credential: Credential, conversation_id: str,
                 offset: str | None, client_cursor: str | None) -> None:
        super().__init__(mind, credential, (conversation_id,), {}, None)
        self.kind = "durable_sse"
        self.conversation_id = conversation_id
        self.offset = offset
        self.client_cursor = client_cursor
        self.reset_reason: str | None = None

    def encode(self, frames: list[bytes]) -> bytes:
        if self.reset_reason is not None:
            return b""  # what follows a reset is past a gap: never shown as data
        data: list[bytes] = []
        for frame in frames:
            type_ = type_of(frame)
            if type_ == "face.accepted":
                head = _decode_accepted(frame).payload.heads.get(self.conversation_id)
                if self.offset is None and head is not None:  # offset=now
                    self.offset = durable.offset_of_text(head)
                continue
            if type_ == "face.reset":
                # Expired history: the stream ends; the reader comes back
                # from its offset and is answered 410 (at open: 410 at once).
                self.reset_reason = _decode_reset(frame).payload.reason
                self.loop.call_soon(self.conn.close, CloseCode.NORMAL, "offset expired")
                break
            position = position_of(frame, type_) if type_ in LOGGED else None
            if position is None:
                continue
            self.offset = durable.offset_of_text(position[1])
            data.append(frame)
        if not data or self.offset is None:
            return b""
        return durable.data_event(data) + self.control()

    def control(self) -> bytes:
        assert self.offset is not None
        caught_up = self._conn is None or self._conn.caught_up
        cursor = durable.stream_cursor(time.time(), self.client_cursor, _jitter())
        return durable.control_event(self.offset, cursor, caught_up)


def _jitter() -> int:
    return random.randint(1, 3600)  # PROTOCOL.md §10.1: not a secret


# -- the route -------------------------------------------------------------------------------


async def stream(door: Door, request: Request) -> Response:
    if request.method == "OPTIONS":
        return preflight(door, request, "GET, HEAD")
    try:
        response = await _read(door, request)
    except HalfpiError as exc:
        response = error_response(exc)
    response.headers.update(cors_headers(request))
    if request.headers.get("origin"):
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


async def _read(door: Door, request: Request) -> Response:
    cid = request.path_params["conversation_id"]
    if len(cid) > 128:
        raise InvalidRequest("a conversation id has at most 128 characters",
                             field="conversation_id")
    query = request.query_params
    live = query.get("live")
    if live not in (None, "long-poll", "sse"):
        raise InvalidRequest("live is long-poll or sse", field="live")
    offset = query.get("offset")
    if offset is None and live is not None:
        raise InvalidRequest("a live read needs an offset (PROTOCOL.md §5.7)", field="offset")
    offset = offset or durable.START
    if request.method == "HEAD":
        offset, live = durable.NOW, None
    detail = query.get("detail")
    if detail is not None and detail not in ("summary", "transparent"):
        raise InvalidRequest("detail is summary or transparent", field="detail")
    since = None if offset == durable.NOW else offset
    # The offset asked for, in the one form offsets are given in (a
    # snapshot's cursor is accepted too); malformed: 400 before anything else.
    asked = (None if since in (None, durable.START)
             else durable.offset_of(durable.cursor_of(since)))
    credential = await door.credential(request)
    api.authorize(credential.scopes, "face.subscribe")
    mind = door.mind()
    if since == durable.START:
        since_cursor: str | None = await api.start_cursor(mind, cid)
    else:
        since_cursor = None if since is None else durable.cursor_of(since).encode()
    subscribe = wire.Subscribe(
        request_id=SUBSCRIBE_REQUEST_ID,
        conversation_ids=[cid],
        since={cid: since_cursor} if since_cursor is not None else None,
        detail_mode=detail,  # type: ignore[arg-type]  # checked: summary | transparent | None
    )
    if live == "sse":
        return await _sse(mind, credential, cid, asked, query.get("cursor"), subscribe)
    read = DurableRead(mind, credential, cid, LONG_POLL_S if live else None)
    conn = read.open()
    try:
        await api.handle(mind, conn, "face.subscribe", subscribe)
        await _until_done_or_gone(read, request)
    finally:
        read.finish()
    if read.gone:
        return Response(status_code=204)  # nobody reads it
    if read.refusal is not None:
        raise read.refusal
    if read.reset is not None:
        return _gone(cid, read.reset)
    next_offset = read.next_offset(asked)
    headers = {"Stream-Next-Offset": next_offset, "Cache-Control": "no-store"}
    if read.up_to_date:
        headers["Stream-Up-To-Date"] = "true"
    if live:
        headers["Stream-Cursor"] = durable.stream_cursor(time.time(), query.get("cursor"),
                                                         _jitter())
        if not read.frames:
            return Response(status_code=204, headers=headers)
    elif offset != durable.NOW:
        etag = f'"{cid}:{offset}:{next_offset}"'
        headers["ETag"] = etag
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
    if request.method == "HEAD":
        return Response(status_code=200, headers=headers, media_type="application/json")
    return Response(durable.json_array(read.frames), headers=headers,
                    media_type="application/json")


async def _until_done_or_gone(read: DurableRead, request: Request) -> None:
    """Wait for the read to end, or for its reader to go away (a long-poll
    then frees its connection at once, not at its timeout)."""
    if read.done.is_set():
        return
    done = asyncio.ensure_future(read.done.wait())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        done.cancel()
        gone.cancel()
    read.gone = not read.done.is_set()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(mind: Mind, credential: Credential, cid: str, asked: str | None,
               client_cursor: str | None, subscribe: wire.Subscribe) -> Response:
    stream = DurableSseStream(mind, credential, cid, asked, client_cursor)
    conn = stream.open()
    try:
        await api.handle(mind, conn, "face.subscribe", subscribe)
    except BaseException:
        conn.gone()
        raise
    if stream.reset_reason is not None:
        conn.close(CloseCode.NORMAL, "offset expired")
        return _gone(cid, stream.reset_reason)
    if conn.caught_up:
        assert stream.offset is not None  # the subscribe's face.accepted named the head
        stream.response.write(stream.control())  # caught up at once: say so
    stream.response.add_headers({"Cache-Control": "no-store"})
    return stream.response


def _gone(cid: str, reason: str) -> Response:
    """Expired history (PROTOCOL.md §5.6): the offset cannot be replayed;
    the reader re-reads the snapshot and follows on from its cursor."""
    body = {"error": {
        "code": reason,
        "message": "this offset can no longer be replayed: re-read the snapshot "
                   f"(GET /v1/conversations/{cid}) and follow on from its cursor",
        "snapshot": f"/v1/conversations/{cid}",
    }}
    return JSONResponse(body, status_code=410, headers={"Cache-Control": "no-store"})
