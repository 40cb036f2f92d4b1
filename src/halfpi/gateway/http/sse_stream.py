"""One SSE stream (DESIGN §9, I7, I8; docs/protocol.md §17): its framing,
and the ASGI response that carries it.

:class:`SseStream` is the :class:`~halfpi.mind.connection.Framing` of an
SSE stream's :class:`~halfpi.mind.connection.Connection`: the connection is
the Mind's (the principal bound when the stream was authorised, the
bounded queue where deltas coalesce and overflow evicts, the
subscriptions its one ``face.subscribe`` made, liveness, revocation and
drain); the stream adds the encoding: every frame becomes an event whose
``id:`` is the resume token of the whole stream as far as that event
(``core/sse.py``), so the reader resumes exactly wherever it stopped.

:class:`SseResponse` is the ASGI side, as ``AsgiConnection`` is for a
WebSocket: a buffer drained by the ASGI call's own task, and the pressure
signal of I7 — a send that does not complete at once (the server holds
writes back), or a buffer over ``HIGH_WATER``, pauses the stream; its
queue then coalesces, and evicts when even that is not enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import deque
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from halfpi.core.sse import (
    POSITIONED,
    Grant,
    Sealer,
    event_bytes,
    ping_bytes,
    position_of,
    retry_bytes,
    type_of,
)
from halfpi.mind.connection import FLUSH_BUDGET, Connection

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.sse")

RETRY_MS = 2000  # EventSource's wait before it reconnects (the stream's first block)
# The pressure marks and the close timeout of the WebSocket transports
# (gateway/native.py: the native server imports the door, so not from there).
HIGH_WATER = 128 * 1024
LOW_WATER = 32 * 1024
CLOSE_TIMEOUT_S = 10.0
# The scope extension under which our own HTTP server (gateway/bounded_http.py)
# gives a request a way to write body chunks straight to the socket: an
# object whose ``write(data) -> bool`` declines when it cannot.
BODY_WRITER = "halfpi.body_writer"


class SseStream:
    """One SSE stream's framing: frames become events whose ``id:`` is the
    resume token of the stream as far as that event; its keep-alive is a
    ``: ping`` comment (renewing a grant); its end a ``: closed`` comment.
    The stream's life — queue, replay, liveness, revocation, the cap — is
    its connection's (:attr:`conn`, made by :meth:`open`)."""

    kind = "sse"
    budget = FLUSH_BUDGET

    def __init__(
        self,
        mind: Mind,
        credential: Credential,
        conversations: tuple[str, ...],
        cursors: dict[str, str],
        grant: Grant | None,
        heartbeat_event: bool = False,
    ) -> None:
        self.mind = mind
        self.credential = credential
        self.heartbeat_event = heartbeat_event  # ?heartbeat=event
        self.loop = asyncio.get_running_loop()
        self.conversations = conversations
        # Where the reader stands in each conversation, as far as what was
        # written to it: the id: of the next event.
        self.cursors = dict(cursors)
        self.grant = grant
        self._token: str | None = None
        self._sealer = Sealer(mind.tickets.key, credential.principal_id, conversations)
        self.response = SseResponse(self)
        self._conn: Connection | None = None

    def open(self) -> Connection:
        """The stream's connection, welcomed and counted against its
        principal's cap (:class:`RateLimited` when it is full)."""
        self._conn = self.mind.connect(self.credential, self, self.mind.liveness("stream"))
        return self._conn

    @property
    def conn(self) -> Connection:
        assert self._conn is not None, "open() first"
        return self._conn

    @property
    def closed(self) -> bool:
        return self._conn is None or self._conn.closed

    # -- the resume token ----------------------------------------------------------

    @property
    def token(self) -> str:
        token = self._token
        if token is None:
            token = self._token = self._sealer.seal(self.cursors, self.grant)
        return token

    def encode(self, frames: list[bytes]) -> bytes:
        """``frames`` as events, each with the token of the stream after it.
        A door that carries another protocol over the same stream frames it
        its own way (``durable.py``: Durable Streams events; ``agui.py``)."""
        if len(self.conversations) == 1:
            return self._encode_one(frames)
        return self.encode_each(frames)

    def encode_each(self, frames: list[bytes]) -> bytes:
        """:meth:`encode`, each frame's position read and its token sealed
        on its own (any stream; the reference for :meth:`_encode_one`)."""
        cursors = self.cursors
        out = []
        for frame in frames:
            type_ = type_of(frame)
            if type_ in POSITIONED:
                position = position_of(frame, type_)
                if position is not None:
                    cid, cursor = position
                    if cid in cursors or cid in self.conversations:
                        if cursors.get(cid) != cursor:
                            cursors[cid] = cursor
                            self._token = None
            elif type_ == "face.evicted":
                # Its id: is the token of exactly the cursors it names.
                cursors.update(_decode_evicted(frame).payload.cursors)
                self._token = None
            out.append(event_bytes(frame, type_, self.token))
        return b"".join(out)

    def _encode_one(self, frames: list[bytes]) -> bytes:
        """:meth:`encode_each` for a stream of one conversation, in bytes:
        its token is the cursor, then the sealed part made once per grant,
        so an event costs a few slices (a replay of thousands of events is
        one pass). Snapshots, resets and evictions take the general path."""
        cid = self.conversations[0]
        cid_b = cid.encode()
        suffix = self._sealer.suffix(self.grant).encode()
        known = self.cursors.get(cid)
        cursor = b"" if known is None else known.encode()
        token = cursor + suffix
        out: list[bytes] = []
        append = out.append
        for frame in frames:
            head = _HEAD.match(frame)
            if head is not None:  # an event, a delta, progress: at its own place
                type_b, at, moved = head.groups()
                if moved != cursor and at == cid_b:
                    cursor = moved
                    token = cursor + suffix
            else:
                type_b = frame[_TYPE_AT : frame.index(b'"', _TYPE_AT)]
                if type_b in _REPLACING or type_b in _MOVING:  # a snapshot, a reset, …
                    if cursor:
                        self.cursors[cid] = cursor.decode()
                    self._token = None
                    append(self.encode_each([frame]))
                    known = self.cursors.get(cid)
                    cursor = b"" if known is None else known.encode()
                    token = cursor + suffix
                    continue
            append(b"event: %b\ndata: %b\nid: %b\n\n" % (type_b, frame, token))
        if cursor:
            text = cursor.decode()
            if self.cursors.get(cid) != text:
                self.cursors[cid] = text
                self._token = None
        return b"".join(out)

    # -- the Framing -----------------------------------------------------------------

    def write(self, frames: list[bytes]) -> None:
        self.response.write(self.encode(frames))

    def ping(self) -> None:
        """A ``: ping`` every heartbeat (renewing a grant in its ``id:`` when
        half its time has gone)."""
        interval = self.mind.config.heartbeat_s if self.heartbeat_event else None
        self.response.write(ping_bytes(self._renewed(), interval))

    def close(self, code: int, reason: str) -> None:
        """End the response after what was written (revocation, drain, eviction)."""
        self.response.write(b": closed %d %b\n\n" % (code, reason.encode()))
        self.response.finish()

    def _renewed(self) -> str | None:
        """A fresh token when the grant is half spent (None: nothing to renew)."""
        grant = self.grant
        tickets = self.mind.tickets
        if grant is None:
            return None
        fresh = tickets.grant(grant.principal_id, grant.detail_mode)
        if fresh.expires_at - grant.expires_at < tickets.grant_ttl_s / 2:
            return None
        self.grant = fresh
        self._token = None
        return self.token

    # -- the response's side ---------------------------------------------------------

    def pause_writing(self) -> None:
        if self._conn is not None:
            self._conn.pause(self.mind.now())

    def resume_writing(self) -> None:
        if self._conn is not None:
            self._conn.resume()

    def on_closed(self) -> None:
        """The reader is gone (or the response ended)."""
        if self._conn is not None:
            self._conn.gone()


# Frame types (as the frame spells them) whose position is their own
# conversation_id and cursor, read where they stand; and those that set
# the position another way (a snapshot's cursor, an eviction's cursors).
_TYPE_AT = len(b'{"type":"')
_CID = b'"conversation_id":"'
_CURSOR = b'"cursor":"'
_MOVING = frozenset(t.encode() for t in POSITIONED - {"face.snapshot", "face.reset"})
# How the Mind frames those: type, event_seq, conversation_id, seq, cursor
# first (ids and cursors need no escaping), read in one match.
_HEAD = re.compile(
    rb'\{"type":"(%b)","payload":\{"event_seq":\d+,"conversation_id":"([^"\\]*)",'
    rb'"seq":\d+,"cursor":"([^"\\]*)"' % b"|".join(re.escape(t) for t in sorted(_MOVING))
)
_REPLACING = frozenset({b"face.snapshot", b"face.reset", b"face.evicted"})


class _Cursors(msgspec.Struct):
    cursors: dict[str, str] = {}


class _Evicted(msgspec.Struct):
    payload: _Cursors


_decode_evicted = msgspec.json.Decoder(_Evicted).decode


class SseResponse(Response):
    """The ASGI side of a stream: its headers, then its events as they come."""

    media_type = "text/event-stream"

    def __init__(self, stream: SseStream) -> None:
        self.stream = stream
        self.status_code = 200
        self.background = None
        self.body = b""
        # No content-length: the body is a stream.
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        first = retry_bytes(RETRY_MS)
        self._buffer: deque[bytes] = deque([first])
        self._buffered = len(first)
        self._ready = asyncio.Event()
        self._finishing = False
        self._gone = False
        self._held = False  # the stream was paused by this response
        self._in_send = 0  # a counter: which send a pressure check looks at
        self._sending = False
        self._task: asyncio.Task[Any] | None = None
        self._released = False
        self.close_timeout_s = CLOSE_TIMEOUT_S
        # The write path (one write per loop turn, sent from the callback).
        self._send: Send | None = None
        self._direct: Any = None  # the server's BodyWriter, when it gives one
        self._idle = False  # the ASGI call waits for something to write
        self._pumping = False  # a pump is due at the end of this loop turn
        self._suspended: tuple[Awaitable[Any], int] | None = None

    def add_headers(self, headers: dict[str, str]) -> None:
        for name, value in headers.items():
            self.raw_headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))

    # -- the stream's side ---------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._gone or self._finishing or not data:
            return
        self._buffer.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._hold()
        if not self._idle:
            self._ready.set()  # the ASGI call is busy: it takes it next
        elif not self._pumping:
            self._pumping = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Once per loop turn: what was written this turn goes out as one
        body chunk, sent right here — no task woken, no await. The server's
        ``send`` completes without suspending unless it holds writes back;
        then the stream is paused and the ASGI call's task finishes that
        send (``_resume``) before it writes more."""
        self._pumping = False
        buffer = self._buffer
        if not self._idle or self._sending or not buffer or self._gone or self._send is None:
            return
        data = b"".join(buffer)
        buffer.clear()
        size = len(data)
        if self._direct is not None and self._direct.write(data):
            self._sent(size)  # straight to the socket: one write, no ASGI send
            return
        sending = self._send({"type": "http.response.body", "body": data, "more_body": True})
        del data
        if not isinstance(sending, Coroutine):  # not a coroutine: the ASGI call awaits it
            self._idle = False
            self._sending = True
            self._suspended = (sending, size)
            self._ready.set()
            return
        try:
            waiting = sending.send(None)
        except StopIteration:
            self._sent(size)
            return
        except OSError as exc:  # the reader went away mid-send
            log.debug("SSE send failed: %r", exc)
            self._gone = True
            self._ready.set()
            return
        self._hold()  # it did not complete at once: the server holds writes back
        self._idle = False  # the ASGI call's task takes over until it is done
        self._sending = True
        self._suspended = (_resume(sending, waiting), size)
        self._ready.set()

    def _sent(self, size: int) -> None:
        self._buffered -= size
        if self._held and self._buffered <= LOW_WATER:
            self._held = False
            self.stream.resume_writing()

    def finish(self) -> None:
        """End the response once the buffer is written; give up on a reader
        that takes nothing within ``close_timeout_s``."""
        if self._finishing:
            return
        self._finishing = True
        self._ready.set()
        asyncio.get_running_loop().call_later(self.close_timeout_s, self.release)

    def release(self) -> None:
        """Stop writing and end the ASGI call (the server closes the socket)."""
        if self._gone:
            return
        self._released = True
        if self._task is not None:
            self._task.cancel()

    def _hold(self) -> None:
        if not self._held:
            self._held = True
            self.stream.pause_writing()

    def _check_send(self, which: int) -> None:
        if self._sending and self._in_send == which:
            self._hold()  # the send did not complete at once: the server holds writes back

    # -- the ASGI call ---------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        listener = loop.create_task(self._listen(receive))
        buffer = self._buffer
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            )
            self._send = send
            self._direct = scope.get("extensions", {}).get(BODY_WRITER)
            while not self._gone:
                suspended = self._suspended
                if suspended is not None:
                    self._suspended = None
                    await suspended[0]
                    self._sending = False
                    self._sent(suspended[1])
                elif buffer:
                    data = b"".join(buffer)
                    buffer.clear()
                    self._in_send += 1
                    self._sending = True
                    loop.call_soon(self._check_send, self._in_send)
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    self._sending = False
                    size = len(data)
                    del data
                    self._sent(size)
                elif self._finishing:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
                else:
                    self._ready.clear()
                    self._idle = True  # from here on, writes are pumped
                    try:
                        await self._ready.wait()
                    finally:
                        self._idle = False
        except asyncio.CancelledError:
            task = self._task
            if not self._released or task is None:
                raise
            task.uncancel()  # our own release, not the server's cancellation
        except OSError as exc:  # the reader went away mid-send
            log.debug("SSE send failed: %r", exc)
        finally:
            self._gone = True
            buffer.clear()
            if self._suspended is not None:
                unfinished = self._suspended[0]
                self._suspended = None
                if isinstance(unfinished, Coroutine):
                    unfinished.close()
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            self.stream.on_closed()

    async def _listen(self, receive: Receive) -> None:
        """The reader's side: nothing comes but ``http.disconnect``."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._gone = True
                self._ready.set()
                if self._sending:
                    self.release()
                return


async def _resume(send: Coroutine[Any, Any, Any], waiting: Any) -> None:
    """Run to its end a ``send`` started outside any task (``_pump``) that
    suspended on ``waiting`` (the future it awaits, or None for a bare
    yield): wait for that here, in the ASGI call's task, then step the
    coroutine on — it reads the future's outcome where it awaited it. This
    task cancelled (a release) abandons the send."""
    while True:
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait((waiting,))
        except BaseException:
            send.close()
            raise
        try:
            waiting = send.send(None)
        except StopIteration:
            return
