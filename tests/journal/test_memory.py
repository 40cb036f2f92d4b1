"""The in-process journal: a bounded hot window per conversation (DESIGN §4.2, I4)."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from halfpi.config import JournalLimits
from halfpi.core.cursor import parse_cursor
from halfpi.core.outbound import DELTA, PROGRESS, RELIABLE, Message
from halfpi.core.replay import Exact, Reset, ResetReason, plan_resume
from halfpi.journal.base import JournalEntry, entry_of, message_of
from halfpi.journal.memory import MemoryJournal, entry_size

BIG = 10**12


def entry(seq: int, size: int = 10, ts: float = 0.0) -> JournalEntry:
    """An entry whose body is ``size`` bytes."""
    return JournalEntry(seq, RELIABLE, "face.event", b"x" * size, ts)


def add(j: MemoryJournal, conv: str, seq: int, size: int = 10, now: float = 0.0) -> int:
    """Append one entry; what it weighs in the journal's accounting."""
    e = entry(seq, size, now)
    assert j.append(conv, e) is None  # in the journal at once
    return entry_size(e)


def size_of(n: int) -> int:
    return entry_size(entry(1, n))


U = size_of(100)


def limits(
    events: int = BIG, seconds: float = 300.0, per_conversation: int = BIG, total: int = BIG
) -> JournalLimits:
    return JournalLimits(
        events=events,
        seconds=seconds,
        bytes_per_conversation=per_conversation,
        bytes_total=total,
    )


def seqs(entries: list[JournalEntry] | None) -> list[int] | None:
    return None if entries is None else [e.seq for e in entries]


def window(j: MemoryJournal, conv: str) -> tuple[str, int, int]:
    w = j.window_now(conv)
    return w.epoch, w.floor, w.head


def held(j: MemoryJournal, conv: str) -> list[int]:
    floor = j.window_now(conv).floor
    got = seqs(j.read_after_now(conv, floor, BIG))
    assert got is not None
    return got


# -- epoch and window -----------------------------------------------------------


def test_open_starts_an_empty_window_at_the_head() -> None:
    j = MemoryJournal()
    epoch = j.open_now("c1", 0)
    assert window(j, "c1") == (epoch, 0, 0)
    assert j.read_after_now("c1", 0, 10) == []


def test_open_at_a_durable_head_holds_nothing_before_it() -> None:
    j = MemoryJournal()
    epoch = j.open_now("c1", 41)
    assert window(j, "c1") == (epoch, 41, 41)
    assert j.read_after_now("c1", 40, 10) is None
    assert j.read_after_now("c1", 41, 10) == []


def test_reopening_keeps_the_epoch_and_the_window() -> None:
    j = MemoryJournal()
    epoch = j.open_now("c1", 0)
    add(j, "c1", 1, now=0.0)
    assert j.open_now("c1", 0) == epoch
    assert window(j, "c1") == (epoch, 0, 1)


def test_a_new_journal_gives_a_new_epoch() -> None:
    epochs = {MemoryJournal().open_now("c1", 0) for _ in range(20)}
    assert len(epochs) == 20
    for epoch in epochs:
        assert "." not in epoch
        assert parse_cursor(f"{epoch}.5").epoch == epoch


def test_I4_cursor_from_before_a_restart_resets_with_epoch_changed() -> None:
    before = MemoryJournal()
    old_epoch = before.open_now("c1", 0)
    add(before, "c1", 1, now=0.0)
    after = MemoryJournal()  # the process restarted: the window is gone
    after.open_now("c1", 1)  # the durable head survives in the Store
    epoch, floor, head = window(after, "c1")
    assert epoch != old_epoch
    plan = plan_resume(parse_cursor(f"{old_epoch}.1"), epoch=epoch, floor=floor, head=head)
    assert plan == Reset(ResetReason.EPOCH_CHANGED)


def test_append_moves_the_head_and_keeps_the_floor() -> None:
    j = MemoryJournal()
    epoch = j.open_now("c1", 0)
    for seq in range(1, 6):
        add(j, "c1", seq, now=float(seq))
    assert window(j, "c1") == (epoch, 0, 5)
    assert j.total_bytes == 5 * size_of(10)


async def test_the_protocol_methods_answer_what_the_journal_holds() -> None:
    j = MemoryJournal()
    assert await j.open("c1", None, 3) == j.epoch
    add(j, "c1", 4)
    w = await j.window("c1")
    assert (w.epoch, w.floor, w.head) == (j.epoch, 3, 4)
    assert seqs(await j.read_after("c1", 3, 10)) == [4]
    assert await j.read_after("c1", 2, 10) is None


async def test_a_journal_holds_continuity_only_for_its_own_epoch() -> None:
    """The epoch is the Store's; the journal names the one to use. Another
    process's epoch gets this journal's (the Mind stores it: epoch_changed)."""
    j = MemoryJournal()
    assert await j.open("c1", "an-earlier-process", 0) == j.epoch != "an-earlier-process"
    assert await j.open("c2", j.epoch, 7) == j.epoch


async def test_a_released_window_reopens_empty_at_its_head_with_the_same_epoch_settled_there(
) -> None:
    j = MemoryJournal()
    epoch = await j.open("c1", None, 0)
    for seq in range(1, 4):
        add(j, "c1", seq)
    await j.release("c1")
    assert not j.holds("c1")
    assert j.total_bytes == 0
    # Loaded again: the head the Store gives (past the seq reservation).
    assert await j.open("c1", epoch, 4096) == epoch
    w = await j.window("c1")
    assert (w.floor, w.head, w.settled) == (4096, 4096, 4096)
    assert await j.read_after("c1", 2, 10) is None  # gone from the journal: the Store has it
    plan = plan_resume(
        parse_cursor(f"{epoch}.2"), epoch=w.epoch, floor=w.floor, head=w.head, settled=w.settled
    )
    assert plan == Exact(2, committed_until=4096)


async def test_a_released_window_leaves_nothing_behind() -> None:
    """Released windows are not kept alive by the Mind-wide age order (it is
    compacted), however many conversations come and go."""
    j = MemoryJournal()
    first = entry(1)
    baseline = sys.getrefcount(first)
    await j.open("c0", None, 0)
    j.append("c0", first)
    await j.release("c0")
    assert sys.getrefcount(first) == baseline
    for n in range(1, 2_000):
        await j.open(f"c{n}", None, 0)
        add(j, f"c{n}", 1)
        add(j, f"c{n}", 2)
        await j.release(f"c{n}")
    assert j.open_windows() == 0
    assert j.total_bytes == 0
    assert j.aged_entries() <= 64 * 2 + 2


def test_a_window_kept_across_a_reopen_keeps_its_entries_and_takes_the_new_head() -> None:
    """A journal that outlived its Mind (a Redis stream) keeps the window; the
    new Mind's head is past the old seq reservation."""
    j = MemoryJournal()
    j.open_now("c1", 0)
    add(j, "c1", 1)
    j.open_now("c1", 4096)
    assert window(j, "c1")[1:] == (0, 4096)
    assert seqs(j.read_after_now("c1", 0, 10)) == [1]


def test_conversations_have_separate_windows() -> None:
    j = MemoryJournal()
    j.open_now("c1", 0)
    j.open_now("c2", 100)
    add(j, "c1", 1, now=0.0)
    add(j, "c2", 101, now=0.0)
    add(j, "c1", 2, now=0.0)
    assert held(j, "c1") == [1, 2]
    assert held(j, "c2") == [101]
    assert window(j, "c2")[1:] == (100, 101)


# -- read_after -----------------------------------------------------------------


def test_read_after_returns_exact_slices_of_the_entries() -> None:
    j = MemoryJournal()
    j.open_now("c1", 0)
    appended = [entry(seq) for seq in range(1, 11)]
    for e in appended:
        j.append("c1", e)
    got = j.read_after_now("c1", 3, 4)
    assert got is not None
    assert [m.seq for m in got] == [4, 5, 6, 7]
    assert all(a is b for a, b in zip(got, appended[3:7], strict=True))
    assert seqs(j.read_after_now("c1", 0, 100)) == list(range(1, 11))
    assert seqs(j.read_after_now("c1", 8, 100)) == [9, 10]
    assert seqs(j.read_after_now("c1", 10, 100)) == []
    assert seqs(j.read_after_now("c1", 99, 100)) == []


def test_read_after_zero_limit_is_empty() -> None:
    j = MemoryJournal()
    j.open_now("c1", 0)
    add(j, "c1", 1, now=0.0)
    assert j.read_after_now("c1", 0, 0) == []


def test_read_after_below_the_floor_is_none() -> None:
    j = MemoryJournal(limits(events=2, seconds=0.0))
    j.open_now("c1", 0)
    for seq in range(1, 6):
        add(j, "c1", seq, now=float(seq))
    _, floor, head = window(j, "c1")
    assert (floor, head) == (3, 5)
    assert j.read_after_now("c1", 2, 10) is None
    assert j.read_after_now("c1", 0, 10) is None
    assert seqs(j.read_after_now("c1", 3, 10)) == [4, 5]


def test_I4_window_and_plan_agree() -> None:
    j = MemoryJournal(limits(events=3, seconds=0.0))
    epoch = j.open_now("c1", 0)
    for seq in range(1, 11):
        add(j, "c1", seq, now=float(seq))
    e, floor, head = window(j, "c1")
    for seq in range(0, 12):
        plan = plan_resume(parse_cursor(f"{epoch}.{seq}"), epoch=e, floor=floor, head=head)
        replay = j.read_after_now("c1", seq, BIG)
        if isinstance(plan, Exact):
            assert seqs(replay) == list(range(seq + 1, head + 1))
        else:
            assert replay is None or seq > head


# -- retention by count and time ------------------------------------------------


def test_count_bound_applies_only_to_events_older_than_seconds() -> None:
    j = MemoryJournal(limits(events=3, seconds=10.0))
    j.open_now("c1", 0)
    for seq in range(1, 7):
        add(j, "c1", seq, now=0.0)
    # All six are within the last 10 s: the time rule holds more, keep them all.
    assert held(j, "c1") == [1, 2, 3, 4, 5, 6]
    add(j, "c1", 7, now=20.0)
    # Now the old ones are past the horizon: only the last 3 events remain.
    assert held(j, "c1") == [5, 6, 7]
    assert window(j, "c1")[1] == 4
    assert j.total_bytes == 3 * size_of(10)


def test_time_keeps_more_than_the_count_when_events_are_recent() -> None:
    j = MemoryJournal(limits(events=2, seconds=100.0))
    j.open_now("c1", 0)
    for seq in range(1, 11):
        add(j, "c1", seq, now=float(seq))
    assert held(j, "c1") == list(range(1, 11))
    add(j, "c1", 11, now=106.5)
    # Horizon 6.5: events at t <= 6 are old, and the count (2) is exceeded.
    assert held(j, "c1") == [7, 8, 9, 10, 11]
    add(j, "c1", 12, now=1000.0)
    assert held(j, "c1") == [11, 12]


def test_count_keeps_more_than_time_when_events_are_old() -> None:
    j = MemoryJournal(limits(events=4, seconds=1.0))
    j.open_now("c1", 0)
    for seq in range(1, 4):
        add(j, "c1", seq, now=float(seq))
    add(j, "c1", 4, now=500.0)
    assert held(j, "c1") == [1, 2, 3, 4]  # not over the count: nothing is dropped
    add(j, "c1", 5, now=501.0)
    assert held(j, "c1") == [2, 3, 4, 5]


def test_retention_uses_the_time_passed_in_not_a_clock() -> None:
    j = MemoryJournal(limits(events=1, seconds=60.0))
    j.open_now("c1", 0)
    add(j, "c1", 1, now=1_000.0)
    add(j, "c1", 2, now=1_059.0)
    assert held(j, "c1") == [1, 2]
    add(j, "c1", 3, now=1_061.0)
    assert held(j, "c1") == [2, 3]


def test_long_runs_stay_exact_after_internal_compaction() -> None:
    j = MemoryJournal(limits(events=10, seconds=0.0))
    epoch = j.open_now("c1", 0)
    for seq in range(1, 5001):
        add(j, "c1", seq, now=float(seq))
    assert window(j, "c1") == (epoch, 4990, 5000)
    assert held(j, "c1") == list(range(4991, 5001))
    assert seqs(j.read_after_now("c1", 4995, 3)) == [4996, 4997, 4998]
    assert j.read_after_now("c1", 4989, 3) is None
    assert j.total_bytes == 10 * size_of(10)


# -- retention by bytes ---------------------------------------------------------


def test_per_conversation_byte_bound_wins_over_time_and_count() -> None:
    j = MemoryJournal(limits(per_conversation=U * 5 // 2))
    j.open_now("c1", 0)
    for seq in range(1, 4):
        add(j, "c1", seq, 100, now=0.0)
    assert held(j, "c1") == [2, 3]
    assert window(j, "c1")[1] == 1
    assert j.total_bytes == 2 * U


def test_per_conversation_byte_bound_keeps_the_newest_event() -> None:
    j = MemoryJournal(limits(per_conversation=U * 5 // 2))
    j.open_now("c1", 0)
    add(j, "c1", 1, 100, now=0.0)
    add(j, "c1", 2, 1_000, now=0.0)
    assert held(j, "c1") == [2]
    assert window(j, "c1")[1:] == (1, 2)
    assert j.total_bytes == size_of(1_000)


def test_per_conversation_byte_bound_does_not_touch_other_conversations() -> None:
    j = MemoryJournal(limits(per_conversation=U * 5 // 2))
    j.open_now("c1", 0)
    j.open_now("c2", 0)
    add(j, "c2", 1, 200, now=0.0)
    for seq in range(1, 5):
        add(j, "c1", seq, 100, now=0.0)
    assert held(j, "c1") == [3, 4]
    assert held(j, "c2") == [1]


def test_global_byte_bound_sheds_the_globally_oldest_events_first() -> None:
    j = MemoryJournal(limits(total=5 * U))
    j.open_now("a", 0)
    j.open_now("b", 0)
    add(j, "b", 1, 100, now=0.0)  # the oldest event of all
    for seq in range(1, 5):
        add(j, "a", seq, 100, now=0.0)
    assert j.total_bytes == 5 * U
    add(j, "b", 2, 100, now=0.0)
    assert j.total_bytes == 5 * U
    assert held(j, "b") == [2]  # b's old event went first, though a is larger
    assert window(j, "b")[1] == 1
    assert held(j, "a") == [1, 2, 3, 4]
    add(j, "b", 3, 100, now=0.0)
    assert held(j, "a") == [2, 3, 4]  # then a's oldest
    assert held(j, "b") == [2, 3]
    assert j.total_bytes == 5 * U


def test_global_byte_bound_may_empty_an_idle_window_but_never_drops_the_newest_event() -> None:
    j = MemoryJournal(limits(total=size_of(80) * 5 // 4))
    for conv in ("a", "b", "c"):
        j.open_now(conv, 0)
        add(j, conv, 1, 80, now=0.0)
        add(j, conv, 2, 80, now=0.0)
    assert held(j, "a") == []
    assert held(j, "b") == []
    assert held(j, "c") == [2]  # alone over the bound, but just appended: kept
    assert j.total_bytes == size_of(80)
    epoch, floor, head = window(j, "a")
    assert (floor, head) == (2, 2)  # an empty window still resumes from its head
    assert plan_resume(parse_cursor(f"{epoch}.2"), epoch=epoch, floor=floor, head=head) == Exact(2)


def test_I4_cursor_into_what_the_global_bound_shed_gets_cursor_expired() -> None:
    j = MemoryJournal(limits(total=3 * U))
    epoch = j.open_now("idle", 0)
    j.open_now("busy", 0)
    for seq in range(1, 4):
        add(j, "idle", seq, 100, now=0.0)
    for seq in range(1, 3):
        add(j, "busy", seq, 100, now=0.0)
    e, floor, head = window(j, "idle")
    assert (floor, head) == (2, 3)
    for seq in (0, 1):  # their next event was shed: never a silent gap
        plan = plan_resume(parse_cursor(f"{epoch}.{seq}"), epoch=e, floor=floor, head=head)
        assert plan == Reset(ResetReason.CURSOR_EXPIRED)
        assert j.read_after_now("idle", seq, BIG) is None
    assert seqs(j.read_after_now("idle", 2, BIG)) == [3]


def test_appends_past_the_global_bound_touch_a_constant_number_of_windows() -> None:
    """The Mind-wide bound reached with many loaded windows: each further
    append sheds the globally oldest event without looking at every window
    (it once sorted them all, on every append)."""
    conversations = 2_000
    j = MemoryJournal(limits(total=conversations * 3 * U))
    for n in range(conversations):
        j.open_now(f"c{n}", 0)
        for seq in range(1, 4):
            add(j, f"c{n}", seq, 100, now=0.0)
    j.open_now("busy", 0)
    before = j.windows_touched
    appends = 3_000
    for seq in range(1, appends + 1):
        add(j, "busy", seq, 100, now=0.0)
    assert j.total_bytes <= conversations * 3 * U
    assert j.windows_touched - before <= 3 * appends
    assert held(j, "c0") == []  # the oldest went first
    assert held(j, f"c{conversations - 1}") == [1, 2, 3]


def test_shed_messages_are_released_at_once() -> None:
    """The accounting is the memory: an entry the journal sheds is no longer
    referenced by it (it used to stay in the window until a compaction)."""
    j = MemoryJournal(limits(events=1, seconds=0.0, total=U * 5 // 2))
    j.open_now("a", 0)
    j.open_now("b", 0)
    first = entry(1, 100, 0.0)
    baseline = sys.getrefcount(first)
    j.append("a", first)
    assert sys.getrefcount(first) > baseline
    add(j, "a", 2, 100, now=1.0)  # the count bound sheds a1
    assert sys.getrefcount(first) == baseline
    other = entry(1, 100, 1.0)
    baseline = sys.getrefcount(other)
    j.append("b", other)
    add(j, "b", 2, 100, now=1.0)  # the global bound sheds a2, then b1
    add(j, "b", 3, 100, now=1.0)
    assert held(j, "b") == [2, 3]
    assert sys.getrefcount(other) == baseline


def test_many_shed_entries_do_not_grow_the_journal() -> None:
    """Entries shed by a window's own bounds leave no trace in the Mind-wide
    age order either (it is compacted), however long the Mind runs."""
    j = MemoryJournal(limits(events=5, seconds=0.0, total=10**9))
    j.open_now("idle", 0)
    add(j, "idle", 1, now=0.0)  # the globally oldest, kept for ever
    j.open_now("busy", 0)
    for seq in range(1, 20_001):
        add(j, "busy", seq, now=float(seq))
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
    per_conversation=st.integers(min_value=size_of(1), max_value=6 * size_of(120)),
    total=st.integers(min_value=size_of(1), max_value=12 * size_of(120)),
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
            j.open_now(conv, 0)
            head[conv] = 0
        head[conv] += 1
        times[(conv, head[conv])] = now
        sizes[(conv, head[conv])] = add(j, conv, head[conv], size, now=now)

        # The appended-to window obeys its own bounds right after the append.
        kept = held(j, conv)
        window_bytes = sum(sizes[(conv, s)] for s in kept)
        assert window_bytes <= per_conversation or len(kept) == 1
        if len(kept) > events:
            assert times[(conv, kept[0])] >= now - 10.0

    total_held = 0
    for conv, last in head.items():
        _, floor, h = window(j, conv)
        kept = held(j, conv)
        # Exactly (floor, head], contiguous; the global bound may empty a
        # window, but never drops the event just appended.
        assert h == last
        assert kept == list(range(floor + 1, h + 1))
        assert j.read_after_now(conv, floor - 1, BIG) is None
        total_held += sum(sizes[(conv, s)] for s in kept)
    if appends:
        last_conv = appends[-1][0]
        assert held(j, last_conv)[-1] == head[last_conv]
    assert j.total_bytes == total_held
    # Within the Mind-wide bound, unless the newest event alone exceeds it.
    assert total_held <= total or sum(len(held(j, c)) for c in head) == 1


def test_journal_keeps_transient_messages_too_and_gives_back_the_same_frames() -> None:
    """Entries are serialised values (what a Redis stream would hold); the
    message rebuilt from one frames exactly as the one sent live, summary
    variant and all."""
    j = MemoryJournal()
    epoch = j.open_now("c1", 0)
    delta = Message(
        "face.chat.delta",
        None,
        kind=DELTA,
        conversation_id="c1",
        seq=1,
        cursor=f"{epoch}.1",
        request_id="r1",
        text="hi",
    )
    progress = Message(
        "face.chat.tool.progress",
        b'{"conversation_id":"c1","seq":2}',
        kind=PROGRESS,
        conversation_id="c1",
        seq=2,
        cursor=f"{epoch}.2",
        stream="call_1",
    )
    event = Message(
        "face.event", b'{"seq":3,"args":1}', conversation_id="c1", seq=3, cursor=f"{epoch}.3"
    )
    event.with_summary(
        Message("face.event", b'{"seq":3}', conversation_id="c1", seq=3, cursor=f"{epoch}.3")
    )
    sent = [delta, progress, event]
    for m in sent:
        j.append("c1", entry_of(m, 5.0))
    got = j.read_after_now("c1", 0, 10)
    assert got is not None
    assert [(e.seq, e.kind, e.ts) for e in got] == [(1, DELTA, 5.0), (2, PROGRESS, 5.0),
                                                     (3, RELIABLE, 5.0)]
    assert got[2].body is event.body  # shared with what was sent, not copied
    for live, e in zip(sent, got, strict=True):
        again = message_of("c1", epoch, e)
        assert (again.type, again.kind, again.cursor, again.request_id, again.stream) == (
            live.type, live.kind, live.cursor, live.request_id, live.stream)
        for mode in ("transparent", "summary"):
            shown, shown_again = live.for_mode(mode), again.for_mode(mode)
            assert (shown is None) == (shown_again is None)
            if shown is not None and shown_again is not None:
                assert shown_again.frame(7) == shown.frame(7)
