"""One SSE stream (DESIGN §9, I7, I8; docs/protocol.md §17): a caller of the
Mind API with a bounded queue, and the ASGI response that carries it.

:class:`SseStream` is to an SSE response what ``FaceSession`` is to a
WebSocket, minus the inbound half: a :class:`~halfpi.mind.caller.Caller`
with the principal bound when the stream was authorised, the same
:class:`~halfpi.core.outbound.OutboundQueue` (deltas coalesce, progress is
dropped, overflow evicts), the same subscriptions (its one
``face.subscribe`` goes through the Mind API: exact replay, reset and the
switch to live are the Mind's), and a session of the Mind's maintenance
(``tick``: the ``: ping`` every heartbeat, the credential re-checked, a
reader whose writes stay blocked evicted; ``close``: revocation and
drain). What it adds is the encoding: every frame becomes an event whose
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
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from halfpi.core.events import Evicted, to_message
from halfpi.core.outbound import Message, OutboundQueue
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
from halfpi.errors import CloseCode
from halfpi.mind import api

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.sse")

FLUSH_BUDGET = 256 * 1024  # bytes of frames taken from the queue per flush round
RETRY_MS = 2000  # EventSource's wait before it reconnects (the stream's first block)
# The pressure marks and the close timeout of the WebSocket transports
# (gateway/native.py: the native server imports the door, so not from there).
HIGH_WATER = 128 * 1024
LOW_WATER = 32 * 1024
CLOSE_TIMEOUT_S = 10.0


class SseStream:
    """The Mind's view of one SSE stream (a Caller, a Sink and a Session)."""

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
        self.heartbeat_event = heartbeat_event  # ?heartbeat=event
        self.loop = asyncio.get_running_loop()
        self.principal_id: str | None = credential.principal_id
        self.label = credential.label
        self.profile = credential.profile
        self.scopes = credential.scopes
        self.detail_mode: str | None = None  # set by its face.subscribe (DESIGN §6)
        self.conversations = conversations
        # Where the reader stands in each conversation, as far as what was
        # written to it: the id: of the next event.
        self.cursors = dict(cursors)
        self.grant = grant
        self._token: str | None = None
        assert self.principal_id is not None
        self._sealer = Sealer(mind.tickets.key, self.principal_id, conversations)
        self.queue = OutboundQueue(mind.config.queue)
        self.subscriptions = mind.subscriptions_for(self)
        self.response = SseResponse(self)
        now = mind.now()
        self.last_ping = now
        self.paused_at = now
        self.paused = False
        self.closed = False
        self.bound = False
        self._flush_scheduled = False
        # Another protocol carried over the same stream may frame it its own
        # way without a subclass (``agui.py``: AG-UI events with their own
        # ids); None: :meth:`encode`.
        self.framing: Callable[[list[bytes]], bytes] | None = None

    def open(self) -> bool:
        """Count the stream against its principal's cap and let the Mind's
        maintenance visit it; False when the cap is reached."""
        assert self.principal_id is not None
        if not self.mind.bind(self.principal_id):
            return False
        self.bound = True
        self.mind.add_session(self)
        return True

    # -- the resume token ----------------------------------------------------------

    @property
    def token(self) -> str:
        token = self._token
        if token is None:
            token = self._token = self._sealer.seal(self.cursors, self.grant)
        return token

    def encode(self, frames: list[bytes]) -> bytes:
        """``frames`` as events, each with the token of the stream after it.
        Every write of frames goes through here: the hook another framing of
        the same stream overrides (``durable.py``: Durable Streams events),
        or replaces through ``framing`` (``agui.py``)."""
        if self.framing is not None:
            return self.framing(frames)
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
            out.append(event_bytes(frame, type_, self.token))
        return b"".join(out)

    # -- outbound (I7), as FaceSession ----------------------------------------------

    def send(self, m: Message) -> None:
        if self.closed:
            return
        if not (
            self.paused or self._flush_scheduled or self.subscriptions.replaying or len(self.queue)
        ):
            self.response.write(self.encode([self.queue.emit_now(m)]))
            return
        if not self.queue.push(m, pressured=self.paused):
            self.evict()
            return
        self.wake()

    def wake(self) -> None:
        if not self._flush_scheduled and not self.paused and not self.closed:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self.paused:
            return
        queue = self.queue
        frames = queue.take(FLUSH_BUDGET) if len(queue) else []
        replay = self.subscriptions
        if not len(queue) and replay.replaying:
            frames.extend(replay.pull_frames(queue, FLUSH_BUDGET))
        if frames:
            self.response.write(self.encode(frames))
        if (len(queue) or replay.ready) and not self.paused and not self.closed:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def pause_writing(self) -> None:
        if not self.paused:
            self.paused = True
            self.paused_at = self.mind.now()

    def resume_writing(self) -> None:
        self.paused = False
        self.wake()

    def evict(self) -> None:
        """Slow reader (I7): the queue is dropped; a last ``face.evicted``
        event names the cursors to resume from, and its ``id:`` is the token
        of exactly those; then the stream ends (EventSource reconnects with
        that id)."""
        if self.closed:
            return
        self.queue.evict()
        cursors = self.subscriptions.resume_cursors(self.cursors)
        self.cursors.update(cursors)
        self._token = None
        frame = self.queue.emit_now(to_message(Evicted(cursors=cursors)))
        self.response.write(self.encode([frame]))
        self.close(CloseCode.SLOW_CONSUMER, "slow consumer: resume from your cursors")

    # -- maintenance (the Mind's clock) -------------------------------------------------

    def tick(self, now: float) -> float | None:
        """A ``: ping`` every heartbeat (renewing a grant in its ``id:`` when
        half its time has gone); the credential re-checked (I8); a reader
        whose writes stayed blocked ``dead_after_s`` evicted (I7)."""
        if self.closed:
            return None
        config = self.mind.config
        if self.mind.credential(self.principal_id or "") is None:
            self.close(CloseCode.REVOKED, "credential revoked")
            return None
        if self.paused and now - self.paused_at >= config.dead_after_s:
            self.evict()
            return None
        if now >= self.last_ping + config.heartbeat_s:
            self.last_ping = now
            interval = config.heartbeat_s if self.heartbeat_event else None
            self.response.write(ping_bytes(self._renewed(), interval))
        deadline = self.last_ping + config.heartbeat_s
        if self.paused:
            deadline = min(deadline, self.paused_at + config.dead_after_s)
        return deadline

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

    def close(self, code: int, reason: str) -> None:
        """End the stream after what is queued (revocation, drain, eviction)."""
        if self.closed:
            return
        frames = self.queue.take(self.mind.config.queue.reliable_bytes) if len(self.queue) else []
        if frames:
            self.response.write(self.encode(frames))
        self.closed = True
        self.response.write(b": closed %d %b\n\n" % (code, reason.encode()))
        self.response.finish()
        self._cleanup()

    def on_closed(self) -> None:
        """The reader is gone (or the response ended)."""
        if not self.closed:
            self.closed = True
            self._cleanup()

    def _cleanup(self) -> None:
        api.disconnected(self.mind, self)
        self.mind.remove_session(self)
        if self.bound and self.principal_id is not None:
            self.bound = False
            self.mind.unbind(self.principal_id)


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

    def add_headers(self, headers: dict[str, str]) -> None:
        for name, value in headers.items():
            self.raw_headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))

    # -- the stream's side ---------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._gone or self._finishing:
            return
        self._buffer.append(data)
        self._buffered += len(data)
        self._ready.set()
        if self._buffered > HIGH_WATER:
            self._hold()

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
            while not self._gone:
                if buffer:
                    data = b"".join(buffer)
                    buffer.clear()
                    self._in_send += 1
                    self._sending = True
                    loop.call_soon(self._check_send, self._in_send)
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    self._sending = False
                    self._buffered -= len(data)
                    del data
                    if self._held and self._buffered <= LOW_WATER:
                        self._held = False
                        self.stream.resume_writing()
                elif self._finishing:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
                else:
                    self._ready.clear()
                    await self._ready.wait()
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
