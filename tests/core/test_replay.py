"""Resume planning (DESIGN §4.2, I4): exact inside ``(floor, head]``, else an honest reset."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.cursor import Cursor
from halfpi.core.replay import Exact, Reset, ResetReason, plan_resume


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


def test_reset_reasons_are_the_wire_strings() -> None:
    assert {r.value for r in ResetReason} == {"epoch_changed", "cursor_expired", "unknown_cursor"}
    assert ResetReason.CURSOR_EXPIRED == "cursor_expired"


@given(
    floor=st.integers(min_value=0, max_value=1000),
    extra=st.integers(min_value=0, max_value=1000),
    seq=st.integers(min_value=0, max_value=3000),
    same_epoch=st.booleans(),
)
def test_I4_never_a_silent_gap(floor: int, extra: int, seq: int, same_epoch: bool) -> None:
    head = floor + extra
    plan = plan_resume(Cursor("e" if same_epoch else "x", seq), epoch="e", floor=floor, head=head)
    if isinstance(plan, Exact):
        # Exact only when every event after the cursor is still held.
        assert same_epoch
        assert floor <= plan.after_seq <= head
        assert plan.after_seq == seq
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


def test_plans_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Exact(3).after_seq = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Reset(ResetReason.CURSOR_EXPIRED).reason = ResetReason.UNKNOWN_CURSOR  # type: ignore[misc]
