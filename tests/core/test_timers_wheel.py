"""The maintenance wheel (``core/timers.py`` ``Wheel``): deadlines kept in
coarse slots, never handed over early, never later than the round at or
after them; moving a key is a dict operation. Pure, time passed in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.timers import Wheel


def test_a_key_is_never_due_before_its_deadline_even_inside_its_slot() -> None:
    wheel: Wheel[str] = Wheel(1.0)
    wheel.set("a", 10.3)
    assert wheel.pop_due(10.0) == []  # its slot began: not its time
    assert wheel.pop_due(10.29) == []
    assert wheel.pop_due(10.3) == ["a"]
    assert wheel.pop_due(11.0) == [] and "a" not in wheel


def test_a_slot_that_ended_is_handed_over_whole_and_dropped() -> None:
    wheel: Wheel[int] = Wheel(1.0)
    for key in range(100):
        wheel.set(key, 20.0 + key / 100)  # one slot: 20 s
    wheel.set(1000, 35.0)
    assert wheel.slots() == 2
    assert sorted(wheel.pop_due(21.0)) == list(range(100))
    assert wheel.slots() == 1 and len(wheel) == 1


def test_moving_a_key_within_its_slot_or_away_keeps_one_entry() -> None:
    wheel: Wheel[str] = Wheel(1.0)
    for i in range(10_000):  # a connection's deadline, moved by each pong
        wheel.set("a", 15.0 + i / 20_000)
    assert wheel.slots() == 1 and len(wheel) == 1
    wheel.set("a", 30.0)  # to another slot: the old one keeps no entry
    assert wheel.pop_due(16.0) == []
    assert wheel.pop_due(30.0) == ["a"]


def test_due_at_once_and_discard() -> None:
    wheel: Wheel[str] = Wheel(1.0)
    wheel.set("new", float("-inf"))  # a new connection: its first visit is due now
    wheel.set("gone", 5.0)
    wheel.discard("gone")
    wheel.discard("never")
    assert wheel.pop_due(0.0) == ["new"]
    assert wheel.pop_due(100.0) == [] and len(wheel) == 0


def test_next_at_is_the_earliest_live_deadline() -> None:
    wheel: Wheel[str] = Wheel(1.0)
    assert wheel.next_at() is None
    wheel.set("b", 7.5)
    wheel.set("a", 7.25)
    wheel.set("c", 3.0)
    wheel.discard("c")
    assert wheel.next_at() == 7.25


ops = st.lists(
    st.tuples(st.sampled_from(["set", "discard", "pop"]), st.integers(0, 20),
              st.floats(0.0, 60.0, allow_nan=False)),
    max_size=200,
)


@given(ops, st.sampled_from([0.25, 1.0, 5.0]))
def test_it_hands_over_exactly_what_a_plain_dict_says_is_due(
    steps: list[tuple[str, int, float]], slot_s: float
) -> None:
    wheel: Wheel[int] = Wheel(slot_s)
    model: dict[int, float] = {}
    now = 0.0
    for op, key, at in steps:
        if op == "set":
            wheel.set(key, at)
            model[key] = at
        elif op == "discard":
            wheel.discard(key)
            model.pop(key, None)
        else:
            now = max(now, at)  # the rounds' clock only goes forward
            due = {k for k, v in model.items() if v <= now}
            assert set(wheel.pop_due(now)) == due
            for k in due:
                del model[k]
        assert len(wheel) == len(model)
