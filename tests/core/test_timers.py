"""The deadline heap behind the Mind's maintenance loop: pure, time passed in."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.timers import Deadlines


def test_nothing_is_due_before_its_deadline() -> None:
    timers: Deadlines[str] = Deadlines()
    timers.set("a", 10.0)
    assert timers.pop_due(9.999) == []
    assert "a" in timers


def test_a_deadline_is_due_at_and_after_its_time_once() -> None:
    timers: Deadlines[str] = Deadlines()
    timers.set("a", 10.0)
    assert timers.pop_due(10.0) == ["a"]
    assert timers.pop_due(11.0) == []
    assert "a" not in timers


def test_due_keys_come_in_deadline_order() -> None:
    timers: Deadlines[str] = Deadlines()
    for key, at in (("c", 3.0), ("a", 1.0), ("b", 2.0), ("late", 9.0)):
        timers.set(key, at)
    assert timers.pop_due(5.0) == ["a", "b", "c"]
    assert timers.next_at() == 9.0


def test_setting_a_key_again_replaces_its_deadline() -> None:
    timers: Deadlines[str] = Deadlines()
    timers.set("a", 1.0)
    timers.set("a", 5.0)  # later: the old entry must not fire
    assert timers.pop_due(2.0) == []
    timers.set("a", 3.0)  # earlier again
    assert timers.pop_due(3.0) == ["a"]
    assert timers.pop_due(10.0) == []


def test_a_discarded_key_never_fires() -> None:
    timers: Deadlines[str] = Deadlines()
    timers.set("a", 1.0)
    timers.set("b", 1.0)
    timers.discard("a")
    timers.discard("never-set")  # harmless
    assert timers.pop_due(2.0) == ["b"]
    assert len(timers) == 0


def test_keys_need_not_be_comparable() -> None:
    class Session:  # no ordering, like a connection object
        pass

    one, two = Session(), Session()
    timers: Deadlines[Session] = Deadlines()
    timers.set(one, 1.0)
    timers.set(two, 1.0)  # same deadline: ties never compare the keys
    assert set(timers.pop_due(1.0)) == {one, two}


def test_popping_visits_only_due_keys_however_many_wait() -> None:
    timers: Deadlines[int] = Deadlines()
    for key in range(10_000):
        timers.set(key, 100.0 + key)
    assert timers.pop_due(99.0) == []
    assert timers.pop_due(100.5) == [0]
    assert len(timers) == 9_999


def test_stale_entries_are_compacted_so_the_heap_stays_bounded() -> None:
    timers: Deadlines[int] = Deadlines()
    for round_ in range(200):
        for key in range(50):
            timers.set(key, 1000.0 + round_)  # rescheduled many times, never due
    assert len(timers) == 50
    assert timers.heap_size() <= 4 * 50 + 64


def test_next_at_is_none_when_empty() -> None:
    timers: Deadlines[str] = Deadlines()
    assert timers.next_at() is None
    timers.set("a", 2.0)
    timers.discard("a")
    assert timers.next_at() is None


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["set", "discard", "pop"]),
            st.integers(0, 20),
            st.floats(0, 100, allow_nan=False),
        ),
        max_size=200,
    )
)
def test_behaves_like_a_dict_of_deadlines(ops: list[tuple[str, int, float]]) -> None:
    timers: Deadlines[int] = Deadlines()
    model: dict[int, float] = {}
    for op, key, value in ops:
        if op == "set":
            timers.set(key, value)
            model[key] = value
        elif op == "discard":
            timers.discard(key)
            model.pop(key, None)
        else:
            due = sorted((at, k) for k, at in model.items() if at <= value)
            got = timers.pop_due(value)
            assert sorted(got) == sorted(k for _, k in due)
            assert [model[k] for k in got] == sorted(model[k] for k in got)
            for k in got:
                del model[k]
        assert len(timers) == len(model)
        expected = min(model.values()) if model else None
        assert timers.next_at() == expected


def test_random_schedule_fires_each_deadline_exactly_once() -> None:
    rng = random.Random(7)
    timers: Deadlines[int] = Deadlines()
    deadlines = {key: rng.uniform(0, 50) for key in range(500)}
    for key, at in deadlines.items():
        timers.set(key, at)
    fired: list[int] = []
    now = 0.0
    while now <= 50.0:
        fired.extend(timers.pop_due(now))
        now += 0.25
    assert sorted(fired) == list(range(500))
