"""The in-process journal: a bounded hot window per conversation (DESIGN §4.2, I4)."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from halfpi.config import JournalLimits
from halfpi.core.cursor import parse_cursor
from halfpi.core.outbound import DELTA, Message
from halfpi.core.replay import Exact, Reset, ResetReason, plan_resume
from halfpi.journal.memory import MemoryJournal

BIG = 10**12


def msg(conv: str, seq: int, size: int = 10) -> Message:
    """A journal entry of exactly ``size`` bytes."""
    m = Message("face.event", b"x" * size, conversation_id=conv, seq=seq, cursor=f"e.{seq}")
    assert m.size > size  # payload plus the fixed overhead of a retained message
    m.size = size  # what these tests bound is the journal's accounting, not msgspec
    return m


def limits(
    events: int = BIG, seconds: float = 300.0, per_conversation: int = BIG, total: int = BIG
) -> JournalLimits:
    return JournalLimits(
        events=events,
        seconds=seconds,
        bytes_per_conversation=per_conversation,
        bytes_total=total,
    )


def seqs(messages: list[Message] | None) -> list[int] | None:
    return None if messages is None else [m.seq for m in messages]


def held(j: MemoryJournal, conv: str) -> list[int]:
    _, floor, _ = j.window(conv)
    got = seqs(j.read_after(conv, floor, BIG))
    assert got is not None
    return got


# -- epoch and window -----------------------------------------------------------


def test_open_starts_an_empty_window_at_the_head() -> None:
    j = MemoryJournal()
    epoch = j.open("c1", 0)
    assert j.window("c1") == (epoch, 0, 0)
    assert j.read_after("c1", 0, 10) == []


def test_open_at_a_durable_head_holds_nothing_before_it() -> None:
    j = MemoryJournal()
    epoch = j.open("c1", 41)
    assert j.window("c1") == (epoch, 41, 41)
    assert j.read_after("c1", 40, 10) is None
    assert j.read_after("c1", 41, 10) == []


def test_reopening_keeps_the_epoch_and_the_window() -> None:
    j = MemoryJournal()
    epoch = j.open("c1", 0)
    j.append(msg("c1", 1), now=0.0)
    assert j.open("c1", 0) == epoch
    assert j.window("c1") == (epoch, 0, 1)


def test_a_new_journal_gives_a_new_epoch() -> None:
    epochs = {MemoryJournal().open("c1", 0) for _ in range(20)}
    assert len(epochs) == 20
    for epoch in epochs:
        assert "." not in epoch
        assert parse_cursor(f"{epoch}.5").epoch == epoch


def test_I4_cursor_from_before_a_restart_resets_with_epoch_changed() -> None:
    before = MemoryJournal()
    old_epoch = before.open("c1", 0)
    before.append(msg("c1", 1), now=0.0)
    after = MemoryJournal()  # the process restarted: the window is gone
    after.open("c1", 1)  # the durable head survives in the Store
    epoch, floor, head = after.window("c1")
    assert epoch != old_epoch
    plan = plan_resume(parse_cursor(f"{old_epoch}.1"), epoch=epoch, floor=floor, head=head)
    assert plan == Reset(ResetReason.EPOCH_CHANGED)


def test_append_moves_the_head_and_keeps_the_floor() -> None:
    j = MemoryJournal()
    epoch = j.open("c1", 0)
    for seq in range(1, 6):
        j.append(msg("c1", seq), now=float(seq))
    assert j.window("c1") == (epoch, 0, 5)
    assert j.total_bytes == 50


def test_conversations_have_separate_windows() -> None:
    j = MemoryJournal()
    j.open("c1", 0)
    j.open("c2", 100)
    j.append(msg("c1", 1), now=0.0)
    j.append(msg("c2", 101), now=0.0)
    j.append(msg("c1", 2), now=0.0)
    assert held(j, "c1") == [1, 2]
    assert held(j, "c2") == [101]
    assert j.window("c2")[1:] == (100, 101)


# -- read_after -----------------------------------------------------------------


def test_read_after_returns_exact_slices_of_the_shared_messages() -> None:
    j = MemoryJournal()
    j.open("c1", 0)
    appended = [msg("c1", seq) for seq in range(1, 11)]
    for m in appended:
        j.append(m, now=0.0)
    got = j.read_after("c1", 3, 4)
    assert got is not None
    assert [m.seq for m in got] == [4, 5, 6, 7]
    assert all(a is b for a, b in zip(got, appended[3:7], strict=True))
    assert seqs(j.read_after("c1", 0, 100)) == list(range(1, 11))
    assert seqs(j.read_after("c1", 8, 100)) == [9, 10]
    assert seqs(j.read_after("c1", 10, 100)) == []
    assert seqs(j.read_after("c1", 99, 100)) == []


def test_read_after_zero_limit_is_empty() -> None:
    j = MemoryJournal()
    j.open("c1", 0)
    j.append(msg("c1", 1), now=0.0)
    assert j.read_after("c1", 0, 0) == []


def test_read_after_below_the_floor_is_none() -> None:
    j = MemoryJournal(limits(events=2, seconds=0.0))
    j.open("c1", 0)
    for seq in range(1, 6):
        j.append(msg("c1", seq), now=float(seq))
    _, floor, head = j.window("c1")
    assert (floor, head) == (3, 5)
    assert j.read_after("c1", 2, 10) is None
    assert j.read_after("c1", 0, 10) is None
    assert seqs(j.read_after("c1", 3, 10)) == [4, 5]


def test_I4_window_and_plan_agree() -> None:
    j = MemoryJournal(limits(events=3, seconds=0.0))
    epoch = j.open("c1", 0)
    for seq in range(1, 11):
        j.append(msg("c1", seq), now=float(seq))
    e, floor, head = j.window("c1")
    for seq in range(0, 12):
        plan = plan_resume(parse_cursor(f"{epoch}.{seq}"), epoch=e, floor=floor, head=head)
        replay = j.read_after("c1", seq, BIG)
        if isinstance(plan, Exact):
            assert seqs(replay) == list(range(seq + 1, head + 1))
        else:
            assert replay is None or seq > head


# -- retention by count and time ------------------------------------------------


def test_count_bound_applies_only_to_events_older_than_seconds() -> None:
    j = MemoryJournal(limits(events=3, seconds=10.0))
    j.open("c1", 0)
    for seq in range(1, 7):
        j.append(msg("c1", seq), now=0.0)
    # All six are within the last 10 s: the time rule holds more, keep them all.
    assert held(j, "c1") == [1, 2, 3, 4, 5, 6]
    j.append(msg("c1", 7), now=20.0)
    # Now the old ones are past the horizon: only the last 3 events remain.
    assert held(j, "c1") == [5, 6, 7]
    assert j.window("c1")[1] == 4
    assert j.total_bytes == 30


def test_time_keeps_more_than_the_count_when_events_are_recent() -> None:
    j = MemoryJournal(limits(events=2, seconds=100.0))
    j.open("c1", 0)
    for seq in range(1, 11):
        j.append(msg("c1", seq), now=float(seq))
    assert held(j, "c1") == list(range(1, 11))
    j.append(msg("c1", 11), now=106.5)
    # Horizon 6.5: events at t <= 6 are old, and the count (2) is exceeded.
    assert held(j, "c1") == [7, 8, 9, 10, 11]
    j.append(msg("c1", 12), now=1000.0)
    assert held(j, "c1") == [11, 12]


def test_count_keeps_more_than_time_when_events_are_old() -> None:
    j = MemoryJournal(limits(events=4, seconds=1.0))
    j.open("c1", 0)
    for seq in range(1, 4):
        j.append(msg("c1", seq), now=float(seq))
    j.append(msg("c1", 4), now=500.0)
    assert held(j, "c1") == [1, 2, 3, 4]  # not over the count: nothing is dropped
    j.append(msg("c1", 5), now=501.0)
    assert held(j, "c1") == [2, 3, 4, 5]


def test_retention_uses_the_time_passed_in_not_a_clock() -> None:
    j = MemoryJournal(limits(events=1, seconds=60.0))
    j.open("c1", 0)
    j.append(msg("c1", 1), now=1_000.0)
    j.append(msg("c1", 2), now=1_059.0)
    assert held(j, "c1") == [1, 2]
    j.append(msg("c1", 3), now=1_061.0)
    assert held(j, "c1") == [2, 3]


def test_long_runs_stay_exact_after_internal_compaction() -> None:
    j = MemoryJournal(limits(events=10, seconds=0.0))
    epoch = j.open("c1", 0)
    for seq in range(1, 5001):
        j.append(msg("c1", seq), now=float(seq))
    assert j.window("c1") == (epoch, 4990, 5000)
    assert held(j, "c1") == list(range(4991, 5001))
    assert seqs(j.read_after("c1", 4995, 3)) == [4996, 4997, 4998]
    assert j.read_after("c1", 4989, 3) is None
    assert j.total_bytes == 100


# -- retention by bytes ---------------------------------------------------------


def test_per_conversation_byte_bound_wins_over_time_and_count() -> None:
    j = MemoryJournal(limits(per_conversation=250))
    j.open("c1", 0)
    for seq in range(1, 4):
        j.append(msg("c1", seq, size=100), now=0.0)
    assert held(j, "c1") == [2, 3]
    assert j.window("c1")[1] == 1
    assert j.total_bytes == 200


def test_per_conversation_byte_bound_keeps_the_newest_event() -> None:
    j = MemoryJournal(limits(per_conversation=250))
    j.open("c1", 0)
    j.append(msg("c1", 1, size=100), now=0.0)
    j.append(msg("c1", 2, size=1_000), now=0.0)
    assert held(j, "c1") == [2]
    assert j.window("c1")[1:] == (1, 2)
    assert j.total_bytes == 1_000


def test_per_conversation_byte_bound_does_not_touch_other_conversations() -> None:
    j = MemoryJournal(limits(per_conversation=250))
    j.open("c1", 0)
    j.open("c2", 0)
    j.append(msg("c2", 1, size=200), now=0.0)
    for seq in range(1, 5):
        j.append(msg("c1", seq, size=100), now=0.0)
    assert held(j, "c1") == [3, 4]
    assert held(j, "c2") == [1]


def test_global_byte_bound_sheds_the_globally_oldest_events_first() -> None:
    j = MemoryJournal(limits(total=500))
    j.open("a", 0)
    j.open("b", 0)
    j.append(msg("b", 1, size=100), now=0.0)  # the oldest event of all
    for seq in range(1, 5):
        j.append(msg("a", seq, size=100), now=0.0)
    assert j.total_bytes == 500
    j.append(msg("b", 2, size=100), now=0.0)
    assert j.total_bytes == 500
    assert held(j, "b") == [2]  # b's old event went first, though a is larger
    assert j.window("b")[1] == 1
    assert held(j, "a") == [1, 2, 3, 4]
    j.append(msg("b", 3, size=100), now=0.0)
    assert held(j, "a") == [2, 3, 4]  # then a's oldest
    assert held(j, "b") == [2, 3]
    assert j.total_bytes == 500


def test_global_byte_bound_may_empty_an_idle_window_but_never_drops_the_newest_event() -> None:
    j = MemoryJournal(limits(total=100))
    for conv in ("a", "b", "c"):
        j.open(conv, 0)
        j.append(msg(conv, 1, size=80), now=0.0)
        j.append(msg(conv, 2, size=80), now=0.0)
    assert held(j, "a") == []
    assert held(j, "b") == []
    assert held(j, "c") == [2]  # alone over the bound, but just appended: kept
    assert j.total_bytes == 80
    epoch, floor, head = j.window("a")
    assert (floor, head) == (2, 2)  # an empty window still resumes from its head
    assert plan_resume(parse_cursor(f"{epoch}.2"), epoch=epoch, floor=floor, head=head) == Exact(2)


def test_I4_cursor_into_what_the_global_bound_shed_gets_cursor_expired() -> None:
    j = MemoryJournal(limits(total=300))
    epoch = j.open("idle", 0)
    j.open("busy", 0)
    for seq in range(1, 4):
        j.append(msg("idle", seq, size=100), now=0.0)
    for seq in range(1, 3):
        j.append(msg("busy", seq, size=100), now=0.0)
    e, floor, head = j.window("idle")
    assert (floor, head) == (2, 3)
    for seq in (0, 1):  # their next event was shed: never a silent gap
        plan = plan_resume(parse_cursor(f"{epoch}.{seq}"), epoch=e, floor=floor, head=head)
        assert plan == Reset(ResetReason.CURSOR_EXPIRED)
        assert j.read_after("idle", seq, BIG) is None
    assert seqs(j.read_after("idle", 2, BIG)) == [3]


def test_appends_past_the_global_bound_touch_a_constant_number_of_windows() -> None:
    """The Mind-wide bound reached with many loaded windows: each further
    append sheds the globally oldest event without looking at every window
    (it once sorted them all, on every append)."""
    conversations = 2_000
    j = MemoryJournal(limits(total=conversations * 3 * 100))
    for n in range(conversations):
        j.open(f"c{n}", 0)
        for seq in range(1, 4):
            j.append(msg(f"c{n}", seq, size=100), now=0.0)
    j.open("busy", 0)
    before = j.windows_touched
    appends = 3_000
    for seq in range(1, appends + 1):
        j.append(msg("busy", seq, size=100), now=0.0)
    assert j.total_bytes <= conversations * 3 * 100
    assert j.windows_touched - before <= 3 * appends
    assert held(j, "c0") == []  # the oldest went first
    assert held(j, f"c{conversations - 1}") == [1, 2, 3]


def test_shed_messages_are_released_at_once() -> None:
    """The accounting is the memory: an entry the journal sheds is no longer
    referenced by it (it used to stay in the window until a compaction)."""
    j = MemoryJournal(limits(events=1, seconds=0.0, total=250))
    j.open("a", 0)
    j.open("b", 0)
    first = msg("a", 1, size=100)
    baseline = sys.getrefcount(first)
    j.append(first, now=0.0)
    assert sys.getrefcount(first) > baseline
    j.append(msg("a", 2, size=100), now=1.0)  # the count bound sheds a1
    assert sys.getrefcount(first) == baseline
    other = msg("b", 1, size=100)
    baseline = sys.getrefcount(other)
    j.append(other, now=1.0)
    j.append(msg("b", 2, size=100), now=1.0)  # the global bound sheds a2, then b1
    j.append(msg("b", 3, size=100), now=1.0)
    assert held(j, "b") == [2, 3]
    assert sys.getrefcount(other) == baseline


def test_many_shed_entries_do_not_grow_the_journal() -> None:
    """Entries shed by a window's own bounds leave no trace in the Mind-wide
    age order either (it is compacted), however long the Mind runs."""
    j = MemoryJournal(limits(events=5, seconds=0.0, total=10**9))
    j.open("idle", 0)
    j.append(msg("idle", 1), now=0.0)  # the globally oldest, kept for ever
    j.open("busy", 0)
    for seq in range(1, 20_001):
        j.append(msg("busy", seq), now=float(seq))
    assert held(j, "busy") == list(range(19_996, 20_001))
    assert j.aged_entries() <= 2 * 6 + 64


# -- property -------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    appends=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.integers(min_value=1, max_value=120),
            st.floats(min_value=0.0, max_value=5.0),
        ),
        max_size=80,
    ),
    events=st.integers(min_value=1, max_value=6),
    per_conversation=st.integers(min_value=50, max_value=600),
    total=st.integers(min_value=100, max_value=1_200),
)
def test_window_invariants(
    appends: list[tuple[str, int, float]], events: int, per_conversation: int, total: int
) -> None:
    j = MemoryJournal(
        limits(events=events, seconds=10.0, per_conversation=per_conversation, total=total)
    )
    head: dict[str, int] = {}
    sizes: dict[tuple[str, int], int] = {}
    times: dict[tuple[str, int], float] = {}
    now = 0.0
    for conv, size, step in appends:
        now += step
        if conv not in head:
            j.open(conv, 0)
            head[conv] = 0
        head[conv] += 1
        sizes[(conv, head[conv])] = size
        times[(conv, head[conv])] = now
        j.append(msg(conv, head[conv], size), now=now)

        # The appended-to window obeys its own bounds right after the append.
        kept = held(j, conv)
        window_bytes = sum(sizes[(conv, s)] for s in kept)
        assert window_bytes <= per_conversation or len(kept) == 1
        if len(kept) > events:
            assert times[(conv, kept[0])] >= now - 10.0

    total_held = 0
    for conv, last in head.items():
        _, floor, h = j.window(conv)
        kept = held(j, conv)
        # Exactly (floor, head], contiguous; the global bound may empty a
        # window, but never drops the event just appended.
        assert h == last
        assert kept == list(range(floor + 1, h + 1))
        assert j.read_after(conv, floor - 1, BIG) is None
        total_held += sum(sizes[(conv, s)] for s in kept)
    if appends:
        last_conv = appends[-1][0]
        assert held(j, last_conv)[-1] == head[last_conv]
    assert j.total_bytes == total_held
    # Within the Mind-wide bound, unless the newest event alone exceeds it.
    assert total_held <= total or sum(len(held(j, c)) for c in head) == 1


def test_journal_keeps_transient_messages_too() -> None:
    j = MemoryJournal()
    j.open("c1", 0)
    d = Message(
        "face.chat.delta",
        None,
        kind=DELTA,
        conversation_id="c1",
        seq=1,
        cursor="e.1",
        request_id="r1",
        text="hi",
    )
    j.append(d, now=0.0)
    assert j.read_after("c1", 0, 10) == [d]
