"""One Face connection, whatever transport carries it (DESIGN §4, I7, I8).

The session owns the connection's state machine (``awaiting_hello → open →
closing → closed``), its bounded outbound queue and its subscriptions. A
transport adapter feeds it text frames and writability changes and gives it
a :class:`Transport` to write to; the session never touches a socket.

Commands of one connection are handled in arrival order by a worker task
that exists only while there is work (an idle connection costs no task).
Frames leave through :meth:`send`: queue, then flush at the end of the
current loop iteration so several messages share one write.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from halfpi.config import PROTOCOL_VERSION
from halfpi.core import wire
from halfpi.core.outbound import RELIABLE, Message, OutboundQueue, message
from halfpi.core.requests import (
    Decision,
    RequestRecord,
    Tombstone,
    decide,
    payload_digest,
    replay_frames,
)
from halfpi.core.scopes import COMMAND_SCOPE, default_detail_mode
from halfpi.core.states import CONNECTION
from halfpi.errors import (
    CloseCode,
    Forbidden,
    HalfpiError,
    InternalError,
    InvalidRequest,
    RateLimited,
    RequestConflict,
    Unauthorized,
    Unavailable,
)
from halfpi.gateway.commands import HANDLERS
from halfpi.mind.subscriptions import Subscription

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from halfpi.mind.actor import ConversationActor
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway")

FLUSH_BUDGET = 256 * 1024  # bytes handed to the transport per flush round
REPLAY_BATCH = 256
MAX_INBOX = 256
MAX_INBOX_BEFORE_HELLO = 4  # with at most 1 MiB each: bounded before anyone is known
OVERSIZED = b"\x00oversized:"  # stands in the inbox for a frame too large to keep
FEATURES = (
    "resume",
    "snapshot",
    "coalesced_deltas",
    "evicted_cursors",
    "conversation_changes",  # face.conversation.changed, face.conversation.rename
    "approval_summaries",  # face.approval.pending/settled, face.approval.list
)


class Transport(Protocol):
    # The peer's address, as the handshake throttle counts it.
    address: str

    def write_frames(self, frames: list[bytes]) -> None: ...

    def ping(self) -> None:
        """A transport-level ping (a WebSocket ping): clients answer it by
        themselves, so a Face that only reads still shows it is alive."""

    def close(self, code: int, reason: str) -> None: ...


class FaceSession:
    def __init__(self, mind: Mind, transport: Transport) -> None:
        self.mind = mind
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        now = mind.now()
        self.connected_at = now
        self.last_inbound = now
        self.last_ping = now
        self.last_wire_ping = now
        self.paused_at = now
        self.hello_at: float | None = None  # the hello arrived; its check may wait
        self.bound = False  # counted against the principal's connection cap
        self.state = CONNECTION.initial
        self.queue = OutboundQueue(mind.config.queue)
        self.principal_id: str | None = None
        self.profile = ""
        self.detail_mode: str | None = None
        self.subscriptions: dict[str, Subscription] = {}
        self._replaying: list[Subscription] = []
        self.paused = False
        self.closed = False
        self._flush_scheduled = False
        self._inbox: deque[bytes] = deque()
        self._worker: asyncio.Task[None] | None = None
        self.invalid_streak = 0
        mind.add_session(self)

    # -- outbound (I7) -----------------------------------------------------------

    def send(self, m: Message) -> None:
        if self.closed:
            return
        if not (self.paused or self._flush_scheduled or self._replaying or len(self.queue)):
            # Idle: nothing waits, so writing now overtakes nothing.
            self.transport.write_frames([self.queue.emit_now(m)])
            return
        if not self.queue.push(m, pressured=self.paused):
            self.evict()
            return
        if not self._flush_scheduled and not self.paused:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def send_reliable(self, type_: str, payload: dict[str, Any]) -> None:
        self.send(message(type_, payload))

    def send_result(self, payload: dict[str, Any]) -> None:
        self.send(message("face.result", payload))

    def send_error(self, exc: HalfpiError, request_id: str | None) -> None:
        payload: dict[str, Any] = {
            "code": exc.code.value,
            "message": exc.message,
            "retryable": exc.retryable,
        }
        if request_id is not None:
            payload["request_id"] = request_id
        if exc.field is not None:
            payload["field"] = exc.field
        self.send(message("face.error", payload))

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self.paused:
            return
        queue = self.queue
        frames = queue.take(FLUSH_BUDGET) if len(queue) else []
        if not len(queue) and self._replaying:
            self._pull(frames)
        if frames:
            self.transport.write_frames(frames)
        if (len(queue) or self._replaying) and not self.paused and not self.closed:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _pull(self, frames: list[bytes]) -> None:
        """Replay from the journal for subscriptions still catching up (I4)."""
        budget = FLUSH_BUDGET
        journal = self.mind.journal
        for sub in list(self._replaying):
            while budget > 0:
                batch = journal.read_after(sub.conversation_id, sub.pos, REPLAY_BATCH)
                if batch is None:  # the window moved past us while we replayed
                    self._replaying.remove(sub)
                    self._drop_subscription(sub.conversation_id)
                    self.mind.spawn(self._reset(sub), name="reset subscription")
                    break
                if not batch:
                    sub.live = True
                    self._replaying.remove(sub)
                    break
                for m in batch:
                    sub.pos = m.seq
                    shown = m.for_mode(sub.detail_mode)
                    if shown is not None and (m.kind == RELIABLE or sub.wants(m)):
                        frame = self.queue.emit_now(shown)
                        budget -= len(frame)
                        frames.append(frame)
            if budget <= 0:
                return

    async def _reset(self, sub: Subscription) -> None:
        actor = sub.actor
        snap = await actor.snapshot(self.mind.config.snapshot_messages, sub.detail_mode)
        if self.closed:
            return
        self.send_reliable(
            "face.reset",
            {"conversation_id": actor.id, "reason": "cursor_expired", "snapshot": snap},
        )
        self.install(actor, _seq_of(snap), sub.transient_types, sub.detail_mode)

    def pause_writing(self) -> None:
        if not self.paused:
            self.paused = True
            self.paused_at = self.mind.now()

    def resume_writing(self) -> None:
        self.paused = False
        if not self._flush_scheduled and not self.closed:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def evict(self) -> None:
        """Slow consumer (I7): drop the queue, hand over the cursors, close 4008."""
        if self.closed:
            return
        cursors = self.queue.evict()
        for sub in self._replaying:
            cursors[sub.conversation_id] = sub.actor.cursor(sub.pos)
        frame = self.queue.emit_now(message("face.evicted", {"cursors": cursors}))
        self.transport.write_frames([frame])
        self.close(CloseCode.SLOW_CONSUMER, "slow consumer: resume from your cursors")

    # -- subscriptions -------------------------------------------------------------

    def install(
        self,
        actor: ConversationActor,
        pos: int,
        transient_types: frozenset[str] | None,
        detail_mode: str,
    ) -> None:
        """Subscribe from ``pos``: replay what is newer, then go live."""
        if self.closed:  # the connection went while the subscribe was being read
            return
        self._drop_subscription(actor.id)
        sub = Subscription(
            self, actor, pos=pos, transient_types=transient_types, detail_mode=detail_mode
        )
        self.subscriptions[actor.id] = sub
        actor.subscribers[self] = sub
        self.queue.written_cursors.setdefault(actor.id, actor.cursor(pos))
        self._replaying.append(sub)
        if not self._flush_scheduled and not self.paused:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _drop_subscription(self, conversation_id: str) -> None:
        sub = self.subscriptions.pop(conversation_id, None)
        if sub is None:
            return
        sub.actor.subscribers.pop(self, None)
        if sub in self._replaying:
            self._replaying.remove(sub)

    def resolve_detail_mode(self, requested: str | None, *, keep: bool = True) -> str:
        """DESIGN §6: per connection, set by ``face.subscribe`` (``keep``); a
        snapshot may ask for a mode for itself only. Observers may never ask
        for transparent (I9)."""
        if requested == "transparent" and self.profile != "operator":
            raise Forbidden("observers cannot request transparent detail", field="detail_mode")
        mode = requested or self.detail_mode or default_detail_mode(self.profile)
        if keep:
            self.detail_mode = mode
        return mode

    # -- inbound -------------------------------------------------------------------

    def on_frame(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_inbound = self.mind.now()
        limit = MAX_INBOX if self.state == "open" else MAX_INBOX_BEFORE_HELLO
        if len(self._inbox) >= limit:
            self.send_error(RateLimited("too many commands in flight"), wire.request_id_of(data))
            return
        if len(data) > self.mind.config.max_frame_bytes:
            # Refused in order, but not kept: an oversized frame costs no memory.
            data = OVERSIZED + str(len(data)).encode()
        self._inbox.append(data)
        if self._worker is None:
            self._worker = self.loop.create_task(self._work())

    def on_binary(self) -> None:
        self.on_frame(b"\x00binary")  # not JSON: refused as invalid_request like any garbage

    def on_traffic(self) -> None:
        """Any inbound traffic (pings and pongs included) proves the Face is alive."""
        self.last_inbound = self.mind.now()

    @property
    def busy(self) -> bool:
        """Frames are waiting or being handled."""
        return self._worker is not None or bool(self._inbox)

    async def _work(self) -> None:
        try:
            while self._inbox and not self.closed:
                await self._handle(self._inbox.popleft())
                # Let the replies flush between commands: a pipelining Face
                # that reads promptly must never look like a slow one.
                await asyncio.sleep(0)
        finally:
            self._worker = None

    async def _handle(self, data: bytes) -> None:
        config = self.mind.config
        hello = self.state == "awaiting_hello"
        if data.startswith(OVERSIZED):
            size = data[len(OVERSIZED) :].decode()
            exc = InvalidRequest(f"frame of {size} bytes exceeds {config.max_frame_bytes}")
            if hello:
                self._refuse_hello(exc, CloseCode.UNAUTHORIZED, "hello required")
            else:
                self._invalid(exc, None)
            return
        try:
            type_, payload = wire.decode_command(data)
        except InvalidRequest as exc:
            if hello:  # every failed hello is answered and closed alike (4001)
                self._refuse_hello(exc, CloseCode.UNAUTHORIZED, "invalid hello")
            else:
                self._invalid(exc, wire.request_id_of(data))
            return
        self.invalid_streak = 0
        if hello:
            if type_ != "face.hello":
                self._refuse_hello(
                    InvalidRequest("the first frame must be face.hello", field="type"),
                    CloseCode.UNAUTHORIZED,
                    "hello required",
                )
                return
            try:
                await self._hello(payload)
            except Exception:  # a bug or a store failure: say so, never hang
                log.exception("hello failed")
                self._refuse_hello(
                    InternalError("internal error"), CloseCode.INTERNAL_ERROR, "internal error"
                )
            return
        request_id = getattr(payload, "request_id", None)
        if type_ == "face.hello":
            self.send_error(InvalidRequest("hello was already received", field="type"), None)
            return
        # I8: every command re-checks the credential as it is now.
        credential = self.mind.credential(self.principal_id or "")
        if credential is None:
            self.close(CloseCode.REVOKED, "credential revoked")
            return
        scope = COMMAND_SCOPE.get(type_)
        try:
            if scope is not None and scope not in credential.scopes:
                raise Forbidden(f"{type_} needs scope {scope}")
            if self.mind.draining and type_ in wire.MUTATIONS:
                raise Unavailable("the Mind is shutting down; retry elsewhere or later")
            await HANDLERS[type_](self, payload)
        except HalfpiError as exc:
            self.send_error(exc, request_id)
        except Exception:
            log.exception("command %s failed", type_)
            self.send_error(InternalError("internal error"), request_id)

    def _invalid(self, exc: InvalidRequest, request_id: str | None) -> None:
        self.invalid_streak += 1
        self.send_error(exc, request_id)
        if self.invalid_streak >= self.mind.config.invalid_frames_before_close:
            self.close(CloseCode.PROTOCOL_VIOLATION, "too many invalid frames")

    def _refuse_hello(self, exc: HalfpiError, code: int, reason: str) -> None:
        """A failed hello: the ``face.error`` that explains it, then the close."""
        self.send_error(exc, None)
        self.close(code, reason)

    async def _hello(self, hello: wire.Hello) -> None:
        if hello.protocol != PROTOCOL_VERSION:
            self._refuse_hello(
                InvalidRequest(
                    f"protocol {hello.protocol} is not supported; "
                    f"this Mind speaks {PROTOCOL_VERSION}",
                    field="protocol",
                ),
                CloseCode.UNAUTHORIZED,
                "unsupported protocol",
            )
            return
        self.hello_at = self.mind.now()
        try:
            credential = await self.mind.authenticate(hello.token, "face", self.transport.address)
        except RateLimited as exc:
            self._refuse_hello(exc, CloseCode.RATE_LIMITED, "too many failed handshakes")
            return
        if self.closed:
            return
        if credential is None:
            self._refuse_hello(
                Unauthorized("unknown or revoked token"), CloseCode.UNAUTHORIZED, "unauthorized"
            )
            return
        if not self.mind.bind(credential.principal_id):
            limit = self.mind.config.max_connections_per_principal
            self._refuse_hello(
                RateLimited(f"this credential already has {limit} live connections"),
                CloseCode.RATE_LIMITED,
                "too many connections",
            )
            return
        self.bound = True
        self.principal_id = credential.principal_id
        self.profile = credential.profile
        self.state = CONNECTION.check(self.state, "open")
        config = self.mind.config
        self.send_reliable(
            "face.welcome",
            {
                "principal_id": credential.principal_id,
                "label": credential.label,
                "profile": credential.profile,
                "scopes": sorted(credential.scopes),
                "protocol": PROTOCOL_VERSION,
                "node_id": self.mind.node_id,
                "heartbeat_s": config.heartbeat_s,
                "limits": {
                    "max_frame_bytes": config.max_frame_bytes,
                    "max_chat_bytes": config.max_chat_bytes,
                    "reliable_queue_messages": config.queue.reliable_messages,
                    "reliable_queue_bytes": config.queue.reliable_bytes,
                    "transient_queue_messages": config.queue.transient_messages,
                    "transient_queue_bytes": config.queue.transient_bytes,
                },
                "replay_safe": list(wire.REPLAY_SAFE),
                "features": list(FEATURES),
            },
        )

    # -- the request registry, seen from a connection (DESIGN §5, I5) ------------

    async def mutation(
        self,
        type_: str,
        payload: Any,
        admit: Callable[[RequestRecord], Awaitable[RequestRecord | Tombstone]],
    ) -> None:
        """Admit ``payload`` once per ``(principal_id, request_id)``.

        ``admit`` runs only for a new key and sends its own replies; a replay
        gets the stored outcome; a different payload gets ``request_conflict``.
        """
        assert self.principal_id is not None
        digest = payload_digest(type_, payload)
        key = (self.principal_id, payload.request_id)
        async with self.mind.request_lock(key):
            existing = await self.mind.store.get_request(*key)
            if existing is None:
                record = RequestRecord(
                    self.principal_id,
                    payload.request_id,
                    type_,
                    digest,
                    "accepted",
                    self.mind.now(),
                )
                standing = await admit(record)
                if standing is record:
                    return
                existing = standing
            await self._replay(key, existing, digest)

    async def _replay(
        self, key: tuple[str, str], existing: RequestRecord | Tombstone, digest: str
    ) -> None:
        if decide(existing, digest) is Decision.CONFLICT:
            raise RequestConflict(
                "this request_id was used for a different command", field="request_id"
            )
        for type_, body in replay_frames(existing):
            self.send_reliable(type_, dict(body))
        if isinstance(existing, RequestRecord) and not existing.terminal:
            # Attach for the terminal result, then re-read: if it finished in
            # between and was not delivered to us, deliver it now (once).
            self.mind.attach(key, self)
            fresh = await self.mind.store.get_request(*key)
            if fresh is not None and fresh.result is not None and self.mind.is_attached(key, self):
                self.mind.detach_key(key, self)
                self.send_result(dict(fresh.result))

    # -- liveness and closing ------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Called by the Mind's maintenance loop when this session's deadline
        came; time is passed in. Returns the next deadline (None once closed):
        traffic only moves deadlines later, so one computed now is never late,
        and every open session has one within a heartbeat, so a pause that
        starts after it was computed is still seen in time.

        Liveness (docs/protocol.md §11): a connection idle for a heartbeat
        gets a WebSocket ping, which every client library answers by itself;
        any frame or pong is life; ``dead_after_s`` without any closes it
        (1001). Writes blocked that long make it a slow consumer (4008),
        whatever it sends: a peer that does not read is not alive for us.
        """
        if self.closed:
            return None
        config = self.mind.config
        if self.paused and now - self.paused_at >= config.dead_after_s:
            if self.state == "awaiting_hello":
                self.close(CloseCode.SLOW_CONSUMER, "slow consumer: it does not read")
            else:
                self.evict()
            return None
        if self.state == "awaiting_hello":
            hello_by = self.connected_at + config.hello_timeout_s
            if self.hello_at is not None:
                # The hello is being checked (a throttled one waits its turn).
                return self._blocked_deadline(now + config.heartbeat_s)
            if now >= hello_by:
                self.close(CloseCode.HELLO_TIMEOUT, "no hello in time")
                return None
            return self._blocked_deadline(hello_by)
        dead_at = self.last_inbound + config.dead_after_s
        if now >= dead_at:
            self.close(CloseCode.GOING_AWAY, "no traffic: connection presumed dead")
            return None
        ping_at = max(self.last_inbound, self.last_wire_ping) + config.heartbeat_s
        if now >= ping_at:
            self.last_wire_ping = now
            self.transport.ping()
            ping_at = now + config.heartbeat_s
        if now >= self.last_ping + config.heartbeat_s:
            self.last_ping = now
            self.send_reliable("face.ping", {"ts": now})
        return self._blocked_deadline(min(dead_at, ping_at, self.last_ping + config.heartbeat_s))

    def _blocked_deadline(self, deadline: float) -> float:
        """``deadline``, or earlier if blocked writes would close this first."""
        if self.paused:
            return min(deadline, self.paused_at + self.mind.config.dead_after_s)
        return deadline

    def close(self, code: int, reason: str) -> None:
        """Close after writing what is already queued, so the ``face.error``
        that explains a close arrives before it. (An eviction empties the
        queue first: a slow consumer gets only ``face.evicted``.)"""
        if self.closed:
            return
        if len(self.queue):
            self.transport.write_frames(self.queue.take(self.mind.config.queue.reliable_bytes))
        self.closed = True
        self.state = CONNECTION.check(self.state, "closing")
        self.transport.close(code, reason)
        self._cleanup()

    def on_closed(self) -> None:
        """The transport is gone (either side closed, or the network died)."""
        if not self.closed:
            self.closed = True
            self._cleanup()
        if self.state != "closed":
            self.state = CONNECTION.check(self.state, "closed")

    def _cleanup(self) -> None:
        for conversation_id in list(self.subscriptions):
            self._drop_subscription(conversation_id)
        self.mind.detach(self)
        self.mind.remove_session(self)
        if self.bound and self.principal_id is not None:
            self.bound = False
            self.mind.unbind(self.principal_id)
        # The command in progress (if any) runs to its end: a chat admitted on
        # a connection that closes meanwhile must still start (I1). Replies
        # to a closed session are dropped; a replay re-attaches.
        self._inbox.clear()


def _seq_of(snapshot: dict[str, Any]) -> int:
    return int(str(snapshot["cursor"]).rpartition(".")[2])
