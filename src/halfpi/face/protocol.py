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

import json
import logging
import math
import random
from collections.abc import Callable
from typing import Any

from halfpi import __version__
from halfpi.client.errors import ConnectionLost
from halfpi.config import PROTOCOL_VERSION
from halfpi.core.scopes import SESSIONS_READ
from halfpi.face.errors import FaceError, command_error
from halfpi.face.events import (
    Accepted,
    Answered,
    Event,
    Failed,
    Received,
    StatusChanged,
    Updated,
)
from halfpi.face.lists import LiveLists
from halfpi.face.outstanding import (
    READ_APPROVALS,
    READ_CONVERSATIONS,
    RECONCILE,
    SUBSCRIBE,
    Command,
    Outstanding,
    new_request_id,
    reconcile_read,
    reconciled,
)
from halfpi.face.results import Result, Status
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
        self.welcome: dict[str, Any] = {}
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
        client = {"name": self.client_name, "version": __version__}
        payload = {"token": self.token, "client": client, "protocol": PROTOCOL_VERSION}
        return json.dumps({"type": "face.hello", "payload": payload})

    def welcome_of(self, text: str) -> dict[str, Any]:
        """The ``face.welcome`` payload in the answer to the hello; raises
        :class:`HelloRefused` for ``face.error``, ConnectionLost otherwise."""
        try:
            frame = json.loads(text)
        except ValueError:
            raise ConnectionLost(None, "the answer to face.hello is not JSON") from None
        frame = frame if isinstance(frame, dict) else {}
        payload = frame.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        if frame.get("type") == "face.error":
            raise HelloRefused(str(payload.get("message", "")))
        if frame.get("type") != "face.welcome":
            raise ConnectionLost(None, f"expected face.welcome, got {frame.get('type')}")
        return payload

    def connection_made(self, url: str, welcome: dict[str, Any], now: float) -> int:
        """Welcomed on a new connection: resubscribe every followed
        conversation from its cursor, settle the outstanding table (I6), and
        re-read the live lists. Returns the connection's generation."""
        self.generation += 1
        gen = self.generation
        self.connected = True
        self.url = url
        self.welcome = welcome
        self.heartbeat_s = float(welcome.get("heartbeat_s", self.heartbeat_s))
        self._outbox.clear()
        self._last_rx = now
        self._ping_at = now + self.heartbeat_s
        subs = self.subscriptions
        subs.connection_made(self.views, int(welcome.get("event_seq", 1)))
        settlement = self.commands.settle(set(welcome.get("replay_safe", ())))
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
        if SESSIONS_READ in welcome.get("scopes", ()):
            self.lists.reading_conversations()
            self._own(READ_CONVERSATIONS, "face.conversation.list", {"limit": LIST_LIMIT})
            if "approval_summaries" in welcome.get("features", ()):
                self._own(READ_APPROVALS, "face.approval.list", {})
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
            self._queue("face.ping", {})
            self._ping_at = now + self.heartbeat_s
        for cid in self.subscriptions.due(now):
            self._subscribe(cid)

    # -- the caller's side -----------------------------------------------------------

    def submit(self, type_: str, payload: dict[str, Any]) -> Command:
        """A caller's command (``payload`` carries its ``request_id``); sent
        now if connected, else on the next connection. A command already
        outstanding under that ``request_id`` is returned instead."""
        command = self.commands.add(Command(type_, payload))
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
            frame = json.loads(text)
            self._dispatch(frame if isinstance(frame, dict) else {}, now)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignored a malformed frame: %s", exc)

    def _dispatch(self, frame: dict[str, Any], now: float) -> None:
        type_ = frame.get("type")
        payload = frame.get("payload") or {}
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
            self._events.append(Received(str(type_), payload))

    def _route(self, type_: Any, payload: dict[str, Any], now: float) -> bool:
        """Fold one message; True if it is news for the caller."""
        if type_ in ("face.event", "face.chat.delta"):
            return self._conversation_message(type_, payload)
        if isinstance(type_, str) and self._session_news(type_, payload):
            return True
        if type_ == "face.reset":
            self._rebuild(payload["conversation_id"], payload["snapshot"])
            return True
        request_id = str(payload.get("request_id", ""))
        if type_ == "face.snapshot":
            cid = self.subscriptions.awaiting_snapshot.pop(request_id, None)
            if cid is not None:
                self._rebuild(cid, payload, quiet=True)
                return True
            command = self.commands.pop(request_id)
            if command is None:
                return False
            if command.role == RECONCILE and command.target is not None:
                self._conclude(command.target, payload)
                return False
            if not command.own:
                self._answer(command, payload)
            return True
        if type_ == "face.accepted":
            return self._accepted(request_id, payload)
        if type_ == "face.result":
            command = self.commands.pop(request_id)
            if command is None:
                return False
            if command.own:
                self._own_result(command, payload)
                return False
            self._answer(command, Result.from_wire(payload) if "status" in payload else payload)
            return True
        if type_ == "face.error":
            self._refused(request_id, payload, now)
            return True
        return False

    def _accepted(self, request_id: str, payload: dict[str, Any]) -> bool:
        command = self.commands.get(request_id)
        if command is None:
            return False
        first = command.accepted is None
        if first:
            command.accepted = payload
            if not command.own:
                self._events.append(Accepted(request_id, payload))
        if payload.get("operation") != "subscribe":
            return first
        self.subscriptions.accepted(request_id, payload, self.views)
        self._maybe_resumed()
        self.commands.pop(request_id)
        if not command.own:
            self._answer(command, payload)
        return first

    def _refused(self, request_id: str, payload: dict[str, Any], now: float) -> None:
        command = self.commands.pop(request_id)
        if command is None:
            log.warning("face.error: %s", payload)
            return
        if not command.own:
            self._events.append(Failed(request_id, command_error(payload)))
            return
        # A sentence, never the frame's repr (the headless face prints it).
        log.warning("%s refused: %s: %s", command.type, payload.get("code", "refused"),
                    payload.get("message", "no reason given"))
        if command.role == SUBSCRIBE:
            cids = list(command.payload.get("conversation_ids", ()))
            retryable = bool(payload.get("retryable"))
            # busy, rate_limited, unavailable…: the view must not silently
            # stop updating — it is tried again after a pause.
            self.subscriptions.refused(request_id, cids, retryable, now, self.rng)
            self._maybe_resumed()
            for cid in cids if not retryable else ():
                view = self.views.get(cid)
                if view is not None:
                    view.refused = command_error(payload)
                    self._updated("refused", cid)
        elif command.role == READ_CONVERSATIONS:
            self.lists.conversations_read(None)
        elif command.role == RECONCILE and command.target is not None:
            self._conclude(command.target, None)

    def _answer(self, command: Command, value: Any) -> None:
        self._events.append(Answered(command.request_id, value))

    def _conversation_message(self, type_: str, payload: dict[str, Any]) -> bool:
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

    def _session_news(self, type_: str, payload: dict[str, Any]) -> bool:
        cid = self.lists.apply(type_, payload)
        if cid is None:
            return False
        if type_ == "face.conversation.changed":
            view = self.views.get(cid)
            if view is not None:
                view.name = self.lists.conversations[cid].get("name")
            self._updated("conversations", cid)
        else:
            self._updated("approvals", cid)
        return True

    def _own_result(self, command: Command, payload: dict[str, Any]) -> None:
        data = payload.get("data") or {}
        if command.role == READ_CONVERSATIONS:
            self.lists.conversations_read(list(data.get("conversations", [])))
            self._updated("conversations", "")
        elif command.role == READ_APPROVALS:
            self.lists.approvals_read(list(data.get("approvals", [])))
            self._updated("approvals", "")
        elif command.role == RECONCILE and command.target is not None:
            self._conclude(command.target, None)

    def _rebuild(self, cid: str, snapshot: dict[str, Any], *, quiet: bool = False) -> None:
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

    def _queue(self, type_: str, payload: dict[str, Any]) -> None:
        if self.connected:
            self._outbox.append(json.dumps({"type": type_, "payload": payload}))

    def _send(self, command: Command) -> None:
        command.sent_gen = self.generation
        self.sent_log.append((self.generation, command.type, command.request_id))
        self._queue(command.type, command.payload)

    def _own(self, role: str, type_: str, payload: dict[str, Any]) -> None:
        command = Command(type_, {"request_id": self.new_id("list"), **payload}, role)
        self._send(self.commands.add(command))

    def _subscribe(self, cid: str, request_id: str | None = None) -> None:
        request_id = request_id or self.new_id("sub")
        payload = self.subscriptions.subscribe_payload(self.views[cid], request_id)
        self._send(self.commands.add(Command("face.subscribe", payload, SUBSCRIBE)))

    def _reconcile(self, command: Command) -> None:
        """Learn the outcome of a command that may or may not have run by
        reading (reads are always safe) — never by sending it again (I6)."""
        read = reconcile_read(command, self.new_id("read"))
        if read is None:
            self._conclude(command, None)
        else:
            self._send(self.commands.add(read))

    def _conclude(self, command: Command, snapshot: dict[str, Any] | None) -> None:
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
