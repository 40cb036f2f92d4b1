"""Resume planning (DESIGN §4.2, I4): exact inside ``(floor, head]``, else an honest reset."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.cursor import Cursor
from halfpi.core.replay import UNPLACED_EPOCH, Exact, Reset, ResetReason, plan_resume


def test_I4_exact_inside_window() -> None:
    plan = plan_resume(Cursor("e1", 15), epoch="e1", floor=10, head=20)
    assert plan == Exact(after_seq=15)


def test_I4_exact_at_the_floor_replays_everything_held() -> None:
    # The journal holds (floor, head]: a Face at seq == floor misses nothing.
    assert plan_resume(Cursor("e1", 10), epoch="e1", floor=10, head=20) == Exact(10)


def test_I4_exact_at_the_head_replays_nothing_and_goes_live() -> None:
    assert plan_resume(Cursor("e1", 20), epoch="e1", floor=10, head=20) == Exact(20)


def test_I4_exact_on_an_empty_window() -> None:
    assert plan_resume(Cursor("e1", 0), epoch="e1", floor=0, head=0) == Exact(0)


def test_I4_reset_when_cursor_expired() -> None:
    plan = plan_resume(Cursor("e1", 9), epoch="e1", floor=10, head=20)
    assert plan == Reset(ResetReason.CURSOR_EXPIRED)


def test_I4_reset_when_epoch_changed() -> None:
    plan = plan_resume(Cursor("old", 15), epoch="new", floor=10, head=20)
    assert plan == Reset(ResetReason.EPOCH_CHANGED)


def test_I4_epoch_change_wins_over_every_other_reason() -> None:
    # Seq numbers of another epoch mean nothing here, in or out of the window.
    for seq in (0, 5, 15, 25):
        plan = plan_resume(Cursor("old", seq), epoch="new", floor=10, head=20)
        assert plan == Reset(ResetReason.EPOCH_CHANGED)


def test_I4_reset_when_cursor_is_ahead_of_the_head() -> None:
    plan = plan_resume(Cursor("e1", 21), epoch="e1", floor=10, head=20)
    assert plan == Reset(ResetReason.UNKNOWN_CURSOR)


def test_I4_below_the_floor_of_a_settled_window_the_store_replays_up_to_the_floor() -> None:
    """The window was dropped while the conversation was idle (an unloaded
    actor) and re-opened at 4096: what came before is all in the Store, and
    every chat in it had ended, so the durable events replay exactly."""
    plan = plan_resume(Cursor("e1", 7), epoch="e1", floor=4096, head=4100, settled=4096)
    assert plan == Exact(7, committed_until=4096)
    assert plan_resume(Cursor("e1", 0), epoch="e1", floor=4096, head=4096, settled=4096) == Exact(
        0, committed_until=4096
    )


def test_I4_a_settled_window_trimmed_since_expires_what_it_no_longer_holds() -> None:
    # Trimmed past its settled point: events after 4096 are gone from the
    # journal and may belong to a chat that was running: no exact replay.
    plan = plan_resume(Cursor("e1", 7), epoch="e1", floor=5000, head=9000, settled=4096)
    assert plan == Reset(ResetReason.CURSOR_EXPIRED)


def test_I4_a_settled_window_changes_nothing_at_or_above_its_floor_or_of_another_epoch() -> None:
    assert plan_resume(Cursor("e1", 4097), epoch="e1", floor=4096, head=4100, settled=4096) == (
        Exact(4097)
    )
    assert plan_resume(Cursor("e0", 7), epoch="e1", floor=4096, head=4100, settled=4096) == Reset(
        ResetReason.EPOCH_CHANGED
    )


def test_reset_reasons_are_the_wire_strings() -> None:
    assert {r.value for r in ResetReason} == {"epoch_changed", "cursor_expired", "unknown_cursor"}
    assert ResetReason.CURSOR_EXPIRED == "cursor_expired"


@given(
    floor=st.integers(min_value=0, max_value=1000),
    extra=st.integers(min_value=0, max_value=1000),
    seq=st.integers(min_value=0, max_value=3000),
    same_epoch=st.booleans(),
    settled=st.integers(min_value=0, max_value=1000),
)
def test_I4_never_a_silent_gap(
    floor: int, extra: int, seq: int, same_epoch: bool, settled: int
) -> None:
    head = floor + extra
    plan = plan_resume(
        Cursor("e" if same_epoch else "x", seq), epoch="e", floor=floor, head=head, settled=settled
    )
    if isinstance(plan, Exact):
        # Exact only when every event after the cursor is still held, or the
        # Store holds every durable one up to the floor of a settled window.
        assert same_epoch
        assert plan.after_seq == seq <= head
        if plan.committed_until is None:
            assert floor <= seq
        else:
            assert seq < floor == plan.committed_until <= settled
    else:
        assert isinstance(plan, Reset)
        expected = (
            ResetReason.EPOCH_CHANGED
            if not same_epoch
            else ResetReason.UNKNOWN_CURSOR
            if seq > head
            else ResetReason.CURSOR_EXPIRED
        )
        assert plan.reason is expected
        assert not (same_epoch and floor <= seq <= head)
        assert not (same_epoch and seq < floor <= settled)


def test_plans_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Exact(3).after_seq = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Reset(ResetReason.CURSOR_EXPIRED).reason = ResetReason.UNKNOWN_CURSOR  # type: ignore[misc]


def test_a_cursor_nobody_can_place_resets_as_unknown() -> None:
    # An SSE resume token that does not verify stands for such cursors (§17).
    plan = plan_resume(Cursor(UNPLACED_EPOCH, 0), epoch="e1", floor=0, head=5)
    assert plan == Reset(ResetReason.UNKNOWN_CURSOR)
