"""The Python Face SDK: one asyncio client that keeps a Face true to the Mind.

What it does for you (DESIGN §3, §4, I4-I6):

- connects to one of several Mind URLs (the next one on failure), says
  hello, and reconnects with jittered exponential backoff (a pure generator,
  :func:`halfpi.core.backoff.backoff`) for as long as it lives;
- watches the heartbeat: silence beyond ``dead_after_s`` means a dead link;
- keeps a :class:`~halfpi.face.view.ConversationView` per subscribed
  conversation, resubscribes after every reconnect from each view's cursor
  (exact replay) and rebuilds from the snapshot on ``face.reset``;
- dedupes by ``seq``; a jump in ``event_seq`` makes it resubscribe from the
  last good cursors; a message from an older connection generation is
  ignored, so it can never overwrite newer state;
- keeps a table of outstanding commands: after a reconnect, those the Mind
  declared replay-safe (``face.welcome.replay_safe``) are re-sent with the
  same ``request_id``; any other that was already on the wire fails with
  :class:`~halfpi.face.errors.OutcomeUnknown` — never silently re-sent;
- keeps two live lists no subscription covers — the conversations and the
  approvals waiting in any conversation — re-read after every (re)connect
  and kept current by ``face.conversation.changed`` and
  ``face.approval.pending`` / ``face.approval.settled`` (docs/protocol.md §16);
- says where it is and why in :attr:`status` (the URL, the last failure, when
  the next attempt starts), and retries sooner when the Mind is on this
  machine (a restart there takes seconds, not minutes).

The transport is a seam (:data:`~halfpi.face.transport.Connector`): the default speaks WebSocket
through ``websockets``; tests inject a scripted one, and time (``sleep``,
``rng``) is injectable too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from halfpi import __version__
from halfpi.core.backoff import backoff
from halfpi.core.cursor import parse_cursor
from halfpi.core.scopes import SESSIONS_READ
from halfpi.face.errors import AuthError, ClientClosed, FaceError, OutcomeUnknown, command_error
from halfpi.face.lists import LiveLists
from halfpi.face.results import Result, Status
from halfpi.face.transport import (
    ConnectionLost,
    Connector,
    Transport,
    Trust,
    tls_connector,
    websocket_connector,
)
from halfpi.face.view import APPLIED, RESYNC, ConversationView

log = logging.getLogger("halfpi.face")

AUTH_CLOSE_CODES = frozenset({4001, 4003})
# Backoff ceilings: DESIGN §11's 30 s for a Mind across a network; a Mind on
# this machine that went away is restarting, so it is tried every 2 s at most.
REMOTE_CAP_S = 30.0
LOCAL_CAP_S = 2.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def is_local(url: str) -> bool:
    """True if ``url`` names this machine (a loopback host)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    return host is not None and (host in LOCAL_HOSTS or host.startswith("127."))


class _Pending:
    __slots__ = ("accepted", "internal", "payload", "request_id", "result", "sent_gen", "type")

    def __init__(self, type_: str, payload: dict[str, Any], *, internal: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.type = type_
        self.payload = payload
        self.request_id: str = payload["request_id"]
        self.accepted: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.result: asyncio.Future[Any] = loop.create_future()
        self.sent_gen: int | None = None
        self.internal = internal

    def fail(self, exc: BaseException) -> None:
        for future in (self.accepted, self.result):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: callers may await only one


class ChatHandle:
    def __init__(self, client: FaceClient, pending: _Pending) -> None:
        self.client = client
        self.request_id = pending.request_id
        self._pending = pending

    async def accepted(self) -> dict[str, Any]:
        return await self._pending.accepted

    async def result(self) -> Result:
        value: Result = await self._pending.result
        return value


_counter = itertools.count(1)


def new_request_id(prefix: str = "q") -> str:
    return f"{prefix}-{os.urandom(6).hex()}-{next(_counter)}"


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
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        self.token = token
        self.client_name = client_name
        # ``ssl``: an ssl.SSLContext or a CA file to verify a wss:// Mind with.
        self.connector = tls_connector(ssl) if ssl is not None else connector
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s
        self.clock = clock
        if max_delay_s is None:
            local = all(is_local(url) for url in self.urls)
            max_delay_s = LOCAL_CAP_S if local else REMOTE_CAP_S
        self.max_delay_s = max_delay_s
        self._delays = delays or (lambda: backoff(cap=self.max_delay_s, rng=self.rng))
        self.on_status = on_status
        # on_update(kind, conversation_id): a view changed (kind: the message
        # type, "snapshot", "cancel_requested"), or a live list did
        # ("conversations", "approvals"; conversation_id "" when re-read whole).
        self.on_update = on_update
        self.on_message = on_message
        self.url = self.urls[0] if self.urls else ""
        self.status = Status("connecting", url=self.url)
        self.lists = LiveLists()  # docs/protocol.md §16
        self._wake = asyncio.Event()
        self.views: dict[str, ConversationView] = {}
        self.welcome: dict[str, Any] = {}
        self.generation = 0
        self.sent_log: list[tuple[int, str, str]] = []  # (generation, type, request_id)
        self._wanted: set[str] = set()
        self._pending: dict[str, _Pending] = {}
        self._transport: Transport | None = None
        self._expected_event_seq = 1
        self._catching_up: dict[str, int] = {}
        # subscribe request_id -> cid, for subscriptions that asked for a snapshot
        self._awaiting_snapshot: dict[str, str] = {}
        self._replayed = 0
        self._resume_pending: set[str] = set()
        self._resubscribing: dict[str, str] = {}  # cid -> subscribe request_id after a gap
        self._supervisor: asyncio.Task[None] | None = None
        self._live = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Future[None]] = set()
        self._closing = False
        self._fatal: BaseException | None = None

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
        if self._transport is not None:
            await self._transport.close()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor
        for task in list(self._tasks):
            task.cancel()
        for pending in list(self._pending.values()):
            pending.fail(ClientClosed("client closed"))
        self._pending.clear()
        self._set_status(Status("closed", url=self.url))

    def _set_status(self, status: Status) -> None:
        self.status = status
        if self.on_status is not None:
            self.on_status(status)

    def _notify(self, kind: str, conversation_id: str) -> None:
        if self.on_update is not None:
            self.on_update(kind, conversation_id)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate()`` holds (checked whenever anything changes)."""

        async def until() -> None:
            while not predicate():
                await self._changed.wait()

        await asyncio.wait_for(until(), timeout)

    def reconnect_now(self) -> None:
        """Skip the rest of the backoff wait: try the next URL at once."""
        self._wake.set()

    @property
    def conversations(self) -> dict[str, dict[str, Any]]:
        """Every conversation, live: id -> {id, name, created_at}."""
        return self.lists.conversations

    @property
    def approvals(self) -> dict[str, dict[str, Any]]:
        """Every approval waiting for a decision, in any conversation, live:
        id -> {conversation_id, approval_id, request_id, tool, reason, expires_at}."""
        return self.lists.approvals

    def conversation_list(self) -> list[dict[str, Any]]:
        """The live list of conversations, newest first."""
        return self.lists.conversation_list()

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

    # -- the connection supervisor ---------------------------------------------

    async def _supervise(self) -> None:
        delays = self._delays()
        attempt = 0
        urls = itertools.cycle(self.urls)
        while not self._closing:
            url = next(urls)
            self.url = url
            transport: Transport | None = None
            try:
                transport = await self.connector(url)
                await self._hello(transport)
            except ConnectionLost as exc:
                if transport is not None:
                    await transport.close()
                if exc.code in AUTH_CLOSE_CODES:
                    self._refuse(AuthError(exc.code or 0, exc.reason))
                    return
                attempt += 1
                await self._back_off(attempt, next(delays), url, exc.describe())
                continue
            # Welcomed: the backoff starts over, so a Mind that comes back
            # after a restart is found again within the first short delays.
            attempt, delays = 0, self._delays()
            why = "the connection ended"
            try:
                await self._run_connection(transport)
            except ConnectionLost as exc:
                if exc.code in AUTH_CLOSE_CODES:
                    self._refuse(AuthError(exc.code or 0, exc.reason))
                    return
                why = exc.describe()
            finally:
                self._transport = None
                await transport.close()
            if self._closing:
                return
            attempt = 1
            await self._back_off(attempt, next(delays), url, why)

    async def _back_off(self, attempt: int, delay: float, url: str, why: str) -> None:
        """Say where and why, then wait ``delay`` (or until :meth:`reconnect_now`)."""
        next_at = self.clock() + delay
        self._set_status(
            Status("reconnecting", attempt, delay, detail=why, url=url, next_at=next_at)
        )
        self._wake.clear()
        sleeper = asyncio.ensure_future(self.sleep(delay))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    def _refuse(self, exc: AuthError) -> None:
        self._fatal = exc
        self._set_status(Status("refused", detail=str(exc), url=self.url))
        for pending in list(self._pending.values()):
            pending.fail(exc)
        self._pending.clear()

    async def _hello(self, transport: Transport) -> None:
        await transport.send(
            json.dumps(
                {
                    "type": "face.hello",
                    "payload": {
                        "token": self.token,
                        "client": {"name": self.client_name, "version": __version__},
                        "protocol": 3,
                    },
                }
            )
        )
        try:
            frame = json.loads(await asyncio.wait_for(transport.recv(), self.dead_after_s))
        except TimeoutError:
            raise ConnectionLost(None, "no welcome in time") from None
        if frame.get("type") == "face.error":
            # A failed hello is explained, then closed: report the close code
            # (4001 refused, 4029 retry later) with the Mind's explanation.
            message = str((frame.get("payload") or {}).get("message", ""))
            try:
                await asyncio.wait_for(transport.recv(), self.dead_after_s)
            except ConnectionLost as exc:
                raise ConnectionLost(exc.code, message or exc.reason) from None
            except TimeoutError:
                pass
            raise ConnectionLost(None, message)
        if frame.get("type") != "face.welcome":
            raise ConnectionLost(None, f"expected face.welcome, got {frame.get('type')}")
        self.welcome = frame["payload"]
        self.heartbeat_s = float(self.welcome.get("heartbeat_s", self.heartbeat_s))
        self._expected_event_seq = int(self.welcome.get("event_seq", 1)) + 1

    async def _run_connection(self, transport: Transport) -> None:
        self.generation += 1
        gen = self.generation
        self._transport = transport
        resumed = await self._after_connect(gen)
        self._set_status(Status("resuming" if resumed else "live", url=self.url))
        self._live.set()
        loop = asyncio.get_running_loop()
        last_rx = loop.time()
        while True:
            try:
                text = await asyncio.wait_for(transport.recv(), self.heartbeat_s)
            except TimeoutError:
                if loop.time() - last_rx >= self.dead_after_s:
                    raise ConnectionLost(None, "heartbeat lost") from None
                await self._send_raw(gen, "face.ping", {})
                continue
            last_rx = loop.time()
            try:
                frame = json.loads(text)
                self._dispatch(gen, frame if isinstance(frame, dict) else {})
            except (ValueError, KeyError, TypeError) as exc:
                # A malformed frame is the Mind's bug, not a reason to stop.
                log.warning("ignored a malformed frame: %s", exc)

    async def _after_connect(self, gen: int) -> bool:
        """Resubscribe from cursors, then settle the outstanding table (I6)."""
        resumed = False
        self._awaiting_snapshot.clear()
        self._catching_up.clear()
        self._resubscribing.clear()
        self._replayed = 0
        self._resume_pending = {cid for cid in self._wanted if self.views[cid].ready}
        outstanding = list(self._pending.values())  # before this connection adds its own
        for cid in sorted(self._wanted):
            view = self.views[cid]
            resumed = resumed or view.ready
            await self._subscribe_now(gen, cid)
        replay_safe = set(self.welcome.get("replay_safe", ()))
        for pending in outstanding:
            if pending.internal:
                self._pending.pop(pending.request_id, None)
                pending.fail(ConnectionLost(None, "superseded by a new connection"))
            elif pending.sent_gen is None or pending.type in replay_safe:
                await self._send_pending(gen, pending)
            else:
                # Not replay-safe and already on the wire: never re-sent.
                # Reconcile by reading state instead (I6).
                self._pending.pop(pending.request_id, None)
                self._spawn(self._reconcile(pending))
        if SESSIONS_READ in self.welcome.get("scopes", ()):
            self._spawn(self._read_conversations(gen))
            if "approval_summaries" in self.welcome.get("features", ()):
                self._spawn(self._read_approvals(gen))
        return resumed

    # -- the live lists (docs/protocol.md §16) -------------------------------------

    async def _internal_read(self, gen: int, type_: str, payload: dict[str, Any]) -> Result:
        pending = _Pending(type_, {"request_id": new_request_id("list"), **payload}, internal=True)
        self._pending[pending.request_id] = pending
        await self._send_pending(gen, pending)
        result: Result = await pending.result
        return result

    async def _read_conversations(self, gen: int) -> None:
        self.lists.reading_conversations()
        rows = None
        try:
            result = await self._internal_read(gen, "face.conversation.list", {"limit": 200})
            rows = list(result.data.get("conversations", []))
        except (FaceError, ConnectionLost):
            pass
        finally:
            self.lists.conversations_read(rows if gen == self.generation else None)
        if rows is not None and gen == self.generation:
            self._notify("conversations", "")

    async def _read_approvals(self, gen: int) -> None:
        try:
            result = await self._internal_read(gen, "face.approval.list", {})
        except (FaceError, ConnectionLost):
            return
        if gen == self.generation:
            self.lists.approvals_read(list(result.data.get("approvals", [])))
            self._notify("approvals", "")

    def _session_news(self, type_: str, payload: dict[str, Any]) -> bool:
        cid = self.lists.apply(type_, payload)
        if cid is None:
            return False
        if type_ == "face.conversation.changed":
            view = self.views.get(cid)
            if view is not None:
                view.name = self.lists.conversations[cid].get("name")
            self._notify("conversations", cid)
        else:
            self._notify("approvals", cid)
        return True

    async def _retry_subscribe(self, gen: int, cid: str) -> None:
        await self.sleep(0.5 + self.rng.random())
        if gen == self.generation and cid in self._wanted and self._transport is not None:
            await self._subscribe_now(gen, cid)

    async def _reconcile(self, pending: _Pending) -> None:
        """Learn the outcome of a command that may or may not have run, by
        reading (reads are always safe). A chat whose reply is in the
        conversation resolves with it; otherwise the caller gets an explicit
        :class:`OutcomeUnknown` saying what the Mind shows — never a resend."""
        request_id = pending.request_id
        hint = "read the conversation to learn what happened"
        if pending.type == "face.chat":
            try:
                snap = await self.snapshot(pending.payload["conversation_id"], messages_limit=500)
            except FaceError:
                snap = None
            if snap is not None:
                mine = [m for m in snap.get("messages", []) if m.get("request_id") == request_id]
                reply = next((m for m in mine if m.get("role") == "assistant"), None)
                if reply is not None:
                    status = reply.get("status") or "succeeded"
                    self._finish(
                        pending,
                        Result(request_id, status, reply.get("content"), data={"reconciled": True}),
                    )
                    return
                hint = (
                    "the Mind admitted it and it has no reply yet: follow the conversation"
                    if mine
                    else "the Mind shows no admission of it yet; it may still be in flight"
                )
        pending.fail(OutcomeUnknown(request_id, pending.type, hint))

    async def _subscribe_now(self, gen: int, cid: str, request_id: str | None = None) -> None:
        view = self.views[cid]
        payload: dict[str, Any] = {
            "request_id": request_id or new_request_id("sub"),
            "conversation_ids": [cid],
        }
        if view.ready and view.cursor is not None:
            payload["since"] = {cid: view.cursor}
        else:
            payload["snapshot"] = True
            self._awaiting_snapshot[payload["request_id"]] = cid
        pending = _Pending("face.subscribe", payload, internal=True)
        self._pending[pending.request_id] = pending
        await self._send_pending(gen, pending)

    async def _send_pending(self, gen: int, pending: _Pending) -> None:
        pending.sent_gen = gen
        self.sent_log.append((gen, pending.type, pending.request_id))
        await self._send_raw(gen, pending.type, pending.payload)

    async def _send_raw(self, gen: int, type_: str, payload: dict[str, Any]) -> None:
        transport = self._transport
        if transport is None or gen != self.generation:
            return
        with contextlib.suppress(ConnectionLost):
            await transport.send(json.dumps({"type": type_, "payload": payload}))

    # -- incoming ------------------------------------------------------------------

    def _dispatch(self, gen: int, frame: dict[str, Any]) -> None:
        if gen != self.generation:
            return  # a late message of an older connection never touches newer state
        type_ = frame.get("type")
        payload = frame.get("payload") or {}
        event_seq = payload.get("event_seq")
        if isinstance(event_seq, int):
            jumped = event_seq != self._expected_event_seq
            self._expected_event_seq = event_seq + 1
            if jumped:
                # Something was lost inside this connection: resubscribe from the
                # last good cursors *before* folding anything newer, so the
                # replay starts right after what we hold (dedupe drops overlap).
                log.warning("event_seq jumped to %s: resubscribing", event_seq)
                self._resubscribe_all(gen)
                if type_ in ("face.event", "face.chat.delta"):
                    return  # the replay brings it again, in order
        if self._route(gen, type_, payload) and self.on_message is not None:
            self.on_message(str(type_), payload)

    def _route(self, gen: int, type_: Any, payload: dict[str, Any]) -> bool:
        """Fold one message into the client; True if it is news for the caller
        (not a duplicate event, not a second accepted for a re-sent command)."""
        if type_ in ("face.event", "face.chat.delta"):
            return self._conversation_message(gen, type_, payload)
        if isinstance(type_, str) and self._session_news(type_, payload):
            return True
        if type_ == "face.reset":
            self._rebuild(payload["conversation_id"], payload["snapshot"])
            return True
        request_id = payload.get("request_id", "")
        if type_ == "face.snapshot":
            cid = self._awaiting_snapshot.pop(request_id, None)
            if cid is not None:
                self._rebuild(cid, payload, quiet=True)
                return True
            pending = self._pending.get(request_id)
            if pending is not None:
                self._finish(pending, payload)
            return pending is not None
        if type_ == "face.accepted":
            return self._accepted(payload)
        if type_ == "face.result":
            pending = self._pending.get(request_id)
            if pending is not None:
                self._finish(pending, Result.from_wire(payload) if "status" in payload else payload)
            return pending is not None and not pending.internal
        if type_ == "face.error":
            pending = self._pending.pop(request_id, None)
            if pending is not None and pending.internal:
                pending.fail(command_error(payload))
                for cid in pending.payload.get("conversation_ids", ()):
                    self._resume_pending.discard(cid)
                    if self._resubscribing.get(cid) == request_id:
                        del self._resubscribing[cid]
                log.warning("%s refused: %s", pending.type, payload)
                self._maybe_resumed()
                if payload.get("retryable"):
                    # busy, rate_limited, unavailable…: the view must not
                    # silently stop updating — try again after a pause.
                    for cid in pending.payload.get("conversation_ids", ()):
                        self._spawn(self._retry_subscribe(gen, cid))
            elif pending is not None:
                pending.fail(command_error(payload))
            else:
                log.warning("face.error: %s", payload)
            return True
        return False

    def _finish(self, pending: _Pending, value: Any) -> None:
        self._pending.pop(pending.request_id, None)
        if not pending.accepted.done():
            pending.accepted.set_result({})
        if not pending.result.done():
            pending.result.set_result(value)

    def _accepted(self, payload: dict[str, Any]) -> bool:
        pending = self._pending.get(payload.get("request_id", ""))
        if pending is None:
            return False
        first = not pending.accepted.done()
        if first:
            pending.accepted.set_result(payload)
        if payload.get("operation") != "subscribe":
            return first
        heads = payload.get("heads") or {}
        for cid, mode in (payload.get("conversations") or {}).items():
            if self._resubscribing.get(cid) == pending.request_id:
                del self._resubscribing[cid]
            if mode != "reset":  # a reset ends in 'resynced', never in 'resumed'
                self._resume_pending.discard(cid)
            view = self.views.get(cid)
            if view is not None and mode == "exact" and cid in heads:
                head = parse_cursor(str(heads[cid]), field="heads").seq
                if head > view.seq:
                    self._catching_up[cid] = head
        self._maybe_resumed()
        if not pending.internal:
            self._finish(pending, payload)
        else:
            self._pending.pop(pending.request_id, None)
        return first

    def _conversation_message(self, gen: int, type_: str, payload: dict[str, Any]) -> bool:
        cid = payload["conversation_id"]
        view = self.views.get(cid)
        if view is None or cid in self._resubscribing:
            return False
        outcome = view.apply(type_, payload)
        if outcome is RESYNC:
            # Not placeable exactly: forget the view and rebuild it from a
            # fresh snapshot (once; events meanwhile are covered by it).
            view.seq = -1
            if cid not in self._awaiting_snapshot.values():
                self._spawn(self._subscribe_now(gen, cid))
            return False
        if outcome is APPLIED:
            head = self._catching_up.get(cid)
            if head is not None:
                self._replayed += 1
                if view.seq >= head:
                    del self._catching_up[cid]
                    self._maybe_resumed()
            self._notify(type_, cid)
            return True
        return False

    def _maybe_resumed(self) -> None:
        """'resumed: k events replayed' only once every conversation has caught up."""
        if self.status.state == "resuming" and not self._resume_pending and not self._catching_up:
            self._set_status(Status("resumed", replayed=self._replayed, url=self.url))

    def _rebuild(self, cid: str, snapshot: dict[str, Any], *, quiet: bool = False) -> None:
        view = self.views.get(cid)
        if view is None:
            return
        for request_id in [r for r, c in self._awaiting_snapshot.items() if c == cid]:
            del self._awaiting_snapshot[request_id]
        view.apply_snapshot(snapshot)
        self._catching_up.pop(cid, None)
        self._resume_pending.discard(cid)
        if not quiet:
            self._set_status(Status("resynced", url=self.url))
        self._notify("snapshot", cid)

    def _resubscribe_all(self, gen: int) -> None:
        """After a loss inside this connection: resubscribe from the cursors we
        hold, and fold nothing of those conversations until the Mind accepts —
        everything after our cursors comes again in the replay, in order."""
        for cid in sorted(self._wanted):
            if cid in self._resubscribing:
                continue  # one already on its way covers this loss too: no storm
            request_id = new_request_id("sub")
            self._resubscribing[cid] = request_id
            self._spawn(self._subscribe_now(gen, cid, request_id))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- commands ------------------------------------------------------------------

    async def _submit(self, type_: str, payload: dict[str, Any]) -> _Pending:
        if self._fatal is not None:
            raise self._fatal
        if self._closing:
            raise ClientClosed("client closed")
        payload.setdefault("request_id", new_request_id(type_.rsplit(".", 1)[-1][:4]))
        pending = _Pending(type_, payload)
        existing = self._pending.get(pending.request_id)
        if existing is not None:
            return existing
        self._pending[pending.request_id] = pending
        if self._transport is not None:
            await self._send_pending(self.generation, pending)
        return pending

    async def request(self, type_: str, **payload: Any) -> Any:
        """Send any command; return its ``face.result`` (a :class:`Result`) or snapshot."""
        pending = await self._submit(type_, payload)
        return await pending.result

    async def create_conversation(
        self, name: str | None = None, *, request_id: str | None = None
    ) -> str:
        payload: dict[str, Any] = {"name": name}
        if request_id:
            payload["request_id"] = request_id
        result: Result = await self.request("face.conversation.create", **payload)
        return str(result.data["conversation_id"])

    async def rename_conversation(
        self, conversation_id: str, name: str, *, request_id: str | None = None
    ) -> str:
        """Rename (replay-safe); returns the name the Mind stored (cleaned)."""
        payload: dict[str, Any] = {"conversation_id": conversation_id, "name": name}
        if request_id:
            payload["request_id"] = request_id
        result: Result = await self.request("face.conversation.rename", **payload)
        return str(result.data["name"])

    async def resolve_approval(
        self, approval_id: str, decision: str, *, reason: str | None = None
    ) -> Result:
        """``allow_once`` or ``deny_once``; the result says whether this decision
        was ``applied`` or another had already won (``already_resolved``)."""
        payload: dict[str, Any] = {"approval_id": approval_id, "decision": decision}
        if reason:
            payload["reason"] = reason
        result: Result = await self.request("face.approval.resolve", **payload)
        return result

    async def list_conversations(self, limit: int = 50) -> list[dict[str, Any]]:
        result: Result = await self.request("face.conversation.list", limit=limit)
        return list(result.data["conversations"])

    async def snapshot(self, conversation_id: str, messages_limit: int = 50) -> dict[str, Any]:
        snap: dict[str, Any] = await self.request(
            "face.conversation.snapshot",
            conversation_id=conversation_id,
            messages_limit=messages_limit,
        )
        return snap

    async def subscribe(self, conversation_id: str) -> ConversationView:
        """Follow a conversation; its view stays exact across reconnects."""
        view = self.views.setdefault(conversation_id, ConversationView(conversation_id))
        if conversation_id not in self._wanted:
            self._wanted.add(conversation_id)
            if self._transport is not None:
                await self._subscribe_now(self.generation, conversation_id)
        return view

    async def chat(
        self, conversation_id: str, content: str, *, request_id: str | None = None
    ) -> ChatHandle:
        payload: dict[str, Any] = {"conversation_id": conversation_id, "content": content}
        if request_id:
            payload["request_id"] = request_id
        pending = await self._submit("face.chat", payload)
        return ChatHandle(self, pending)

    async def ask(
        self, conversation_id: str, content: str, *, request_id: str | None = None
    ) -> Result:
        handle = await self.chat(conversation_id, content, request_id=request_id)
        return await handle.result()

    async def cancel(
        self, conversation_id: str, target_request_id: str, *, request_id: str | None = None
    ) -> ChatHandle:
        view = self.views.get(conversation_id)
        if view is not None:
            view.mark_cancel_requested(target_request_id)
            self._notify("cancel_requested", conversation_id)
        payload: dict[str, Any] = {
            "conversation_id": conversation_id,
            "target_request_id": target_request_id,
        }
        if request_id:
            payload["request_id"] = request_id
        pending = await self._submit("face.chat.cancel", payload)
        return ChatHandle(self, pending)


__all__ = [
    "ChatHandle",
    "ConnectionLost",
    "Connector",
    "FaceClient",
    "Result",
    "Status",
    "Transport",
    "new_request_id",
    "websocket_connector",
]
