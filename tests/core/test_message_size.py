"""``Message.size`` is the memory a retained message really holds, so the
journal's byte bounds (DESIGN §4.2) bound memory, not an estimate of it."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import msgspec

from halfpi.core.outbound import DELTA, Message


def event(seq: int, body_bytes: int) -> Message:
    body = msgspec.json.encode(
        {"seq": seq, "type": "chat.tool_completed", "data": {"stdout": "x" * body_bytes}}
    )
    return Message("face.event", body, conversation_id="c_1", seq=seq, cursor=f"ep0123.{seq}")


def delta(seq: int, text_chars: int) -> Message:
    m = Message(
        "face.chat.delta",
        None,
        kind=DELTA,
        conversation_id="c_1",
        seq=seq,
        cursor=f"ep0123.{seq}",
        request_id="r-1",
        text=f"{seq:08d}" + "w" * text_chars,
    )
    m.encoded_body()  # as the actor does: encode once, before anyone shares it
    return m


def retained(make: Callable[[int], Message], n: int = 2_000) -> tuple[int, int]:
    """(bytes really allocated, bytes accounted) for ``n`` messages kept the
    way a journal keeps them: framed once, in lists with their seq and time."""
    items: list[Message] = []
    seqs: list[int] = []
    times: list[float] = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            m = make(1_000_000 + i)
            m.frame(1)
            items.append(m)
            seqs.append(m.seq)
            times.append(i + 0.5)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return used, sum(m.size for m in items)


def test_message_size_covers_a_large_event_and_its_framed_copy() -> None:
    used, accounted = retained(lambda seq: event(seq, 4_000))
    assert used <= accounted <= used * 1.15, (used, accounted)


def test_message_size_covers_a_small_event() -> None:
    used, accounted = retained(lambda seq: event(seq, 10))
    assert used <= accounted <= used * 1.3, (used, accounted)


def test_message_size_covers_a_one_word_delta() -> None:
    used, accounted = retained(lambda seq: delta(seq, 5))
    assert used <= accounted <= used * 1.3, (used, accounted)


def test_message_size_covers_a_long_delta() -> None:
    used, accounted = retained(lambda seq: delta(seq, 3_000))
    assert used <= accounted <= used * 1.15, (used, accounted)


def test_message_size_counts_its_summary_variant() -> None:
    full = event(1, 2_000)
    summary = event(1, 10)
    alone = full.size
    full.with_summary(summary)
    assert full.summary is summary
    assert full.size == alone + summary.size
