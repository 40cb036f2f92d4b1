"""The Face SDK's protocol as a pure object: feed frames in, read frames out.

:class:`FaceProtocol` is to :class:`~halfpi.face.client.FaceClient` what
websockets' ``ClientProtocol`` is to its asyncio connection: every rule of
DESIGN §3-§4 and I4-I6 that a Face applies lives here, with no asyncio, no
socket and no clock — time is an argument (``now``) and so is the random
source. The client only moves frames between a transport and this object
and turns its events into futures and callbacks.

The calls, in a connection's order::

    protocol.hello()                          # the first frame to send
    welcome = protocol.welcome_of(text)       # its answer (or HelloRefused)
    gen = protocol.connection_made(url, welcome, now)
    protocol.receive(text, now, generation=gen)   # every frame that arrives
    protocol.next_timer(); protocol.handle_timer(now)  # heartbeat, retries
    protocol.connection_lost()
    protocol.data_to_send()                   # frames to write, in order
    protocol.events_received()                # what the caller must learn

What it keeps across connections: the views (one reducer per followed
conversation, :mod:`~halfpi.face.view`), the live lists
(:mod:`~halfpi.face.lists`), the outstanding-command table
(:mod:`~halfpi.face.outstanding`) and the subscription tracker
(:mod:`~halfpi.face.subscriptions`). Every connection has a generation; a
frame of an older one never touches state.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable

import msgspec

from halfpi import __version__
from halfpi.client.errors import ConnectionLost
from halfpi.config import PROTOCOL_VERSION
from halfpi.core import events as messages
from halfpi.core import wire
from halfpi.core.scopes import SESSIONS_READ
from halfpi.face.commands import Body, encode, new_request_id
from halfpi.face.errors import FaceError, command_error
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
from halfpi.face.incoming import (
    SESSION,
    Malformed,
    Payload,
    Welcomed,
    error_of,
    frame_of,
    read,
    welcome_of,
)
from halfpi.face.lists import NEWS, LiveLists, News
from halfpi.face.outstanding import (
    READ_APPROVALS,
    READ_CONVERSATIONS,
    RECONCILE,
    SUBSCRIBE,
    Command,
    Outstanding,
    reconcile_read,
    reconciled,
)
from halfpi.face.results import Result, Status, data_of
from halfpi.face.subscriptions import Subscriptions
from halfpi.face.view import APPLIED, RESYNC, ConversationView

log = logging.getLogger("halfpi.face")

LIST_LIMIT = 200  # conversations re-read after every (re)connect


class HelloRefused(ConnectionLost):
    """The Mind answered the hello with ``face.error``; the close that
    follows carries the code (4001 refused, 4029 retry later)."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class FaceProtocol:
    def __init__(
        self,
        token: str,
        client_name: str = "halfpi-sdk",
        *,
        heartbeat_s: float = 15.0,
        dead_after_s: float = 45.0,
        rng: random.Random | None = None,
        new_id: Callable[[str], str] = new_request_id,
    ) -> None:
        self.token = token
        self.client_name = client_name
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s
        self.rng = rng or random.Random()
        self.new_id = new_id
        self.views: dict[str, ConversationView] = {}
        self.lists = LiveLists()  # docs/protocol.md §16
        self.commands = Outstanding()
        self.subscriptions = Subscriptions()
        self.welcome: Welcomed | None = None
        self.generation = 0
        self.connected = False
        self.url = ""
        self.status = Status("connecting")
        self.sent_log: list[tuple[int, str, str]] = []  # (generation, type, request_id)
        self._outbox: list[str] = []
        self._events: list[Event] = []
        self._last_rx = 0.0
        self._ping_at = math.inf

    # -- I/O boundary ----------------------------------------------------------------

    def data_to_send(self) -> list[str]:
        """The frames to write, in order (each once)."""
        frames, self._outbox = self._outbox, []
        return frames

    def events_received(self) -> list[Event]:
        """What happened since the last call, in order."""
        events, self._events = self._events, []
        return events

    # -- the handshake -----------------------------------------------------------------

    def hello(self) -> str:
        """``face.hello``: the first frame of every connection (DESIGN §4)."""
        client = wire.ClientInfo(name=self.client_name, version=__version__)
        return encode(wire.Hello(token=self.token, client=client, protocol=PROTOCOL_VERSION))

    def welcome_of(self, text: str) -> Welcomed:
        """The ``face.welcome`` answering the hello; raises
        :class:`HelloRefused` for ``face.error``, ConnectionLost otherwise."""
        try:
            type_, payload = frame_of(text)
            if type_ == "face.error":
                raise HelloRefused(error_of(payload).message)
            if type_ != "face.welcome":
                raise ConnectionLost(None, f"expected face.welcome, got {type_ or None}")
            return welcome_of(payload)
        except Malformed as exc:
            raise ConnectionLost(None, f"the answer to face.hello: {exc}") from None

    def connection_made(self, url: str, welcome: Welcomed, now: float) -> int:
        """Welcomed on a new connection: resubscribe every followed
        conversation from its cursor, settle the outstanding table (I6), and
        re-read the live lists. Returns the connection's generation."""
        self.generation += 1
        gen = self.generation
        self.connected = True
        self.url = url
        self.welcome = welcome
        self.heartbeat_s = welcome.heartbeat_s
        self._outbox.clear()
        self._last_rx = now
        self._ping_at = now + self.heartbeat_s
        subs = self.subscriptions
        subs.connection_made(self.views, welcome.event_seq)
        settlement = self.commands.settle(set(welcome.replay_safe))
        resumed = False
        for cid in sorted(subs.wanted):
            resumed = resumed or self.views[cid].ready
            self._subscribe(cid)
        for command in settlement.dropped:
            if command.role == READ_CONVERSATIONS:
                self.lists.conversations_read(None)  # its answer will never come
            elif command.role == RECONCILE and command.target is not None:
                settlement.reconcile.append(command.target)  # read again on this one
        for command in settlement.resend:
            self._send(command)
        for command in settlement.reconcile:
            self._reconcile(command)
        if SESSIONS_READ in welcome.scopes:
            self.lists.reading_conversations()
            lists = wire.ConversationList(request_id=self.new_id("list"), limit=LIST_LIMIT)
            self._own(READ_CONVERSATIONS, lists)
            if "approval_summaries" in welcome.features:
                self._own(READ_APPROVALS, wire.ApprovalList(request_id=self.new_id("list")))
        self._set_status("resuming" if resumed else "live")
        return gen

    def connection_lost(self) -> None:
        """The connection ended: nothing more is sent on it."""
        self.connected = False
        self._outbox.clear()
        self._ping_at = math.inf
        self.subscriptions.retry_at.clear()

    # -- timers (time passed in) ----------------------------------------------------

    def next_timer(self) -> float | None:
        """When :meth:`handle_timer` must next be called (None: no timer)."""
        if not self.connected:
            return None
        retry = self.subscriptions.next_retry()
        return self._ping_at if retry is None else min(self._ping_at, retry)

    def handle_timer(self, now: float) -> None:
        """Heartbeat: ``face.ping`` after ``heartbeat_s`` of silence; a link
        silent for ``dead_after_s`` is dead (raises ConnectionLost). And the
        retries of refused subscribes that are due."""
        if not self.connected:
            return
        if now >= self._ping_at:
            if now - self._last_rx >= self.dead_after_s:
                raise ConnectionLost(None, "heartbeat lost")
            self._queue(wire.Ping())
            self._ping_at = now + self.heartbeat_s
        for cid in self.subscriptions.due(now):
            self._subscribe(cid)

    # -- the caller's side -----------------------------------------------------------

    def submit(self, body: Body) -> Command:
        """A caller's command (``body`` carries its ``request_id``); sent
        now if connected, else on the next connection. A command already
        outstanding under that ``request_id`` is returned instead."""
        command = self.commands.add(Command(body))
        if self.connected and command.sent_gen is None:
            self._send(command)
        return command

    def follow(self, conversation_id: str) -> ConversationView:
        """Follow a conversation: its view stays exact across reconnects."""
        view = self.views.setdefault(conversation_id, ConversationView(conversation_id))
        if conversation_id not in self.subscriptions.wanted:
            self.subscriptions.wanted.add(conversation_id)
            if self.connected:
                self._subscribe(conversation_id)
        return view

    def mark_cancel_requested(self, conversation_id: str, target_request_id: str) -> None:
        view = self.views.get(conversation_id)
        if view is not None:
            view.mark_cancel_requested(target_request_id)
            self._updated("cancel_requested", conversation_id)

    def abandon(self, error: FaceError) -> None:
        """Fail every caller's command with ``error`` (closed, refused)."""
        for command in self.commands.clear():
            if not command.own:
                self._events.append(Failed(command.request_id, error))

    # -- incoming ----------------------------------------------------------------------

    def receive(self, text: str, now: float, generation: int | None = None) -> None:
        """One frame from the connection of ``generation`` (default: the
        current one). A frame of an older connection changes nothing; a
        malformed one is the Mind's bug, logged, not a reason to stop."""
        if generation is not None and generation != self.generation:
            return
        if not self.connected:
            return
        self._last_rx = now
        self._ping_at = now + self.heartbeat_s
        try:
            self._dispatch(*frame_of(text), now)
        except (ValueError, KeyError, TypeError, AttributeError, msgspec.ValidationError) as exc:
            log.warning("ignored a malformed frame: %s", exc)

    def _dispatch(self, type_: str, payload: Payload, now: float) -> None:
        event_seq = payload.get("event_seq")
        if isinstance(event_seq, int) and self.subscriptions.jumped(event_seq):
            # Something was lost inside this connection: resubscribe from the
            # last good cursors *before* folding anything newer, so the
            # replay starts right after what we hold (dedupe drops overlap).
            log.warning("event_seq jumped to %s: resubscribing", event_seq)
            for cid, request_id in self.subscriptions.to_resubscribe(self.new_id):
                self._subscribe(cid, request_id)
            if type_ in ("face.event", "face.chat.delta"):
                return  # the replay brings it again, in order
        if self._route(type_, payload, now):
            self._events.append(Received(type_, payload))

    def _route(self, type_: str, payload: Payload, now: float) -> bool:
        """Fold one message; True if it is news for the caller."""
        if type_ in ("face.event", "face.chat.delta"):
            return self._conversation_message(type_, payload)
        if type_ not in SESSION:
            return False
        message = read(type_, payload)
        if type_ in NEWS:
            self._session_news(message)
            return True
        if isinstance(message, messages.Reset):
            self._rebuild(message.conversation_id, message.snapshot)
            return True
        if isinstance(message, messages.Snapshot):
            return self._snapshot(message)
        if isinstance(message, messages.Accepted):
            return self._accepted(message)
        if isinstance(message, messages.Result):
            return self._result(message)
        assert isinstance(message, messages.Error)
        self._refused(message, now)
        return True

    def _snapshot(self, snapshot: messages.Snapshot) -> bool:
        request_id = messages.present(snapshot.request_id) or ""
        cid = self.subscriptions.awaiting_snapshot.pop(request_id, None)
        if cid is not None:
            self._rebuild(cid, snapshot, quiet=True)
            return True
        command = self.commands.pop(request_id)
        if command is None:
            return False
        if command.role == RECONCILE and command.target is not None:
            self._conclude(command.target, snapshot)
            return False
        if not command.own:
            self._answer(command, snapshot)
        return True

    def _result(self, result: messages.Result) -> bool:
        command = self.commands.pop(result.request_id)
        if command is None:
            return False
        if command.own:
            self._own_result(command, result)
            return False
        self._answer(command, Result.from_wire(command.type, result))
        return True

    def _accepted(self, accepted: messages.Accepted) -> bool:
        request_id = accepted.request_id
        command = self.commands.get(request_id)
        if command is None:
            return False
        first = command.accepted is None
        if first:
            command.accepted = accepted
            if not command.own:
                self._events.append(Accepted(request_id, accepted))
        if accepted.operation != "subscribe":
            return first
        self.subscriptions.accepted(accepted, self.views)
        self._maybe_resumed()
        self.commands.pop(request_id)
        if not command.own:
            self._answer(command, accepted)
        return first

    def _refused(self, error: messages.Error, now: float) -> None:
        request_id = messages.present(error.request_id) or ""
        command = self.commands.pop(request_id)
        if command is None:
            log.warning("face.error: %s: %s", error.code, error.message)
            return
        if not command.own:
            self._events.append(Failed(request_id, command_error(error)))
            return
        # A sentence, never the frame's repr (the headless face prints it).
        log.warning("%s refused: %s: %s", command.type, error.code,
                    error.message or "no reason given")
        body = command.body
        if isinstance(body, wire.Subscribe):
            cids = list(body.conversation_ids)
            # busy, rate_limited, unavailable…: the view must not silently
            # stop updating — it is tried again after a pause.
            self.subscriptions.refused(request_id, cids, error.retryable, now, self.rng)
            self._maybe_resumed()
            for cid in cids if not error.retryable else ():
                view = self.views.get(cid)
                if view is not None:
                    view.refused = command_error(error)
                    self._updated("refused", cid)
        elif command.role == READ_CONVERSATIONS:
            self.lists.conversations_read(None)
        elif command.role == RECONCILE and command.target is not None:
            self._conclude(command.target, None)

    def _answer(self, command: Command, value: Answer) -> None:
        self._events.append(Answered(command.request_id, value))

    def _conversation_message(self, type_: str, payload: Payload) -> bool:
        cid = payload["conversation_id"]
        view = self.views.get(cid)
        if view is None or self.subscriptions.held(cid):
            return False
        outcome = view.apply(type_, payload)
        if outcome is RESYNC:
            # Not placeable exactly: forget the view and rebuild it from a
            # fresh snapshot (once; events meanwhile are covered by it).
            view.seq = -1
            if not self.subscriptions.snapshot_requested(cid):
                self._subscribe(cid)
            return False
        if outcome is APPLIED:
            self.subscriptions.applied(cid, view)
            self._maybe_resumed()
            self._updated(type_, cid)
            return True
        return False

    def _session_news(self, news: News) -> None:
        cid = self.lists.apply(news)
        if isinstance(news, messages.ConversationNews):
            view = self.views.get(cid)
            if view is not None:
                view.name = messages.present(self.lists.conversations[cid].name)
            self._updated("conversations", cid)
        else:
            self._updated("approvals", cid)

    def _own_result(self, command: Command, result: messages.Result) -> None:
        data = data_of(command.type, result)
        if command.role == READ_CONVERSATIONS:
            page = data if isinstance(data, messages.ConversationPage) else None
            self.lists.conversations_read(None if page is None else page.conversations)
            self._updated("conversations", "")
        elif command.role == READ_APPROVALS:
            if isinstance(data, messages.ApprovalPage):
                self.lists.approvals_read(data.approvals)
                self._updated("approvals", "")
        elif command.role == RECONCILE and command.target is not None:
            self._conclude(command.target, None)

    def _rebuild(self, cid: str, snapshot: messages.Snapshot, *, quiet: bool = False) -> None:
        view = self.views.get(cid)
        if view is None:
            return
        self.subscriptions.rebuilt(cid)
        view.apply_snapshot(snapshot)
        if not quiet:
            self._set_status("resynced")
        self._updated("snapshot", cid)

    def _maybe_resumed(self) -> None:
        """'resumed: k events replayed' only once every conversation has caught up."""
        if self.status.state == "resuming" and self.subscriptions.caught_up:
            self._set_status("resumed", replayed=self.subscriptions.replayed)

    # -- outgoing ----------------------------------------------------------------------

    def _queue(self, body: wire.Strict) -> None:
        if self.connected:
            self._outbox.append(encode(body))

    def _send(self, command: Command) -> None:
        command.sent_gen = self.generation
        self.sent_log.append((self.generation, command.type, command.request_id))
        self._queue(command.body)

    def _own(self, role: str, body: Body) -> None:
        self._send(self.commands.add(Command(body, role)))

    def _subscribe(self, cid: str, request_id: str | None = None) -> None:
        request_id = request_id or self.new_id("sub")
        body = self.subscriptions.subscribe(self.views[cid], request_id)
        self._send(self.commands.add(Command(body, SUBSCRIBE)))

    def _reconcile(self, command: Command) -> None:
        """Learn the outcome of a command that may or may not have run by
        reading (reads are always safe) — never by sending it again (I6)."""
        read = reconcile_read(command, self.new_id("read"))
        if read is None:
            self._conclude(command, None)
        else:
            self._send(self.commands.add(read))

    def _conclude(self, command: Command, snapshot: messages.Snapshot | None) -> None:
        """What reading state told of ``command``: its result, or unknown."""
        outcome = reconciled(command, snapshot)
        if isinstance(outcome, Result):
            self._events.append(Answered(command.request_id, outcome))
        else:
            self._events.append(Failed(command.request_id, outcome))

    # -- what the caller learns ------------------------------------------------------

    def _updated(self, kind: str, conversation_id: str) -> None:
        self._events.append(Updated(kind, conversation_id))

    def _set_status(self, state: str, *, replayed: int = 0) -> None:
        self.status = Status(state, replayed=replayed, url=self.url)
        self._events.append(StatusChanged(self.status))
