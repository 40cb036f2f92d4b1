"""ConversationView: the pure reducer every Face folds the Mind's messages through.

No sockets: a snapshot (DESIGN §4.1) and ``face.event`` / ``face.chat.delta``
payloads go in, the messages and streaming replies a Face shows come out.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfpi.core.events import Snapshot
from halfpi.face.view import (
    APPLIED,
    DUPLICATE,
    RESYNC,
    TERMINAL_EVENTS,
    ConversationView,
    StreamingReply,
    ViewMessage,
)

CID = "c_01"
EPOCH = "4e376ec7"

Payload = dict[str, Any]


def cursor(seq: int, epoch: str = EPOCH) -> str:
    return f"{epoch}.{seq}"


def snapshot(
    seq: int,
    *,
    epoch: str = EPOCH,
    messages: list[Payload] | None = None,
    pending_chats: list[Payload] | None = None,
    name: str = "plans",
    **extra: Any,
) -> Snapshot:
    snap: Payload = {
        "conversation": {"id": CID, "name": name, "created_at": 1.0},
        "cursor": cursor(seq, epoch),
        "epoch": epoch,
        "messages": messages or [],
        "has_more_older": False,
        "pending_chats": pending_chats or [],
        "pending_approvals": [],
        "active_runs": [],
        "tasks": [],
        "tool_history": [],
        "detail_mode": "transparent",
    }
    snap.update(extra)
    return msgspec.convert(snap, Snapshot)


def message(
    seq: int, role: str, content: str, request_id: str | None, status: str | None = None
) -> Payload:
    return {
        "seq": seq,
        "role": role,
        "content": content,
        "request_id": request_id,
        "status": status,
        "ts": 1.0,
    }


def event(seq: int, kind: str, *, epoch: str = EPOCH, **data: Any) -> Payload:
    return {
        "conversation_id": CID,
        "seq": seq,
        "cursor": cursor(seq, epoch),
        "event_seq": 100 + seq,
        "type": kind,
        "data": data,
        "ts": 1.0,
    }


def delta(
    seq: int, request_id: str, text: str, *, first_seq: int | None = None, epoch: str = EPOCH
) -> Payload:
    p: Payload = {
        "conversation_id": CID,
        "seq": seq,
        "cursor": cursor(seq, epoch),
        "event_seq": 100 + seq,
        "request_id": request_id,
        "text": text,
    }
    if first_seq is not None:
        p["first_seq"] = first_seq
    return p


def view_at(seq: int = 0, **kw: Any) -> ConversationView:
    view = ConversationView(CID)
    view.apply_snapshot(snapshot(seq, **kw))
    return view


def streaming_view() -> ConversationView:
    """Cursor 4: a user message at 3, its reply q2 started at 4 and streaming."""
    view = view_at(
        2,
        messages=[message(1, "user", "hi", "q1"), message(2, "assistant", "hi", "q1", "succeeded")],
    )
    assert (
        view.apply(
            "face.event",
            event(3, "chat.message", request_id="q2", role="user", content="hello world"),
        )
        is APPLIED
    )
    assert (
        view.apply("face.event", event(4, "chat.started", request_id="q2", run_id="r2")) is APPLIED
    )
    return view


# -- snapshot, then events ---------------------------------------------------


def test_fresh_view_is_not_ready_and_has_no_cursor() -> None:
    view = ConversationView(CID)
    assert not view.ready
    assert view.cursor is None


def test_snapshot_sets_cursor_epoch_name_and_messages() -> None:
    view = view_at(
        6,
        messages=[
            message(1, "user", "hello", "q1"),
            message(6, "assistant", "hello", "q1", "succeeded"),
        ],
        has_more_older=True,
    )
    assert view.ready
    assert view.cursor == cursor(6)
    assert (view.epoch, view.seq, view.name) == (EPOCH, 6, "plans")
    assert view.has_more_older is True
    assert view.detail_mode == "transparent"
    assert view.messages == [
        ViewMessage(1, "user", "hello", "q1", None),
        ViewMessage(6, "assistant", "hello", "q1", "succeeded"),
    ]
    assert view.streaming == {}


def test_a_later_snapshot_replaces_everything() -> None:
    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", "partial"))
    view.apply_snapshot(
        snapshot(40, epoch="b0b0", messages=[message(39, "user", "new", "q9")], name="renamed")
    )
    assert view.cursor == "b0b0.40"
    assert view.name == "renamed"
    assert view.messages == [ViewMessage(39, "user", "new", "q9", None)]
    assert view.streaming == {}


def test_snapshot_then_events_build_messages_and_streaming() -> None:
    view = streaming_view()
    assert view.apply("face.chat.delta", delta(5, "q2", "hello")) is APPLIED
    assert view.apply("face.chat.delta", delta(6, "q2", " world")) is APPLIED
    assert view.streaming == {"q2": StreamingReply("q2", "r2", "hello world", "running")}
    assert view.cursor == cursor(6)
    assert view.summary() == {
        "messages": [
            (1, "user", "hi", "q1", None, None),
            (2, "assistant", "hi", "q1", "succeeded", None),
            (3, "user", "hello world", "q2", None, None),
        ],
        "streaming": ["q2"],
        "tools": [],
        "tasks": [],
    }

    done = event(
        7, "chat.completed", request_id="q2", run_id="r2", status="succeeded", content="hello world"
    )
    assert view.apply("face.event", done) is APPLIED
    assert view.streaming == {}
    assert view.messages[-1] == ViewMessage(7, "assistant", "hello world", "q2", "succeeded")
    assert view.cursor == cursor(7)


def test_user_message_defaults_to_role_user() -> None:
    view = view_at(0)
    view.apply("face.event", event(1, "chat.message", request_id="q1", content="no role given"))
    assert view.messages == [ViewMessage(1, "user", "no role given", "q1", None)]


# -- dedupe ------------------------------------------------------------------


@pytest.mark.parametrize("seq", [5, 4, 1, 0])
@pytest.mark.parametrize("kind", ["event", "delta", "terminal"])
def test_message_at_or_below_cursor_is_duplicate_and_changes_nothing(seq: int, kind: str) -> None:
    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", "abc"))
    assert view.cursor == cursor(5)
    before = copy.deepcopy(view)
    if kind == "event":
        type_, payload = "face.event", event(seq, "chat.message", request_id="qx", content="again")
    elif kind == "delta":
        type_, payload = "face.chat.delta", delta(seq, "q2", "again")
    else:
        type_, payload = (
            "face.event",
            event(seq, "chat.completed", request_id="q2", status="succeeded", content="abc"),
        )
    assert view.apply(type_, payload) is DUPLICATE
    assert view == before


def test_event_exactly_at_cursor_is_duplicate() -> None:
    view = view_at(7)
    before = copy.deepcopy(view)
    assert (
        view.apply("face.event", event(7, "chat.message", request_id="q", content="x")) is DUPLICATE
    )
    assert view == before


def test_coalesced_delta_entirely_at_or_below_cursor_is_duplicate() -> None:
    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", "a"))
    view.apply("face.chat.delta", delta(6, "q2", "b"))
    before = copy.deepcopy(view)
    assert view.apply("face.chat.delta", delta(6, "q2", "ab", first_seq=5)) is DUPLICATE
    assert view == before


def test_replayed_overlap_is_absorbed() -> None:
    view = streaming_view()
    stream = [delta(5, "q2", "one"), delta(6, "q2", " two")]
    for p in stream:
        view.apply("face.chat.delta", p)
    # A resume from an older cursor replays 5 and 6 again, then 7 is new.
    outcomes = [view.apply("face.chat.delta", p) for p in [*stream, delta(7, "q2", " three")]]
    assert outcomes == [DUPLICATE, DUPLICATE, APPLIED]
    assert view.streaming["q2"].text == "one two three"


# -- RESYNC: what cannot be placed exactly -----------------------------------


@pytest.mark.parametrize("seq", [1, 4, 5, 99])
def test_event_of_another_epoch_needs_resync(seq: int) -> None:
    # Even a seq at or below the cursor: in another epoch it is not the same event.
    view = streaming_view()
    before = copy.deepcopy(view)
    p = event(seq, "chat.message", epoch="ffff0000", request_id="q", content="x")
    assert view.apply("face.event", p) is RESYNC
    assert view == before


def test_delta_of_another_epoch_needs_resync() -> None:
    view = streaming_view()
    before = copy.deepcopy(view)
    assert view.apply("face.chat.delta", delta(5, "q2", "x", epoch="ffff0000")) is RESYNC
    assert view == before


@pytest.mark.parametrize("first_seq", [4, 3, 1])
def test_coalesced_delta_straddling_cursor_needs_resync(first_seq: int) -> None:
    # Cursor 4; a merged delta covering first_seq..6: part of it may already be
    # folded in, and there is no way to tell which characters.
    view = streaming_view()
    before = copy.deepcopy(view)
    assert view.apply("face.chat.delta", delta(6, "q2", "abc", first_seq=first_seq)) is RESYNC
    assert view == before


def test_delta_of_unknown_reply_needs_resync() -> None:
    view = streaming_view()
    before = copy.deepcopy(view)
    assert view.apply("face.chat.delta", delta(5, "q-never-started", "x")) is RESYNC
    assert view == before


@pytest.mark.parametrize(
    ("type_", "payload"),
    [
        ("face.event", event(1, "chat.message", request_id="q1", content="x")),
        ("face.event", event(1, "run.changed")),
        ("face.chat.delta", delta(1, "q1", "x")),
    ],
)
def test_anything_before_a_snapshot_needs_resync(type_: str, payload: Payload) -> None:
    view = ConversationView(CID)
    before = copy.deepcopy(view)
    assert view.apply(type_, payload) is RESYNC
    assert view == before
    assert not view.ready


def test_view_forgotten_by_caller_needs_resync_again() -> None:
    # The client forgets a view (seq = -1) when it asks for a fresh snapshot;
    # everything until that snapshot must be refused, not folded.
    view = streaming_view()
    view.seq = -1
    assert view.cursor is None
    assert view.apply("face.chat.delta", delta(5, "q2", "x")) is RESYNC
    assert view.streaming["q2"].text == ""


def test_non_conversation_type_is_refused() -> None:
    view = view_at(3)
    with pytest.raises(ValueError, match="not a conversation message"):
        view.apply("face.result", event(4, "chat.message"))
    assert view.seq == 3


# -- coalesced deltas --------------------------------------------------------


def test_coalesced_delta_appends_text_and_advances_cursor_to_last_seq() -> None:
    view = streaming_view()
    assert view.apply("face.chat.delta", delta(8, "q2", "hello big world", first_seq=5)) is APPLIED
    assert view.streaming["q2"].text == "hello big world"
    assert view.cursor == cursor(8)
    # Every seq it covered now counts as seen.
    for seq in (5, 6, 7, 8):
        assert view.apply("face.chat.delta", delta(seq, "q2", "again")) is DUPLICATE
    assert view.apply("face.chat.delta", delta(9, "q2", "!")) is APPLIED
    assert view.streaming["q2"].text == "hello big world!"


def test_coalesced_delta_after_a_gap_is_applied() -> None:
    # seq gaps are normal (filtered transient types); only overlap is refused.
    view = streaming_view()
    assert view.apply("face.chat.delta", delta(12, "q2", "xy", first_seq=10)) is APPLIED
    assert view.cursor == cursor(12)


def test_coalesced_and_single_deltas_give_the_same_text() -> None:
    single, merged = streaming_view(), streaming_view()
    for seq, text in [(5, "a"), (6, "bc"), (7, ""), (8, "d")]:
        single.apply("face.chat.delta", delta(seq, "q2", text))
    merged.apply("face.chat.delta", delta(6, "q2", "abc", first_seq=5))
    merged.apply("face.chat.delta", delta(8, "q2", "d", first_seq=7))
    assert single == merged


# -- terminal events ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "content"),
    [
        ("chat.completed", "succeeded", ""),  # a success is always a message
        ("chat.completed", "succeeded", "hello"),
        ("chat.failed", "failed", ""),  # …and so is every other end, text or not
        ("chat.failed", "failed", "half a rep"),
        ("chat.failed", "timed_out", ""),
        ("chat.failed", "timed_out", "slow"),
        ("chat.cancelled", "cancelled", ""),
        ("chat.cancelled", "cancelled", "said before the cancel"),
        ("chat.interrupted", "interrupted", ""),
        ("chat.interrupted", "interrupted", "cut short"),
    ],
)
def test_terminal_event_ends_streaming_and_keeps_every_reply_with_its_status(
    kind: str, status: str, content: str
) -> None:
    assert kind in TERMINAL_EVENTS
    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", content))
    before = list(view.messages)
    p = event(6, kind, request_id="q2", run_id="r2", status=status, content=content)
    assert view.apply("face.event", p) is APPLIED
    assert "q2" not in view.streaming
    assert view.cursor == cursor(6)
    assert view.messages == [*before, ViewMessage(6, "assistant", content, "q2", status)]


def test_a_failed_reply_keeps_its_code_and_reason_live_and_from_a_snapshot() -> None:
    view = streaming_view()
    data = {"status": "failed", "content": "", "error_code": "agent_bad_input",
            "reason": "tool arguments are not JSON"}
    view.apply("face.event", event(6, "chat.failed", request_id="q2", run_id="r2", **data))
    live = view.messages[-1]
    assert (live.status, live.error_code, live.reason) == (
        "failed", "agent_bad_input", "tool arguments are not JSON"
    )
    wire = {**message(6, "assistant", "", "q2", "failed"),
            "error_code": "agent_bad_input", "reason": "tool arguments are not JSON"}
    resynced = ConversationView(CID)
    resynced.apply_snapshot(snapshot(6, messages=[wire]))
    assert resynced.messages[-1] == live


def test_terminal_content_is_the_events_not_the_streamed_text() -> None:
    # The terminal event carries the final truth; a Face that missed deltas
    # (summary subscription, transient_types=[]) still shows the right reply.
    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", "hel"))
    view.apply(
        "face.event",
        event(9, "chat.completed", request_id="q2", status="succeeded", content="hello"),
    )
    assert view.messages[-1] == ViewMessage(9, "assistant", "hello", "q2", "succeeded")


def test_terminal_leaves_other_streams_alone() -> None:
    view = streaming_view()
    view.apply("face.event", event(5, "chat.started", request_id="q3", run_id="r3"))
    view.apply("face.chat.delta", delta(6, "q3", "other"))
    view.apply(
        "face.event", event(7, "chat.cancelled", request_id="q2", status="cancelled", content="")
    )
    assert sorted(view.streaming) == ["q3"]
    assert view.streaming["q3"].text == "other"


# -- cancel requested --------------------------------------------------------


def test_cancel_requested_marks_the_streaming_reply() -> None:
    view = streaming_view()
    view.mark_cancel_requested("q2")
    assert view.streaming["q2"].status == "cancel_requested"
    # It keeps streaming until the terminal event arrives.
    assert view.apply("face.chat.delta", delta(5, "q2", "still")) is APPLIED
    assert view.streaming["q2"] == StreamingReply("q2", "r2", "still", "cancel_requested")
    view.apply(
        "face.event",
        event(6, "chat.cancelled", request_id="q2", status="cancelled", content="still"),
    )
    assert view.streaming == {}
    assert view.messages[-1] == ViewMessage(6, "assistant", "still", "q2", "cancelled")


def test_cancel_requested_for_an_unknown_reply_changes_nothing() -> None:
    view = streaming_view()
    before = copy.deepcopy(view)
    view.mark_cancel_requested("q-unknown")
    assert view == before


def test_cancel_requested_does_not_move_the_cursor() -> None:
    view = streaming_view()
    view.mark_cancel_requested("q2")
    assert view.cursor == cursor(4)


# -- pending chats in a snapshot ----------------------------------------------


def test_snapshot_pending_chats_restore_the_streaming_text() -> None:
    view = view_at(
        5,
        messages=[message(3, "user", "hello world", "q2")],
        pending_chats=[
            {
                "request_id": "q2",
                "run_id": "r2",
                "status": "running",
                "text_so_far": "hello",
                "started_at": 1.0,
            }
        ],
    )
    assert view.streaming == {"q2": StreamingReply("q2", "r2", "hello", "running")}
    assert view.summary()["streaming"] == ["q2"]
    assert view.apply("face.chat.delta", delta(6, "q2", " world")) is APPLIED
    assert view.streaming["q2"].text == "hello world"


def test_snapshot_pending_chat_with_cancel_requested_keeps_that_status() -> None:
    view = view_at(
        5,
        pending_chats=[
            {
                "request_id": "q2",
                "run_id": "r2",
                "status": "cancel_requested",
                "text_so_far": "",
                "started_at": 1.0,
            }
        ],
    )
    assert view.streaming["q2"].status == "cancel_requested"


# -- other kinds ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["run.changed", "hand.connected", "hand.disconnected", "kind.from.the.future"]
)
def test_unknown_event_kinds_still_advance_the_cursor(kind: str) -> None:
    view = streaming_view()
    before = view.summary()
    assert view.apply("face.event", event(5, kind, anything=1)) is APPLIED
    assert view.cursor == cursor(5)
    assert view.summary() == before
    assert view.apply("face.event", event(5, kind)) is DUPLICATE


def test_event_without_data_is_accepted() -> None:
    view = view_at(1)
    p = event(2, "run.changed")
    del p["data"]
    assert view.apply("face.event", p) is APPLIED
    assert view.seq == 2


def test_conversation_changed_renames() -> None:
    view = view_at(1)
    conversation = {"id": CID, "name": "renamed", "created_at": 1.0}
    view.apply("face.event", event(2, "conversation.changed", conversation=conversation,
                                   change="renamed"))
    assert view.name == "renamed"


def tool_called(seq: int, tool_call_id: str = "t1", tool: str = "exec_command") -> Payload:
    return event(seq, "chat.tool_called", request_id="q2", tool_call_id=tool_call_id, tool=tool)


def test_a_tool_card_says_awaiting_approval_then_running_then_its_end() -> None:
    view = streaming_view()
    view.apply("face.event", tool_called(5))
    card = view.tool_cards["t1"]
    assert card.seq == 5  # placed under its message, before the reply
    view.apply("face.event", event(6, "approval.requested", approval_id="a1", request_id="q2",
                                   tool_call_id="t1", tool="exec_command"))
    assert view.tool_phase(card) == "awaiting approval"
    view.apply("face.event", event(7, "approval.resolved", approval_id="a1", status="allowed",
                                   decision="allow_once", decided_by="p_1",
                                   decided_by_label="laptop", tool_call_id="t1"))
    view.apply("face.event", event(8, "run.changed", run_id="x1", tool_call_id="t1",
                                   status="queued"))
    assert view.tool_phase(card) == "queued"
    view.apply("face.event", event(9, "run.changed", run_id="x1", tool_call_id="t1",
                                   status="running"))
    assert view.tool_phase(card) == "running"
    view.apply("face.event", event(10, "chat.tool_completed", tool_call_id="t1",
                                   status="failed", success=False, output_bytes=4,
                                   result={"stdout": "", "stderr": "no\n", "exit_code": 2}))
    assert view.tool_phase(card) == "failed (exit 2) · allowed by laptop"


def test_an_interrupted_reply_says_what_was_shown_but_not_saved() -> None:
    """The Mind keeps a reply's text by checkpoints (DESIGN §5): after a
    crash the reply can be shorter than what this Face showed. The view
    says so instead of letting the words vanish — after a reset (snapshot)
    and live alike; a reply whose every word was saved says nothing."""
    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", "alpha bravo"))
    view.apply("face.chat.delta", delta(6, "q2", " charlie"))
    saved = message(7, "assistant", "alpha bravo", "q2", "interrupted")
    view.apply_snapshot(snapshot(7, epoch="e2", messages=[saved]))
    assert view.messages[-1].unsaved == " charlie"

    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", "alpha bravo charlie"))
    view.apply("face.event", event(6, "chat.interrupted", request_id="q2",
                                   status="interrupted", content="alpha"))
    assert view.messages[-1].unsaved == " bravo charlie"

    view = streaming_view()
    view.apply("face.chat.delta", delta(5, "q2", "alpha"))
    view.apply("face.event", event(6, "chat.interrupted", request_id="q2",
                                   status="interrupted", content="alpha"))
    assert view.messages[-1].unsaved is None


def test_a_tool_card_keeps_its_output_live_and_from_a_snapshot() -> None:
    """The output (transparent only) is kept as sent: stdout then stderr,
    line breaks and all; a summary card has none, a cut one says so."""
    listing = "total 8\n-rw-r--r-- 1 me me 0 a\n-rw-r--r-- 1 me me 0 b\n"
    view = streaming_view()
    view.apply("face.event", tool_called(5))
    view.apply("face.event", event(6, "chat.tool_completed", tool_call_id="t1", status="failed",
                                   success=False, output_bytes=60, truncated=True,
                                   result={"stdout": listing, "stderr": "ls: x: denied\n",
                                           "exit_code": 2}))
    card = view.tool_cards["t1"]
    assert card.output == listing + "ls: x: denied\n"
    assert card.truncated

    record = {"tool_call_id": "t1", "request_id": "q2", "tool": "exec_command",
              "status": "succeeded", "seq": 3, "output_bytes": len(listing),
              "result": {"stdout": listing, "stderr": "", "exit_code": 0}}
    summary = {**record, "result": None}
    view = ConversationView(CID)
    view.apply_snapshot(snapshot(4, tool_history=[record]))
    assert (view.tool_cards["t1"].output, view.tool_cards["t1"].truncated) == (listing, False)
    view.apply_snapshot(snapshot(4, tool_history=[summary]))
    assert view.tool_cards["t1"].output is None


def test_a_denied_tool_card_says_who_denied_it() -> None:
    view = streaming_view()
    view.apply("face.event", tool_called(5))
    view.apply("face.event", event(6, "approval.requested", approval_id="a1", request_id="q2",
                                   tool_call_id="t1"))
    view.apply("face.event", event(7, "approval.resolved", approval_id="a1", status="denied",
                                   decision="deny_once", decided_by="p_9",
                                   decided_by_label="phone", tool_call_id="t1"))
    view.apply("face.event", event(8, "chat.tool_completed", tool_call_id="t1", status="denied",
                                   success=False, error_category="denied"))
    assert view.tool_phase(view.tool_cards["t1"]) == "denied by phone"


def test_a_snapshot_shows_a_waiting_call_as_awaiting_approval() -> None:
    view = ConversationView(CID)
    record = {"tool_call_id": "t1", "request_id": "q2", "tool": "exec_command",
              "status": "running", "seq": 3}
    approval = {"approval_id": "a1", "request_id": "q2", "tool_call_id": "t1",
                "tool": "exec_command"}
    view.apply_snapshot(snapshot(4, tool_history=[record], pending_approvals=[approval]))
    card = view.tool_cards["t1"]
    assert (card.seq, view.tool_phase(card)) == (3, "awaiting approval")


def test_tool_cards_approvals_and_tasks() -> None:
    view = streaming_view()
    view.apply(
        "face.event",
        event(
            5,
            "chat.tool_called",
            request_id="q2",
            tool_call_id="t1",
            tool="read_file",
            args={"path": "/x"},
        ),
    )
    assert view.tool_cards["t1"].status == "running"
    view.apply(
        "face.event",
        event(6, "approval.requested", approval_id="a1", request_id="q2", tool_call_id="t1"),
    )
    assert "a1" in view.pending_approvals
    view.apply("face.event", event(7, "approval.resolved", approval_id="a1", decision="allow_once"))
    assert view.pending_approvals == {}
    view.apply(
        "face.event",
        event(
            8, "chat.tool_completed", tool_call_id="t1", success=True, output_bytes=3, digest="d"
        ),
    )
    card = view.tool_cards["t1"]
    assert (card.status, card.success, card.output_bytes, card.digest) == (
        "succeeded",
        True,
        3,
        "d",
    )
    view.apply("face.event", event(9, "task.progress", task=task("k1", "running")))
    assert view.tasks["k1"].state == "running"


# -- property: a snapshot at any point, then the rest, equals the whole log ----

TERMINALS = [
    ("chat.completed", "succeeded"),
    ("chat.failed", "failed"),
    ("chat.failed", "timed_out"),
    ("chat.cancelled", "cancelled"),
    ("chat.interrupted", "interrupted"),
]
OTHER_KINDS = ["run.changed", "hand.connected", "task.progress.future"]
Wire = tuple[str, Payload]


@st.composite
def logs(draw: st.DrawFn) -> list[Wire]:
    """A plausible conversation log: chats start, stream, end; other events interleave."""
    out: list[Wire] = []
    active: dict[str, list[str]] = {}
    seq = 0
    chats = 0
    short_text = st.text(alphabet="ab é🎉", max_size=4)
    for _ in range(draw(st.integers(0, 30))):
        choices = ["chat", "other", "gap"] + (["delta", "delta", "delta", "end"] if active else [])
        op = draw(st.sampled_from(choices))
        if op == "gap":  # a seq this subscription never sees (filtered transient)
            seq += 1
            continue
        if op == "chat":
            chats += 1
            rid = f"q{chats}"
            seq += 1
            out.append(
                (
                    "face.event",
                    event(
                        seq, "chat.message", request_id=rid, role="user", content=draw(short_text)
                    ),
                )
            )
            seq += 1
            out.append(
                ("face.event", event(seq, "chat.started", request_id=rid, run_id=f"r{chats}"))
            )
            active[rid] = []
        elif op == "delta":
            rid = draw(st.sampled_from(sorted(active)))
            text = draw(short_text)
            active[rid].append(text)
            seq += 1
            out.append(("face.chat.delta", delta(seq, rid, text)))
        elif op == "end":
            rid = draw(st.sampled_from(sorted(active)))
            kind, status = draw(st.sampled_from(TERMINALS))
            content = "".join(active.pop(rid))
            seq += 1
            out.append(
                (
                    "face.event",
                    event(seq, kind, request_id=rid, run_id="r", status=status, content=content),
                )
            )
        else:
            seq += 1
            out.append(("face.event", event(seq, draw(st.sampled_from(OTHER_KINDS)))))
    return out


def mind_snapshot(log: list[Wire], k: int) -> Snapshot:
    """What the Mind's snapshot says after the first ``k`` messages (docs/protocol.md §7)."""
    prefix = log[:k]
    seq = prefix[-1][1]["seq"] if prefix else 0
    messages: list[Payload] = []
    pending: dict[str, Payload] = {}
    for type_, p in prefix:
        if type_ == "face.chat.delta":
            pending[p["request_id"]]["text_so_far"] += p["text"]
            continue
        kind, data = p["type"], p["data"]
        if kind == "chat.message":
            messages.append(message(p["seq"], "user", data["content"], data["request_id"]))
        elif kind == "chat.started":
            pending[data["request_id"]] = {
                "request_id": data["request_id"],
                "run_id": data["run_id"],
                "status": "running",
                "text_so_far": "",
                "started_at": 1.0,
            }
        elif kind in TERMINAL_EVENTS:
            pending.pop(data["request_id"])
            messages.append(
                message(p["seq"], "assistant", data["content"], data["request_id"], data["status"])
            )
    return snapshot(seq, messages=messages, pending_chats=list(pending.values()))


def coalesce(suffix: list[Wire], merge: list[bool]) -> list[Wire]:
    """Merge adjacent deltas of one reply the way a pressured queue does."""
    out: list[Wire] = []
    for i, (type_, p) in enumerate(suffix):
        if out and type_ == "face.chat.delta" and merge[i % len(merge)]:
            prev_type, prev = out[-1]
            if prev_type == "face.chat.delta" and prev["request_id"] == p["request_id"]:
                merged = dict(p)
                merged["text"] = prev["text"] + p["text"]
                merged["first_seq"] = prev.get("first_seq", prev["seq"])
                out[-1] = (type_, merged)
                continue
        out.append((type_, dict(p)))
    return out


def fold(start: Snapshot, messages: list[Wire]) -> ConversationView:
    view = ConversationView(CID)
    view.apply_snapshot(start)
    for type_, p in messages:
        assert view.apply(type_, p) is APPLIED, (type_, p)
    return view


def shown(view: ConversationView) -> tuple[Any, ...]:
    texts = {rid: (r.text, r.status) for rid, r in view.streaming.items()}
    return view.summary(), view.cursor, texts


@settings(max_examples=300, deadline=None)
@given(log=logs(), data=st.data())
def test_snapshot_at_any_point_then_the_rest_equals_the_whole_log(
    log: list[Wire], data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(log)), label="snapshot after")
    merge = data.draw(st.lists(st.booleans(), min_size=1, max_size=8), label="coalesce")
    whole = fold(mind_snapshot(log, 0), log)
    resumed = fold(mind_snapshot(log, k), coalesce(log[k:], merge))
    assert shown(resumed) == shown(whole)
    # And both equal what the Mind would report at the end of the log.
    end = ConversationView(CID)
    end.apply_snapshot(mind_snapshot(log, len(log)))
    assert shown(whole) == shown(end)


@settings(max_examples=200, deadline=None)
@given(log=logs(), data=st.data())
def test_replaying_from_an_older_position_changes_nothing(
    log: list[Wire], data: st.DataObject
) -> None:
    # A resume from an older cursor re-delivers events the view already has:
    # each is DUPLICATE and the result is the same as an exact resume.
    k = data.draw(st.integers(0, len(log)), label="snapshot after")
    j = data.draw(st.integers(0, k), label="replay from")
    view = ConversationView(CID)
    view.apply_snapshot(mind_snapshot(log, k))
    outcomes = [view.apply(type_, p) for type_, p in log[j:]]
    assert outcomes == [DUPLICATE] * (k - j) + [APPLIED] * (len(log) - k)
    assert shown(view) == shown(fold(mind_snapshot(log, 0), log))


# -- background tasks (DESIGN §8) ------------------------------------------------


def task(task_id: str, state: str, **fields: Any) -> Payload:
    return {"task_id": task_id, "conversation_id": CID, "hand": "dev", "tool": "exec_command",
            "state": state, "stale": False, "created_at": 1.0, **fields}


def test_task_events_fold_into_one_line_per_task_with_its_state() -> None:
    view = view_at(2, tasks=[task("k1", "running", stale=True)])
    assert view.task_lines() == [
        "task k1 exec_command on dev: running · stale (its Hand is away)"]
    assert view.apply("face.event", event(3, "task.started", task=task("k2", "queued",
                                                                       created_at=2.0))) is APPLIED
    assert view.apply("face.event", event(4, "task.completed", task=task(
        "k1", "failed", exit_code=2))) is APPLIED
    assert view.task_lines() == ["task k1 exec_command on dev: failed (exit 2)",
                                 "task k2 exec_command on dev: queued"]
    assert view.summary()["tasks"] == [("k1", "failed"), ("k2", "open")]


def test_a_dead_task_says_why() -> None:
    view = view_at(1, tasks=[task("k1", "dead", error="no Hand acknowledged the task")])
    assert view.task_lines() == [
        "task k1 exec_command on dev: dead (no Hand acknowledged the task)"]


def test_a_late_progress_never_reopens_a_task_that_ended() -> None:
    view = view_at(1, tasks=[task("k1", "running")])
    view.apply("face.event", event(2, "task.completed", task=task("k1", "lost")))
    # A transient progress taken before the end but published after it.
    view.apply("face.event", event(3, "task.progress", task=task("k1", "queued", stale=True)))
    assert view.tasks["k1"].state == "lost"
    assert view.summary()["tasks"] == [("k1", "lost")]
