"""The per-connection outbound queue policy (DESIGN §4, §11, I7), with no I/O."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from halfpi.core.limits import QueueLimits
from halfpi.core.outbound import (
    DELTA,
    PROGRESS,
    RELIABLE,
    Message,
    OutboundQueue,
    frame_prefix,
    message,
    splice,
)

ROOMY = QueueLimits(
    reliable_messages=1000,
    reliable_bytes=1_000_000,
    transient_messages=1000,
    transient_bytes=1_000_000,
)
EVERYTHING = 10**9


def _cursor(seq: int) -> str:
    return f"ep.{seq}"


def event(conv: str, seq: int, type_: str = "chat.message") -> Message:
    body = msgspec.json.encode(
        {"conversation_id": conv, "seq": seq, "cursor": _cursor(seq), "type": type_, "data": {}}
    )
    return Message("face.event", body, conversation_id=conv, seq=seq, cursor=_cursor(seq))


def delta(conv: str, seq: int, text: str, request_id: str = "r1") -> Message:
    m = Message(
        "face.chat.delta",
        None,
        kind=DELTA,
        conversation_id=conv,
        seq=seq,
        cursor=_cursor(seq),
        request_id=request_id,
        text=text,
    )
    m.encoded_body()  # encoded once, shared by every subscriber
    return m


def progress(conv: str, seq: int, stream: str, data: str = "out") -> Message:
    body = msgspec.json.encode(
        {
            "conversation_id": conv,
            "seq": seq,
            "cursor": _cursor(seq),
            "tool_call_id": stream,
            "kind": "stdout",
            "data": data,
            "gap": False,
        }
    )
    return Message(
        "face.chat.tool.progress",
        body,
        kind=PROGRESS,
        conversation_id=conv,
        seq=seq,
        cursor=_cursor(seq),
        stream=stream,
    )


def decode(frames: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(f) for f in frames]


def drain(q: OutboundQueue) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while len(q):
        out += decode(q.take(EVERYTHING))
    return out


def event_seqs(frames: list[dict[str, Any]]) -> list[int]:
    return [f["payload"]["event_seq"] for f in frames]


# -- framing and event_seq -------------------------------------------------------


def test_frame_splices_event_seq_into_the_shared_body() -> None:
    m = message("face.result", {"request_id": "r1", "status": "succeeded"})
    frame = m.frame(7)
    assert frame.startswith(frame_prefix("face.result"))
    assert json.loads(frame) == {
        "type": "face.result",
        "payload": {"event_seq": 7, "request_id": "r1", "status": "succeeded"},
    }


def test_frame_of_an_empty_payload() -> None:
    assert json.loads(message("face.pong", {}).frame(3)) == {
        "type": "face.pong",
        "payload": {"event_seq": 3},
    }


def test_I7_event_seq_is_contiguous_from_one_in_emission_order() -> None:
    q = OutboundQueue(ROOMY)
    for seq in range(1, 6):
        assert q.push(event("c1", seq), pressured=False)
    frames: list[dict[str, Any]] = []
    while len(q):
        frames += decode(q.take(1))  # one frame per call
    assert event_seqs(frames) == [1, 2, 3, 4, 5]
    assert [f["payload"]["seq"] for f in frames] == [1, 2, 3, 4, 5]
    assert q.event_seq == 5


def test_take_always_emits_at_least_one_frame_and_respects_the_budget() -> None:
    q = OutboundQueue(ROOMY)
    for seq in range(1, 11):
        q.push(event("c1", seq), pressured=False)
    one = q.take(1)
    assert len(one) == 1
    size = len(one[0])
    two = q.take(size + 1)  # the first frame leaves budget, the second exhausts it
    assert len(two) == 2
    assert len(q) == 7
    assert q.take(EVERYTHING) and len(q) == 0
    assert q.take(EVERYTHING) == []


def test_emit_now_shares_the_connection_counter() -> None:
    q = OutboundQueue(ROOMY)
    q.push(event("c1", 1), pressured=False)
    q.push(event("c1", 2), pressured=False)
    assert event_seqs(decode(q.take(EVERYTHING))) == [1, 2]
    now = json.loads(q.emit_now(event("c1", 3)))
    assert now["payload"]["event_seq"] == 3
    assert (q.reliable_count, q.reliable_bytes) == (0, 0)
    assert q.written_cursors == {"c1": _cursor(3)}


def test_a_new_queue_starts_at_event_seq_one() -> None:
    first = OutboundQueue(ROOMY)
    first.push(event("c1", 1), pressured=False)
    first.take(EVERYTHING)
    second = OutboundQueue(ROOMY)
    second.push(event("c1", 2), pressured=False)
    assert event_seqs(decode(second.take(EVERYTHING))) == [1]


# -- coalescing ----------------------------------------------------------------


def test_I7_deltas_are_not_coalesced_without_pressure() -> None:
    q = OutboundQueue(ROOMY)
    for seq, text in enumerate(["a", "b", "c"], start=1):
        q.push(delta("c1", seq, text), pressured=False)
    frames = drain(q)
    assert [f["payload"]["text"] for f in frames] == ["a", "b", "c"]
    assert all("first_seq" not in f["payload"] for f in frames)


def test_I7_deltas_coalesce_under_pressure_losslessly() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 4, "hello "), pressured=False)
    q.push(delta("c1", 5, "big "), pressured=True)
    q.push(delta("c1", 6, "world"), pressured=True)
    assert len(q) == 1
    assert q.transient_count == 1
    [frame] = drain(q)
    assert frame["type"] == "face.chat.delta"
    assert frame["payload"] == {
        "event_seq": 1,
        "conversation_id": "c1",
        "seq": 6,
        "cursor": _cursor(6),
        "first_seq": 4,
        "request_id": "r1",
        "text": "hello big world",
    }


def test_I7_coalescing_never_crosses_a_reliable_message_of_the_conversation() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 1, "a"), pressured=True)
    q.push(event("c1", 2, "chat.tool_called"), pressured=True)
    q.push(delta("c1", 3, "b"), pressured=True)
    frames = drain(q)
    assert [(f["type"], f["payload"]["seq"]) for f in frames] == [
        ("face.chat.delta", 1),
        ("face.event", 2),
        ("face.chat.delta", 3),
    ]
    assert "first_seq" not in frames[2]["payload"]


def test_I7_coalescing_never_crosses_progress_of_the_conversation() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 1, "a"), pressured=True)
    q.push(progress("c1", 2, "t1"), pressured=True)
    q.push(delta("c1", 3, "b"), pressured=True)
    assert [f["payload"]["seq"] for f in drain(q)] == [1, 2, 3]


def test_I7_deltas_of_different_requests_are_not_merged() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 1, "a", request_id="r1"), pressured=True)
    q.push(delta("c1", 2, "b", request_id="r2"), pressured=True)
    frames = drain(q)
    assert [(f["payload"]["request_id"], f["payload"]["text"]) for f in frames] == [
        ("r1", "a"),
        ("r2", "b"),
    ]


def test_I7_coalescing_merges_into_the_tail_of_the_same_conversation_only() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 1, "a"), pressured=True)
    q.push(delta("c2", 1, "x"), pressured=True)
    q.push(delta("c1", 2, "b"), pressured=True)
    q.push(event("c2", 2), pressured=True)
    q.push(delta("c2", 3, "y"), pressured=True)
    frames = drain(q)
    summary = [
        (f["payload"]["conversation_id"], f["type"], f["payload"].get("text")) for f in frames
    ]
    assert summary == [
        ("c1", "face.chat.delta", "ab"),
        ("c2", "face.chat.delta", "x"),
        ("c2", "face.event", None),
        ("c2", "face.chat.delta", "y"),
    ]
    assert event_seqs(frames) == [1, 2, 3, 4]


def test_I7_a_delta_is_not_merged_into_one_already_written() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 1, "a"), pressured=True)
    assert decode(q.take(EVERYTHING))[0]["payload"]["text"] == "a"
    q.push(delta("c1", 2, "b"), pressured=True)
    [frame] = drain(q)
    assert frame["payload"]["text"] == "b"
    assert frame["payload"]["seq"] == 2
    assert "first_seq" not in frame["payload"]


def test_coalescing_does_not_change_the_shared_messages() -> None:
    first, second = delta("c1", 1, "a"), delta("c1", 2, "b")
    q = OutboundQueue(ROOMY)
    q.push(first, pressured=True)
    q.push(second, pressured=True)
    drain(q)
    # Another connection may hold the same objects: they must be untouched.
    assert (first.text, first.seq, first.first_seq) == ("a", 1, 1)
    assert (second.text, second.seq, second.first_seq) == ("b", 2, 2)
    assert json.loads(first.frame(1))["payload"]["text"] == "a"


def test_coalesced_delta_shrinks_the_transient_bytes() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 1, "a" * 100), pressured=True)
    one = q.transient_bytes
    q.push(delta("c1", 2, "b" * 100), pressured=True)
    assert q.transient_count == 1
    assert one < q.transient_bytes < 2 * one


# -- dropping progress -----------------------------------------------------------

TIGHT_TRANSIENT = QueueLimits(
    reliable_messages=1000,
    reliable_bytes=1_000_000,
    transient_messages=2,
    transient_bytes=1_000_000,
)


def test_I7_progress_dropped_under_pressure_consumes_an_event_seq_and_marks_a_gap() -> None:
    q = OutboundQueue(TIGHT_TRANSIENT)
    assert q.push(progress("c1", 1, "t1", "one"), pressured=True)
    assert q.push(progress("c1", 2, "t1", "two"), pressured=True)
    assert q.push(progress("c1", 3, "t1", "three"), pressured=True)
    assert len(q) == 3  # the placeholder keeps its place
    assert q.transient_count == 2
    frames = drain(q)
    assert [f["payload"]["data"] for f in frames] == ["two", "three"]
    assert event_seqs(frames) == [2, 3]  # event_seq 1 was the dropped one
    assert [f["payload"]["gap"] for f in frames] == [True, False]
    assert q.event_seq == 3


def test_I7_gap_marks_only_the_stream_whose_progress_was_dropped() -> None:
    q = OutboundQueue(TIGHT_TRANSIENT)
    q.push(progress("c1", 1, "t1", "a"), pressured=True)
    q.push(progress("c1", 2, "t2", "b"), pressured=True)
    q.push(progress("c1", 3, "t1", "c"), pressured=True)
    frames = drain(q)
    assert [
        (f["payload"]["tool_call_id"], f["payload"]["data"], f["payload"]["gap"]) for f in frames
    ] == [("t2", "b", False), ("t1", "c", True)]
    assert event_seqs(frames) == [2, 3]


def test_I7_progress_is_not_dropped_without_pressure() -> None:
    q = OutboundQueue(TIGHT_TRANSIENT)
    assert q.push(progress("c1", 1, "t1", "a"), pressured=False)
    assert q.push(progress("c1", 2, "t1", "b"), pressured=False)
    frames = drain(q)
    assert [f["payload"]["data"] for f in frames] == ["a", "b"]
    assert not any(f["payload"]["gap"] for f in frames)


def test_I7_dropping_progress_never_drops_reliable_or_deltas() -> None:
    q = OutboundQueue(TIGHT_TRANSIENT)
    q.push(event("c1", 1), pressured=True)
    q.push(delta("c2", 1, "a"), pressured=True)
    q.push(progress("c3", 1, "t1", "x"), pressured=True)
    q.push(progress("c3", 2, "t1", "y"), pressured=True)
    frames = drain(q)
    assert [(f["type"], f["payload"]["conversation_id"], f["payload"]["seq"]) for f in frames] == [
        ("face.event", "c1", 1),
        ("face.chat.delta", "c2", 1),
        ("face.chat.tool.progress", "c3", 2),
    ]
    assert event_seqs(frames) == [1, 2, 4]
    assert frames[2]["payload"]["gap"] is True


def test_I7_progress_dropped_by_transient_bytes() -> None:
    first = progress("c1", 1, "t1", "a" * 100)
    bound = first.size * 3 // 2
    limits = QueueLimits(transient_messages=1000, transient_bytes=bound)
    q = OutboundQueue(limits)
    assert first.size < bound < 2 * first.size
    q.push(first, pressured=True)
    q.push(progress("c1", 2, "t1", "b" * 100), pressured=True)
    assert q.transient_bytes <= bound
    frames = drain(q)
    assert [f["payload"]["data"][0] for f in frames] == ["b"]
    assert frames[0]["payload"]["gap"] is True


def test_I7_delta_over_transient_bound_sheds_progress_before_evicting() -> None:
    q = OutboundQueue(TIGHT_TRANSIENT)
    assert q.push(progress("c1", 1, "t1", "a"), pressured=True)
    assert q.push(progress("c1", 2, "t1", "b"), pressured=True)
    assert q.push(delta("c2", 1, "hello"), pressured=True)


# -- reliable overflow and eviction ---------------------------------------------


def test_I7_reliable_overflow_by_count_asks_for_eviction() -> None:
    q = OutboundQueue(QueueLimits(reliable_messages=2))
    assert q.push(event("c1", 1), pressured=True)
    assert q.push(event("c1", 2), pressured=True)
    assert not q.push(event("c1", 3), pressured=True)


def test_I7_reliable_overflow_by_bytes_asks_for_eviction() -> None:
    m = event("c1", 1)
    q = OutboundQueue(QueueLimits(reliable_bytes=m.size * 2 + m.size // 2))
    assert q.push(m, pressured=True)
    assert q.push(event("c1", 2), pressured=True)
    assert not q.push(event("c1", 3), pressured=True)


def test_I7_reliable_room_is_released_when_written() -> None:
    q = OutboundQueue(QueueLimits(reliable_messages=2))
    q.push(event("c1", 1), pressured=True)
    q.push(event("c1", 2), pressured=True)
    q.take(EVERYTHING)
    assert (q.reliable_count, q.reliable_bytes) == (0, 0)
    assert q.push(event("c1", 3), pressured=True)
    assert q.push(event("c1", 4), pressured=True)


def test_I7_transient_messages_do_not_use_reliable_room() -> None:
    q = OutboundQueue(QueueLimits(reliable_messages=1))
    for seq in range(1, 20):
        q.push(delta("c1", seq, "x", request_id=f"r{seq}"), pressured=False)
    assert q.push(event("c1", 20), pressured=True)
    assert q.reliable_count == 1


def test_I7_evict_returns_cursor_of_last_written_message_per_conversation() -> None:
    q = OutboundQueue(ROOMY)
    q.push(event("c1", 1), pressured=False)
    q.push(event("c2", 7), pressured=False)
    q.push(event("c1", 2), pressured=False)
    q.push(message("face.result", {"request_id": "r1", "status": "succeeded"}), pressured=False)
    q.push(event("c1", 3), pressured=False)  # never written
    q.push(event("c2", 8), pressured=False)  # never written
    written = [q.take(1) for _ in range(4)]
    assert all(len(w) == 1 for w in written)
    assert q.evict() == {"c1": _cursor(2), "c2": _cursor(7)}
    assert len(q) == 0
    assert (q.reliable_count, q.reliable_bytes, q.transient_count, q.transient_bytes) == (
        0,
        0,
        0,
        0,
    )
    assert q.take(EVERYTHING) == []


def test_I7_evict_reports_the_last_cursor_of_a_coalesced_delta() -> None:
    q = OutboundQueue(ROOMY)
    q.push(delta("c1", 1, "a"), pressured=True)
    q.push(delta("c1", 2, "b"), pressured=True)
    q.take(EVERYTHING)
    assert q.evict() == {"c1": _cursor(2)}


def test_I7_evict_before_anything_was_written_has_no_cursors() -> None:
    q = OutboundQueue(ROOMY)
    q.push(event("c1", 1), pressured=False)
    assert q.evict() == {}


def test_I7_dropped_progress_is_not_a_written_position() -> None:
    q = OutboundQueue(TIGHT_TRANSIENT)
    q.push(event("c1", 1), pressured=True)
    q.take(EVERYTHING)
    for seq in (2, 3, 4):
        q.push(progress("c1", seq, "t1"), pressured=True)
    q.take(1)  # skips the dropped placeholder, writes seq 3
    assert q.evict() == {"c1": _cursor(3)}


# -- property: lossless coalescing, event_seq accounting ---------------------------

PROPERTY_LIMITS = QueueLimits(
    reliable_messages=100_000,
    reliable_bytes=100_000_000,
    transient_messages=3,
    transient_bytes=1_500,
)

conversations = st.sampled_from(["c1", "c2"])
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("delta"),
            conversations,
            st.sampled_from(["r1", "r2"]),
            st.text(min_size=1, max_size=6),
            st.booleans(),
        ),
        st.tuples(st.just("event"), conversations, st.booleans()),
        st.tuples(st.just("progress"), conversations, st.sampled_from(["t1", "t2"]), st.booleans()),
        st.tuples(st.just("take"), st.integers(min_value=1, max_value=400)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_I7_queue_property_lossless_and_event_seq_exact(ops: list[tuple[Any, ...]]) -> None:
    q = OutboundQueue(PROPERTY_LIMITS)
    next_seq: dict[str, int] = defaultdict(int)
    pushed_text: dict[tuple[str, str], str] = defaultdict(str)
    pushed_progress: dict[str, list[int]] = defaultdict(list)  # stream -> seqs
    pushed_events: dict[str, list[int]] = defaultdict(list)
    emitted: list[dict[str, Any]] = []

    for op in ops:
        if op[0] == "take":
            emitted += decode(q.take(op[1]))
            continue
        conv = op[1]
        next_seq[conv] += 1
        seq = next_seq[conv]
        if op[0] == "delta":
            _, _, request_id, text, pressured = op
            pushed_text[(conv, request_id)] += text
            q.push(delta(conv, seq, text, request_id), pressured=pressured)
        elif op[0] == "event":
            pushed_events[conv].append(seq)
            q.push(event(conv, seq), pressured=op[2])
        else:
            stream = f"{conv}/{op[2]}"
            pushed_progress[stream].append(seq)
            q.push(progress(conv, seq, stream), pressured=op[3])
    emitted += drain(q)

    # Lossless coalescing: every reply's text arrives whole and in order.
    got_text: dict[tuple[str, str], str] = defaultdict(str)
    for f in emitted:
        if f["type"] == "face.chat.delta":
            p = f["payload"]
            got_text[(p["conversation_id"], p["request_id"])] += p["text"]
            assert p.get("first_seq", p["seq"]) <= p["seq"]
    assert got_text == {k: v for k, v in pushed_text.items() if v}

    # event_seq: emitted ones strictly increase; with the dropped ones they are 1..n.
    seqs = event_seqs(emitted)
    assert seqs == sorted(set(seqs))
    emitted_progress = [f for f in emitted if f["type"] == "face.chat.tool.progress"]
    dropped = sum(map(len, pushed_progress.values())) - len(emitted_progress)
    assert dropped >= 0
    assert len(seqs) + dropped == q.event_seq
    assert all(1 <= s <= q.event_seq for s in seqs)

    # Nothing reliable is lost, and a conversation's order is never changed.
    got_events: dict[str, list[int]] = defaultdict(list)
    last_seq: dict[str, int] = defaultdict(int)
    for f in emitted:
        p = f["payload"]
        assert p.get("first_seq", p["seq"]) > last_seq[p["conversation_id"]]
        last_seq[p["conversation_id"]] = p["seq"]
        if f["type"] == "face.event":
            got_events[p["conversation_id"]].append(p["seq"])
    assert got_events == pushed_events

    # gap is true exactly when the previous progress of the stream was dropped.
    emitted_by_stream: dict[str, set[int]] = defaultdict(set)
    for f in emitted_progress:
        emitted_by_stream[f["payload"]["tool_call_id"]].add(f["payload"]["seq"])
    for f in emitted_progress:
        p = f["payload"]
        sent = pushed_progress[p["tool_call_id"]]
        index = sent.index(p["seq"])
        previous_dropped = index > 0 and sent[index - 1] not in emitted_by_stream[p["tool_call_id"]]
        assert p["gap"] is previous_dropped

    # Accounting balances once everything is written.
    assert (q.reliable_count, q.reliable_bytes, q.transient_count, q.transient_bytes) == (
        0,
        0,
        0,
        0,
    )


def test_kinds_are_distinct() -> None:
    assert len({RELIABLE, DELTA, PROGRESS}) == 3


@given(
    payload=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=20), max_size=4),
    event_seq=st.integers(min_value=1, max_value=10**12),
)
def test_a_body_framed_at_once_is_the_frame_a_message_makes(
    payload: dict[str, Any], event_seq: int
) -> None:
    """Replayed journal entries are framed without a Message (the queue's
    ``emit_body``): byte for byte the frame a Message of them makes."""
    body = msgspec.json.encode(payload)
    prefix = frame_prefix("face.event")
    assert splice(prefix, event_seq, body) == Message("face.event", body).frame(event_seq)
    frame = json.loads(splice(prefix, event_seq, body))
    assert frame == {"type": "face.event", "payload": {"event_seq": event_seq, **payload}}


def test_emit_body_takes_the_next_event_seq_and_the_queue_learns_the_cursor_written() -> None:
    q = OutboundQueue(ROOMY)
    assert json.loads(q.emit_now(message("face.pong", {})))["payload"]["event_seq"] == 1
    body = b'{"conversation_id":"c1","seq":7}'
    frame = json.loads(q.emit_body(frame_prefix("face.event"), body))
    assert frame["payload"] == {"event_seq": 2, "conversation_id": "c1", "seq": 7}
    q.wrote("c1", "ep.7")
    assert q.event_seq == 2
    assert q.evict() == {"c1": "ep.7"}


def test_a_queue_counts_what_it_merged_dropped_and_evicted_for_metrics() -> None:
    q = OutboundQueue(TIGHT_TRANSIENT)
    assert (q.coalesced, q.shed, q.evicted) == (0, 0, 0)
    q.push(delta("c1", 1, "a"), pressured=False)
    q.push(delta("c1", 2, "b"), pressured=True)
    q.push(delta("c1", 3, "c"), pressured=True)
    assert q.coalesced == 2
    for seq in (4, 5, 6):
        q.push(progress("c2", seq, "t1"), pressured=True)
    assert q.shed == 2  # two transient places: one delta, one progress kept
    q.evict()
    assert q.evicted == 1
