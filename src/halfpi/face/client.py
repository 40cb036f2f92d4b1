"""The Python Face SDK: one asyncio client that keeps a Face true to the Mind.

What it does for you (DESIGN §3, §4, I4-I6):

- connects to one of several Mind URLs (the next one on failure), says
  hello, and reconnects with jittered exponential backoff for as long as it
  lives — the loop the Hand uses too (:mod:`halfpi.client.reconnect`), and
  sooner when the Mind is on this machine (a restart there takes seconds);
- watches the heartbeat: silence beyond ``dead_after_s`` means a dead link;
- keeps a :class:`~halfpi.face.view.ConversationView` per subscribed
  conversation, resubscribes after every reconnect from each view's cursor
  (exact replay) and rebuilds from the snapshot on ``face.reset``;
- dedupes by ``seq``; a jump in ``event_seq`` makes it resubscribe from the
  last good cursors; a message from an older connection generation is
  ignored, so it can never overwrite newer state;
- keeps a table of outstanding commands: after a reconnect, those the Mind
  declared replay-safe (``face.welcome.replay_safe``) are re-sent with the
  same ``request_id``; any other that was already on the wire is reconciled
  by reading state, or fails with :class:`~halfpi.face.errors.OutcomeUnknown`
  — never silently re-sent;
- keeps two live lists no subscription covers — the conversations and the
  approvals waiting in any conversation (docs/protocol.md §16);
- says where it is and why in :attr:`status` (the URL, the last failure, when
  the next attempt starts).

Every rule above lives in :class:`~halfpi.face.protocol.FaceProtocol`, a pure
object fed frames and the time; this class is its asyncio driver: it dials
(:class:`~halfpi.client.reconnect.Reconnect`), moves frames between the
transport and the protocol, and turns the protocol's events into futures and
callbacks. The transport is a seam (:data:`~halfpi.client.transport.Connector`):
the default speaks WebSocket; tests inject a scripted one, and time
(``sleep``, ``clock``, ``rng``) is injectable too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from halfpi.client.reconnect import Link, Reconnect
from halfpi.client.redial import LOCAL_CAP_S, REMOTE_CAP_S, Locate, Retry, default_cap, is_local
from halfpi.client.transport import (
    AUTH_CLOSE_CODES,
    ConnectionLost,
    Connector,
    Transport,
    Trust,
    tls_connector,
    websocket_connector,
)
from halfpi.core import wire
from halfpi.core.backoff import backoff
from halfpi.core.events import (
    ApprovalPending,
    ConversationInfo,
    ConversationPage,
    Created,
    Renamed,
    Snapshot,
    TaskPage,
    TaskView,
    Welcome,
)
from halfpi.face.commands import Body, command_of, new_id_for, new_request_id
from halfpi.face.errors import AuthError, ClientClosed, FaceError
from halfpi.face.events import (
    Accepted,
    Answer,
    Answered,
    Event,
    Failed,
    Received,
    StatusChanged,
    Updated,
)
from halfpi.face.handles import ChatHandle, Waiter
from halfpi.face.incoming import Welcomed
from halfpi.face.lists import LiveLists
from halfpi.face.protocol import FaceProtocol, HelloRefused
from halfpi.face.results import Result, Status
from halfpi.face.view import ConversationView

log = logging.getLogger("halfpi.face")


class FaceClient:
    def __init__(
        self,
        urls: str | list[str],
        token: str,
        *,
        client_name: str = "halfpi-sdk",
        connector: Connector = websocket_connector,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
        heartbeat_s: float = 15.0,
        dead_after_s: float = 45.0,
        delays: Callable[[], Iterator[float]] | None = None,
        on_status: Callable[[Status], None] | None = None,
        on_update: Callable[[str, str], None] | None = None,
        on_message: Callable[[str, dict[str, Any]], None] | None = None,
        ssl: Trust | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_delay_s: float | None = None,
        locate: Locate | None = None,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("a FaceClient needs at least one Mind URL")
        self.token = token
        self.client_name = client_name
        # ``ssl``: an ssl.SSLContext or a CA file to verify a wss:// Mind with.
        self.connector = tls_connector(ssl) if ssl is not None else connector
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.dead_after_s = dead_after_s
        self.clock = clock
        self.max_delay_s = default_cap(self.urls) if max_delay_s is None else max_delay_s
        self._delays = delays or (lambda: backoff(cap=self.max_delay_s, rng=self.rng))
        self.on_status = on_status
        # on_update(kind, conversation_id): a view changed (kind: the message
        # type, "snapshot", "cancel_requested"; "refused": the Mind will not
        # let it be followed, ``view.refused`` says why), or a live list did
        # ("conversations", "approvals"; conversation_id "" when re-read whole).
        self.on_update = on_update
        self.on_message = on_message
        self.protocol = FaceProtocol(
            token, client_name, heartbeat_s=heartbeat_s, dead_after_s=dead_after_s, rng=self.rng
        )
        self._reconnect: Reconnect[Welcomed] = Reconnect(
            self.urls,
            lambda url: self.connector(url),
            self._hello,
            sleep=lambda delay: self.sleep(delay),
            clock=lambda: self.clock(),
            delays=self._delays,
            on_retry=self._retrying,
            # Where the Mind says it is now (HOME/mind.json), asked before every dial.
            locate=locate,
        )
        self.status = Status("connecting", url=self.url)
        self._waiters: dict[str, Waiter] = {}
        self._transport: Transport | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._live = asyncio.Event()
        self._changed = asyncio.Event()
        self._closing = False
        self._fatal: BaseException | None = None

    # -- what the protocol holds -----------------------------------------------------

    @property
    def url(self) -> str:
        """The Mind this is about: connected to, or dialed last."""
        return self._reconnect.url

    @property
    def views(self) -> dict[str, ConversationView]:
        return self.protocol.views

    @property
    def lists(self) -> LiveLists:
        return self.protocol.lists

    @property
    def welcome(self) -> Welcome:
        """The last connection's ``face.welcome`` (FaceError before the first)."""
        if self.protocol.welcome is None:
            raise FaceError("not welcomed by a Mind yet")
        return self.protocol.welcome

    @property
    def generation(self) -> int:
        return self.protocol.generation

    @property
    def sent_log(self) -> list[tuple[int, str, str]]:
        """(generation, type, request_id) of every command put on the wire."""
        return self.protocol.sent_log

    @property
    def heartbeat_s(self) -> float:
        return self.protocol.heartbeat_s

    @property
    def supervisor(self) -> asyncio.Task[None] | None:
        """The task that keeps the connection (None before :meth:`connect`)."""
        return self._supervisor

    # -- lifecycle -------------------------------------------------------------

    async def connect(self, timeout: float | None = 30.0) -> FaceClient:
        """Start the connection supervisor and wait until the first hello succeeds."""
        if self._supervisor is None:
            self._supervisor = asyncio.create_task(self._supervise(), name="face supervisor")
        waiter = asyncio.ensure_future(self._live.wait())
        done, _ = await asyncio.wait(
            {waiter, self._supervisor}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            waiter.cancel()
            if self._fatal is not None:
                raise self._fatal
            raise FaceError("could not reach any Mind in time")
        return self

    async def __aenter__(self) -> FaceClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closing = True
        self._reconnect.close()
        if self._transport is not None:
            await self._transport.close()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor
        self._abandon(ClientClosed("client closed"))
        self._set_status(Status("closed", url=self.url))

    def reconnect_now(self) -> None:
        """Skip the rest of the backoff wait: try the next URL at once."""
        self._reconnect.wake()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate()`` holds (checked whenever anything changes)."""

        async def until() -> None:
            while not predicate():
                await self._changed.wait()

        await asyncio.wait_for(until(), timeout)

    async def wait_view(
        self,
        conversation_id: str,
        predicate: Callable[[ConversationView], bool],
        timeout: float | None = None,
    ) -> ConversationView:
        """Wait until the conversation's view satisfies ``predicate``."""
        view = self.views[conversation_id]

        async def until() -> ConversationView:
            while not predicate(view):
                await self._changed.wait()
            return view

        return await asyncio.wait_for(until(), timeout)

    @property
    def conversations(self) -> Mapping[str, ConversationInfo]:
        """Every conversation, live (docs/protocol.md §16): id -> its
        :class:`~halfpi.core.events.ConversationInfo`, newest first.
        :meth:`read_conversations` asks the Mind for a page instead."""
        return self.lists.conversations

    @property
    def approvals(self) -> Mapping[str, ApprovalPending]:
        """Every approval waiting for a decision, in any conversation, live:
        id -> its :class:`~halfpi.core.events.ApprovalPending` summary."""
        return self.lists.approvals

    def conversation_list(self) -> list[ConversationInfo]:
        """Deprecated: ``list(client.conversations.values())`` (newest first)."""
        warnings.warn(
            "FaceClient.conversation_list() is deprecated: "
            "list(client.conversations.values()) is the same list, newest first",
            DeprecationWarning,
            stacklevel=2,
        )
        return list(self.conversations.values())

    # -- the connection: frames between the transport and the protocol ----------

    async def _supervise(self) -> None:
        try:
            async with contextlib.aclosing(self._reconnect.links()) as links:
                async for link in links:
                    try:
                        await self._serve(link)
                    except ConnectionLost as exc:
                        link.lost = exc
                    finally:
                        self._transport = None
                        self.protocol.connection_lost()
        except ConnectionLost as exc:  # 4001 / 4003: retrying cannot help
            self._refuse(AuthError(exc.code or 0, exc.reason))

    async def _hello(self, transport: Transport) -> Welcomed:
        """The handshake of every connection: the welcome, or ConnectionLost."""
        await transport.send(self.protocol.hello())
        try:
            text = await asyncio.wait_for(transport.recv(), self.dead_after_s)
        except TimeoutError:
            raise ConnectionLost(None, "no welcome in time") from None
        try:
            return self.protocol.welcome_of(text)
        except HelloRefused as refused:
            # A failed hello is explained, then closed: report the close code
            # (4001 refused, 4029 retry later) with the Mind's explanation.
            try:
                await asyncio.wait_for(transport.recv(), self.dead_after_s)
            except ConnectionLost as exc:
                raise ConnectionLost(exc.code, refused.reason or exc.reason) from None
            except TimeoutError:
                pass
            raise ConnectionLost(None, refused.reason) from None

    async def _serve(self, link: Link[Welcomed]) -> None:
        protocol, transport = self.protocol, link.transport
        generation = protocol.connection_made(link.url, link.welcome, self.clock())
        self._transport = transport
        self._pump()
        await self._flush(transport)
        self._live.set()
        while True:
            deadline, now = protocol.next_timer(), self.clock()
            if deadline is not None and deadline <= now:
                protocol.handle_timer(now)  # a dead link raises ConnectionLost
            else:
                try:
                    wait = None if deadline is None else deadline - now
                    text = await asyncio.wait_for(transport.recv(), wait)
                except TimeoutError:
                    continue
                protocol.receive(text, self.clock(), generation=generation)
            self._pump()
            await self._flush(transport)

    async def _flush(self, transport: Transport) -> None:
        """Write what the protocol queued, in order; a dead link is the
        reader's to notice."""
        for text in self.protocol.data_to_send():
            try:
                await transport.send(text)
            except ConnectionLost:
                return

    async def _send_queued(self) -> None:
        transport = self._transport
        if transport is not None:
            await self._flush(transport)

    def _pump(self) -> None:
        """Turn the protocol's events into futures and callbacks, in order."""
        for event in self.protocol.events_received():
            try:
                self._deliver(event)
            except Exception:  # a caller's callback bug must not end the connection
                log.exception("a Face callback failed on %s", type(event).__name__)

    def _deliver(self, event: Event) -> None:
        if isinstance(event, StatusChanged):
            self._set_status(event.status)
        elif isinstance(event, Updated):
            self._notify(event.kind, event.conversation_id)
        elif isinstance(event, Received):
            if self.on_message is not None:
                self.on_message(event.type, event.payload)
        elif isinstance(event, Accepted):
            waiter = self._waiters.get(event.request_id)
            if waiter is not None:
                waiter.accept(event.accepted)
        elif isinstance(event, Answered):
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.finish(event.value)
        elif isinstance(event, Failed):
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.fail(event.error)

    def _retrying(self, retry: Retry) -> None:
        self._set_status(
            Status(
                "reconnecting",
                retry.attempt,
                retry.delay,
                detail=retry.why,
                url=retry.url,
                next_at=retry.next_at,
            )
        )

    def _refuse(self, exc: AuthError) -> None:
        self._fatal = exc
        self._set_status(Status("refused", detail=str(exc), url=self.url))
        self._abandon(exc)

    def _abandon(self, exc: FaceError) -> None:
        self.protocol.abandon(exc)
        self._pump()
        for waiter in self._waiters.values():
            waiter.fail(exc)
        self._waiters.clear()

    def _set_status(self, status: Status) -> None:
        self.status = status
        if self.on_status is not None:
            self.on_status(status)

    def _notify(self, kind: str, conversation_id: str) -> None:
        if self.on_update is not None:
            self.on_update(kind, conversation_id)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- commands ------------------------------------------------------------------

    async def submit(self, body: Body) -> ChatHandle:
        """Send a command (a :mod:`halfpi.core.wire` struct carrying its
        ``request_id``); the handle says when it is accepted and how it ends."""
        if self._fatal is not None:
            raise self._fatal
        if self._closing:
            raise ClientClosed("client closed")
        command = self.protocol.submit(body)
        waiter = self._waiters.setdefault(command.request_id, Waiter())
        await self._send_queued()
        return ChatHandle(command.type, command.request_id, waiter)

    async def request(self, type_: str, **payload: Any) -> Answer:
        """Send any command given as plain data, checked as the Mind checks it
        (:class:`~halfpi.face.errors.CommandError` ``invalid_request`` before
        anything is sent); return its :class:`Result`, snapshot or acceptance."""
        payload.setdefault("request_id", new_id_for(type_))
        handle = await self.submit(command_of(type_, payload))
        return await handle.answer()

    async def _result(self, body: Body) -> Result:
        handle = await self.submit(body)
        return await handle.result()

    async def create_conversation(
        self, name: str | None = None, *, request_id: str | None = None
    ) -> str:
        body = wire.ConversationCreate(
            request_id=request_id or new_id_for("face.conversation.create"), name=name
        )
        return (await self._result(body)).outcome(Created).conversation_id

    async def rename_conversation(
        self, conversation_id: str, name: str, *, request_id: str | None = None
    ) -> str:
        """Rename (replay-safe); returns the name the Mind stored (cleaned)."""
        body = wire.ConversationRename(
            request_id=request_id or new_id_for("face.conversation.rename"),
            conversation_id=conversation_id,
            name=name,
        )
        return (await self._result(body)).outcome(Renamed).name

    async def resolve_approval(
        self, approval_id: str, decision: str, *, reason: str | None = None
    ) -> Result:
        """``allow_once`` or ``deny_once``; ``data`` (an
        :class:`~halfpi.core.events.ApprovalOutcome`) says whether this decision
        was ``applied`` or another had already won (``already_resolved``)."""
        if decision not in ("allow_once", "deny_once"):
            raise ValueError(f"decision: allow_once or deny_once, not {decision!r}")
        body = wire.ApprovalResolve(
            request_id=new_id_for("face.approval.resolve"),
            approval_id=approval_id,
            decision=decision,  # type: ignore[arg-type]  # checked above
            reason=reason or None,
        )
        return await self._result(body)

    async def list_tasks(self, limit: int = 50, hand: str | None = None) -> list[TaskView]:
        """Background tasks, newest first, as the Mind last knows them."""
        body = wire.TaskList(request_id=new_id_for("face.task.list"), limit=limit, hand=hand)
        return (await self._result(body)).outcome(TaskPage).tasks

    async def cancel_task(self, task_id: str, *, request_id: str | None = None) -> Result:
        """Cancel a background task (replay-safe); the result comes once it is
        terminal: ``cancelled``, or ``already_finished`` with the state that stands
        (``data``: a :class:`~halfpi.core.events.CancelOutcome`)."""
        body = wire.TaskCancel(request_id=request_id or new_id_for("face.task.cancel"),
                               task_id=task_id)
        return await self._result(body)

    async def read_conversations(self, limit: int = 50) -> list[ConversationInfo]:
        """Ask the Mind for the newest ``limit`` conversations (one read; the
        live list the client keeps is :attr:`conversations`)."""
        body = wire.ConversationList(request_id=new_id_for("face.conversation.list"), limit=limit)
        return (await self._result(body)).outcome(ConversationPage).conversations

    async def snapshot(self, conversation_id: str, messages_limit: int = 50) -> Snapshot:
        """The conversation as it stands (DESIGN §4.1), its newest messages."""
        body = wire.ConversationSnapshot(
            request_id=new_id_for("face.conversation.snapshot"),
            conversation_id=conversation_id,
            messages_limit=messages_limit,
        )
        answer = await (await self.submit(body)).answer()
        if not isinstance(answer, Snapshot):
            raise FaceError(f"face.conversation.snapshot answered with {type(answer).__name__}")
        return answer

    async def subscribe(self, conversation_id: str) -> ConversationView:
        """Follow a conversation; its view stays exact across reconnects."""
        view = self.protocol.follow(conversation_id)
        await self._send_queued()
        return view

    async def chat(
        self, conversation_id: str, content: str, *, request_id: str | None = None
    ) -> ChatHandle:
        body = wire.Chat(
            request_id=request_id or new_id_for("face.chat"),
            conversation_id=conversation_id,
            content=content,
        )
        return await self.submit(body)

    async def ask(
        self, conversation_id: str, content: str, *, request_id: str | None = None
    ) -> Result:
        """A chat, to its end: ``data`` is its :class:`~halfpi.core.events.ChatOutcome`."""
        handle = await self.chat(conversation_id, content, request_id=request_id)
        return await handle.result()

    async def cancel(
        self, conversation_id: str, target_request_id: str, *, request_id: str | None = None
    ) -> ChatHandle:
        self.protocol.mark_cancel_requested(conversation_id, target_request_id)
        self._pump()
        body = wire.ChatCancel(
            request_id=request_id or new_id_for("face.chat.cancel"),
            conversation_id=conversation_id,
            target_request_id=target_request_id,
        )
        return await self.submit(body)


__all__ = [
    "AUTH_CLOSE_CODES",
    "LOCAL_CAP_S",
    "REMOTE_CAP_S",
    "ChatHandle",
    "ConnectionLost",
    "Connector",
    "FaceClient",
    "Result",
    "Status",
    "Transport",
    "is_local",
    "new_request_id",
    "websocket_connector",
]
