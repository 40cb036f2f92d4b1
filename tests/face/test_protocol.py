"""The Face SDK's protocol with no socket, no event loop and no real time.

:class:`FaceProtocol` is fed frames and the time and drained of frames and
events, as websockets' protocol tests do: every test here is a plain
function, so nothing can depend on scheduling, and a two-minute wait costs
nothing (the clock is a number the test moves).
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from halfpi.client.errors import ConnectionLost
from halfpi.config import PROTOCOL_VERSION
from halfpi.face.commands import command_of
from halfpi.face.errors import AuthError, CommandError, OutcomeUnknown
from halfpi.face.events import (
    Accepted,
    Answered,
    Event,
    Failed,
    Received,
    StatusChanged,
    Updated,
)
from halfpi.face.incoming import Welcomed
from halfpi.face.outstanding import Command
from halfpi.face.protocol import FaceProtocol, HelloRefused
from halfpi.face.results import Result

Payload = dict[str, Any]
URL = "ws://mind.test/v1/face"
SAFE = ["face.chat", "face.conversation.snapshot", "face.subscribe"]
LIMITS = {"max_frame_bytes": 1 << 20, "max_chat_bytes": 1 << 16,
          "reliable_queue_messages": 1000, "reliable_queue_bytes": 1 << 24,
          "transient_queue_messages": 100, "transient_queue_bytes": 1 << 20}
WELCOME: Payload = {"principal_id": "p_1", "label": "test", "profile": "operator", "scopes": [],
                    "protocol": PROTOCOL_VERSION, "node_id": "n_1", "limits": LIMITS,
                    "features": []}


class Wire:
    """A FaceProtocol and the Mind's end of its connections, driven by hand."""

    def __init__(self, **kw: Any) -> None:
        ids = iter(range(1, 10_000))
        self.protocol = FaceProtocol("hpf_secret", "wire-test", rng=random.Random(7),
                                     new_id=lambda prefix: f"{prefix}-{next(ids)}", **kw)
        self.now = 100.0
        self.event_seq = 1
        self.gen = 0

    def connect(self, **welcome: Any) -> int:
        body = {**WELCOME, "heartbeat_s": 15.0, "replay_safe": SAFE, "event_seq": 1, **welcome}
        self.event_seq = int(body["event_seq"])
        self.gen = self.protocol.connection_made(URL, msgspec.convert(body, Welcomed), self.now)
        return self.gen

    def submit(self, type_: str, payload: Payload) -> Command:
        return self.protocol.submit(command_of(type_, payload))

    def sent(self) -> list[tuple[str, Payload]]:
        return [(f["type"], f["payload"]) for f in map(json.loads, self.protocol.data_to_send())]

    def feed(self, type_: str, payload: Payload | None = None, *, gap: int = 0,
             generation: int | None = None) -> list[Event]:
        self.event_seq += 1 + gap
        body = {**(payload or {}), "event_seq": self.event_seq}
        text = json.dumps({"type": type_, "payload": body})
        self.protocol.receive(text, self.now, generation=generation or self.gen)
        return self.protocol.events_received()

    def snapshot(self, cid: str, *contents: str, epoch: str = "e1") -> Payload:
        messages = [{"seq": i, "role": "user", "content": c, "request_id": f"u{i}", "ts": 1.0}
                    for i, c in enumerate(contents, 1)]
        return {"conversation": {"id": cid, "name": cid, "created_at": 1.0},
                "cursor": f"{epoch}.{len(contents)}", "epoch": epoch, "messages": messages,
                "has_more_older": False, "pending_chats": [], "pending_approvals": [],
                "active_runs": [], "tasks": [], "tool_history": [],
                "detail_mode": "transparent"}

    def event(self, cid: str, seq: int, content: str = "x", epoch: str = "e1") -> Payload:
        return {"conversation_id": cid, "seq": seq, "cursor": f"{epoch}.{seq}",
                "type": "chat.message", "ts": 1.0,
                "data": {"request_id": f"u{seq}", "role": "user", "content": content}}

    def follow(self, cid: str, *contents: str) -> str:
        """Follow ``cid`` and answer its subscribe with a snapshot; the
        subscribe's request_id."""
        self.protocol.follow(cid)
        (type_, sub), = self.sent()
        assert type_ == "face.subscribe" and sub["snapshot"] is True
        self.feed("face.accepted", {"request_id": sub["request_id"], "operation": "subscribe",
                                    "conversations": {cid: "live"}})
        self.feed("face.snapshot", {"request_id": sub["request_id"],
                                    **self.snapshot(cid, *contents)})
        return str(sub["request_id"])


def of(kind: type, events: list[Event]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


# -- the handshake ----------------------------------------------------------------


def test_hello_carries_the_token_the_client_and_the_protocol_the_mind_speaks() -> None:
    frame = json.loads(Wire().protocol.hello())
    assert frame["type"] == "face.hello"
    assert frame["payload"]["protocol"] == PROTOCOL_VERSION
    assert frame["payload"]["token"] == "hpf_secret"
    assert frame["payload"]["client"]["name"] == "wire-test"


def test_an_error_answering_the_hello_is_a_refusal_with_the_minds_words() -> None:
    error = {"type": "face.error", "payload": {"code": "unauthorized", "message": "bad token"}}
    with pytest.raises(HelloRefused) as info:
        Wire().protocol.welcome_of(json.dumps(error))
    assert info.value.reason == "bad token"


@pytest.mark.parametrize("text", ['{"type": "face.event", "payload": {}}', "not json", "[]"])
def test_anything_else_answering_the_hello_is_a_failed_attempt(text: str) -> None:
    with pytest.raises(ConnectionLost) as info:
        Wire().protocol.welcome_of(text)
    assert not isinstance(info.value, HelloRefused)


def test_the_welcome_sets_the_heartbeat_and_where_event_seq_starts() -> None:
    wire = Wire()
    wire.connect(heartbeat_s=5.0, event_seq=1)
    assert wire.protocol.heartbeat_s == 5.0
    assert wire.protocol.next_timer() == wire.now + 5.0
    assert of(StatusChanged, wire.protocol.events_received())[-1].status.state == "live"


# -- commands and their answers ------------------------------------------------------


def test_a_command_submitted_offline_goes_out_once_connected_and_only_then() -> None:
    wire = Wire()
    chat = {"request_id": "q-1", "conversation_id": "c", "content": "hi"}
    wire.submit("face.chat", chat)
    assert wire.sent() == []
    wire.connect()
    assert wire.sent() == [("face.chat", {"request_id": "q-1", "conversation_id": "c",
                                          "content": "hi"})]
    assert wire.protocol.sent_log == [(1, "face.chat", "q-1")]


def test_a_second_submit_with_the_same_request_id_is_the_same_command() -> None:
    wire = Wire()
    wire.connect()
    first = wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "a"})
    again = wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "a"})
    assert first is again
    assert [t for t, _ in wire.sent()] == ["face.chat"]


def test_accepted_then_result_answer_the_command_and_are_news_once() -> None:
    wire = Wire()
    wire.connect()
    wire.protocol.events_received()
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "a"})
    accepted = {"request_id": "q-1", "operation": "chat"}
    first = wire.feed("face.accepted", accepted)
    second = wire.feed("face.accepted", accepted)  # the Mind's answer to a replay
    result = wire.feed("face.result", {"request_id": "q-1", "status": "succeeded",
                                       "content": "hello"})
    assert [type(e) for e in first] == [Accepted, Received]
    assert second == []
    assert of(Answered, result)[0].value == Result("q-1", "succeeded", "hello")
    assert [e.type for e in of(Received, result)] == ["face.result"]


def test_a_refusal_fails_the_command_with_its_code() -> None:
    wire = Wire()
    wire.connect()
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "a"})
    events = wire.feed("face.error", {"request_id": "q-1", "code": "busy", "message": "",
                                      "retryable": True})
    failed, = of(Failed, events)
    assert isinstance(failed.error, CommandError) and failed.error.code == "busy"


def test_abandon_fails_the_callers_commands_not_the_clients_own() -> None:
    wire = Wire()
    wire.connect()
    wire.protocol.follow("c_1")
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "a"})
    wire.protocol.events_received()
    refused = AuthError(4003, "revoked")
    wire.protocol.abandon(refused)
    assert wire.protocol.events_received() == [Failed("q-1", refused)]
    assert len(wire.protocol.commands) == 0


# -- I6: what a new connection does with commands left from before --------------------


def test_I6_replay_safe_commands_are_resent_with_the_same_request_id() -> None:
    wire = Wire()
    wire.connect()
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "a"})
    before = wire.sent()
    wire.protocol.connection_lost()
    wire.connect(replay_safe=["face.chat"])
    assert wire.sent() == before
    assert wire.protocol.sent_log == [(1, "face.chat", "q-1"), (2, "face.chat", "q-1")]


def test_I6_an_unsafe_chat_on_the_wire_is_reconciled_by_reading_never_resent() -> None:
    wire = Wire()
    wire.connect()
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c_1",
                                       "content": "a"})
    wire.sent()
    wire.protocol.connection_lost()
    wire.connect(replay_safe=[])
    (type_, read), = wire.sent()
    assert (type_, read["conversation_id"]) == ("face.conversation.snapshot", "c_1")
    snap = wire.snapshot("c_1", "a")
    snap["messages"][0]["request_id"] = "q-1"
    snap["messages"].append({"seq": 2, "role": "assistant", "content": "hello",
                             "request_id": "q-1", "status": "succeeded", "ts": 1.0})
    events = wire.feed("face.snapshot", {"request_id": read["request_id"], **snap})
    assert of(Answered, events) == [
        Answered("q-1", Result("q-1", "succeeded", "hello", reconciled=True))
    ]
    assert of(Received, events) == []  # the client's own read is not the caller's news


def test_I6_a_reconciling_read_cut_off_is_read_again_on_the_next_connection() -> None:
    wire = Wire()
    wire.connect()
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c_1",
                                       "content": "a"})
    wire.protocol.connection_lost()
    wire.connect(replay_safe=[])
    first = wire.sent()
    wire.protocol.connection_lost()
    wire.connect(replay_safe=[])
    second = wire.sent()
    assert [t for t, _ in first] == [t for t, _ in second] == ["face.conversation.snapshot"]
    assert first[0][1]["request_id"] != second[0][1]["request_id"]
    events = wire.feed("face.error", {"request_id": second[0][1]["request_id"],
                                      "code": "conversation_not_found", "message": ""})
    failed, = of(Failed, events)
    assert isinstance(failed.error, OutcomeUnknown) and failed.request_id == "q-1"


def test_I6_an_unsafe_command_that_cannot_be_read_back_is_unknown_at_once() -> None:
    wire = Wire()
    wire.connect()
    wire.submit("face.approval.resolve", {"request_id": "r-1", "approval_id": "a",
                                                   "decision": "allow_once"})
    wire.protocol.connection_lost()
    wire.protocol.events_received()
    wire.connect(replay_safe=[])
    assert wire.sent() == []
    failed, = of(Failed, wire.protocol.events_received())
    assert isinstance(failed.error, OutcomeUnknown)


# -- resume, gaps, retries -----------------------------------------------------------


def test_a_reconnect_resubscribes_from_the_cursor_and_says_resumed_once_caught_up() -> None:
    wire = Wire()
    wire.connect()
    wire.follow("c_1", "a", "b")
    wire.protocol.connection_lost()
    wire.connect()
    (type_, sub), = wire.sent()
    assert type_ == "face.subscribe"
    assert sub["since"] == {"c_1": "e1.2"} and "snapshot" not in sub
    statuses = [e.status.state for e in of(StatusChanged, wire.protocol.events_received())]
    assert statuses == ["resuming"]
    wire.feed("face.accepted", {"request_id": sub["request_id"], "operation": "subscribe",
                                "conversations": {"c_1": "exact"}, "heads": {"c_1": "e1.3"}})
    events = wire.feed("face.event", wire.event("c_1", 3))
    assert of(Updated, events) == [Updated("face.event", "c_1")]
    status, = of(StatusChanged, events)
    assert (status.status.state, status.status.replayed) == ("resumed", 1)


def test_a_jump_in_event_seq_holds_the_conversation_until_its_resubscribe_is_accepted() -> None:
    wire = Wire()
    wire.connect()
    wire.follow("c_1", "a")
    events = wire.feed("face.event", wire.event("c_1", 3), gap=1)  # one message lost
    assert of(Received, events) == []
    (type_, sub), = wire.sent()
    assert (type_, sub["since"]) == ("face.subscribe", {"c_1": "e1.1"})
    # Still on the old subscription: not folded, the replay brings it.
    assert of(Updated, wire.feed("face.event", wire.event("c_1", 2))) == []
    assert wire.protocol.views["c_1"].seq == 1
    # A second loss while the resubscribe is on its way: no second one.
    wire.feed("face.pong", {}, gap=3)
    assert wire.sent() == []
    wire.feed("face.accepted", {"request_id": sub["request_id"], "operation": "subscribe",
                                "conversations": {"c_1": "exact"}})
    wire.feed("face.event", wire.event("c_1", 2))
    assert wire.protocol.views["c_1"].seq == 2


def test_a_refused_resubscribe_is_tried_again_after_a_jittered_pause() -> None:
    wire = Wire()
    wire.connect()
    wire.follow("c_1", "a")
    wire.feed("face.pong", {}, gap=1)
    (_, sub), = wire.sent()
    wire.feed("face.error", {"request_id": sub["request_id"], "code": "rate_limited",
                             "message": "", "retryable": True})
    due = wire.protocol.next_timer()
    assert due is not None and wire.now + 0.5 <= due <= wire.now + 1.5
    wire.protocol.handle_timer(due - 0.01)
    assert wire.sent() == []
    wire.protocol.handle_timer(due)
    (type_, again), = wire.sent()
    assert type_ == "face.subscribe" and again["since"] == sub["since"]
    assert again["request_id"] != sub["request_id"]


def test_a_refusal_that_is_not_retryable_is_not_retried() -> None:
    wire = Wire()
    wire.connect(heartbeat_s=3600.0)
    wire.follow("c_1", "a")
    wire.feed("face.pong", {}, gap=1)
    (_, sub), = wire.sent()
    wire.feed("face.error", {"request_id": sub["request_id"], "code": "forbidden",
                             "message": "", "retryable": False})
    assert wire.protocol.next_timer() == wire.now + 3600.0  # only the heartbeat


def test_a_refusal_that_is_not_retryable_is_told_with_its_reason() -> None:
    """on_update("refused", cid) with ``view.refused``: a Face learns that
    the conversation will not be followed (the headless face exits 1)."""
    wire = Wire()
    wire.connect()
    wire.follow("c_1", "a")
    wire.feed("face.pong", {}, gap=1)
    (_, sub), = wire.sent()
    events = wire.feed("face.error", {"request_id": sub["request_id"],
                                      "code": "conversation_not_found",
                                      "message": "no conversation c_1", "retryable": False})
    assert Updated("refused", "c_1") in events
    refused = wire.protocol.views["c_1"].refused
    assert refused is not None and refused.code == "conversation_not_found"


def test_a_retryable_refusal_is_not_told_as_refused() -> None:
    wire = Wire()
    wire.connect()
    wire.follow("c_1", "a")
    wire.feed("face.pong", {}, gap=1)
    (_, sub), = wire.sent()
    events = wire.feed("face.error", {"request_id": sub["request_id"], "code": "busy",
                                      "message": "", "retryable": True})
    assert Updated("refused", "c_1") not in events
    assert wire.protocol.views["c_1"].refused is None


# -- heartbeat (time passed in) --------------------------------------------------------


def test_a_silent_link_is_pinged_each_heartbeat_and_dead_after_dead_after_s() -> None:
    wire = Wire(dead_after_s=45.0)
    wire.connect(heartbeat_s=15.0)
    start = wire.now
    for tick in (15.0, 30.0):
        assert wire.protocol.next_timer() == start + tick
        wire.protocol.handle_timer(start + tick)
        assert wire.sent() == [("face.ping", {})]
    with pytest.raises(ConnectionLost) as info:
        wire.protocol.handle_timer(start + 45.0)
    assert info.value.describe() == "heartbeat lost"


def test_any_frame_from_the_mind_puts_the_next_ping_off() -> None:
    wire = Wire()
    wire.connect(heartbeat_s=15.0)
    wire.now += 10.0
    wire.feed("face.pong", {})
    assert wire.protocol.next_timer() == wire.now + 15.0
    wire.protocol.handle_timer(wire.now + 14.0)
    assert wire.sent() == []


# -- connections and generations -----------------------------------------------------


def test_a_frame_of_an_older_connection_changes_nothing() -> None:
    wire = Wire()
    old = wire.connect()
    wire.follow("c_1", "a")
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "b"})
    wire.protocol.connection_lost()
    wire.connect()
    wire.sent()
    wire.protocol.events_received()
    before = wire.protocol.views["c_1"].summary()
    for type_, payload in [("face.event", wire.event("c_1", 2)),
                           ("face.result", {"request_id": "q-1", "status": "failed"}),
                           ("face.pong", {})]:
        assert wire.feed(type_, payload, gap=5, generation=old) == []
    assert wire.protocol.views["c_1"].summary() == before
    assert wire.sent() == []  # not even the resubscribe a jump would cause
    assert wire.protocol.commands.get("q-1") is not None


def test_nothing_is_queued_while_disconnected() -> None:
    wire = Wire()
    wire.connect()
    wire.protocol.connection_lost()
    wire.protocol.follow("c_1")
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "b"})
    assert wire.protocol.next_timer() is None
    assert wire.sent() == []


def test_a_malformed_frame_is_ignored_and_the_next_one_is_not() -> None:
    wire = Wire()
    wire.connect()
    wire.submit("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "b"})
    wire.protocol.receive("{not json", wire.now, generation=wire.gen)
    wire.protocol.receive(json.dumps({"type": "face.event", "payload": {"event_seq": 2}}),
                          wire.now, generation=wire.gen)  # no conversation_id
    events = wire.feed("face.result", {"request_id": "q-1", "status": "succeeded"})
    assert of(Answered, events)[0].value.ok


# -- the live lists ---------------------------------------------------------------------


def test_the_lists_are_read_after_connecting_when_the_scope_allows() -> None:
    wire = Wire()
    wire.connect(scopes=["face:sessions:read"], features=["approval_summaries"])
    reads = wire.sent()
    wire.protocol.events_received()
    assert [t for t, _ in reads] == ["face.conversation.list", "face.approval.list"]
    events = wire.feed("face.result", {"request_id": reads[0][1]["request_id"],
                                       "status": "succeeded",
                                       "data": {"conversations": [
                                           {"id": "c_1", "name": "x", "created_at": 1.0}],
                                                "has_more": False}})
    assert events == [Updated("conversations", "")]
    assert list(wire.protocol.lists.conversations) == ["c_1"]


def test_no_lists_are_read_without_the_scope() -> None:
    wire = Wire()
    wire.connect(scopes=[], features=["approval_summaries"])
    assert wire.sent() == []
