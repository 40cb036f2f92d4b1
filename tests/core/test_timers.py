"""The heaps behind the Mind's timers and its maintenance round: pure, time passed in."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.timers import Deadlines, Timer, Timers


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


# -- Timers: callbacks on one heap, run by whoever says what time it is --------------


def run_due(timers: Timers, now: float) -> int:
    ran = 0
    while (timer := timers.pop_due(now)) is not None:
        timer.run()
        ran += 1
    return ran


def test_a_timer_runs_at_its_time_not_before_and_once() -> None:
    timers = Timers()
    fired: list[str] = []
    timers.call_at(120.0, fired.append, "ttl")
    assert run_due(timers, 119.999) == 0 and fired == []
    assert run_due(timers, 120.0) == 1 and fired == ["ttl"]
    assert run_due(timers, 500.0) == 0 and fired == ["ttl"]
    assert len(timers) == 0 and timers.next_deadline() is None


def test_due_timers_run_earliest_first_and_ties_in_the_order_they_were_set() -> None:
    timers = Timers()
    fired: list[str] = []
    for name, at in (("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("late", 9.0)):
        timers.call_at(at, fired.append, name)
    assert run_due(timers, 5.0) == 4
    assert fired == ["a", "b1", "b2", "c"]
    assert timers.next_deadline() == 9.0


def test_a_cancelled_timer_never_runs() -> None:
    timers = Timers()
    fired: list[str] = []
    first = timers.call_at(1.0, fired.append, "first")
    timers.call_at(2.0, fired.append, "second")
    first.cancel()
    first.cancel()  # harmless
    assert len(timers) == 1
    assert timers.next_deadline() == 2.0
    assert run_due(timers, 10.0) == 1 and fired == ["second"]


def test_a_timer_cancelled_by_an_earlier_one_in_the_same_round_does_not_run() -> None:
    timers = Timers()
    fired: list[str] = []
    later = timers.call_at(2.0, fired.append, "later")
    timers.call_at(1.0, later.cancel)
    assert run_due(timers, 5.0) == 1
    assert fired == []


def test_a_timer_set_by_a_running_one_for_now_runs_in_the_same_round() -> None:
    timers = Timers()
    fired: list[str] = []
    timers.call_at(1.0, lambda: timers.call_at(1.0, fired.append, "follow-up"))
    timers.call_at(1.0, lambda: timers.call_at(7.0, fired.append, "next"))
    assert run_due(timers, 1.0) == 3
    assert fired == ["follow-up"]
    assert timers.next_deadline() == 7.0


def test_cancelling_a_timer_that_ran_changes_nothing() -> None:
    timers = Timers()
    ran = timers.call_at(1.0, lambda: None)
    timers.call_at(5.0, lambda: None)
    run_due(timers, 1.0)
    assert ran.done
    ran.cancel()
    assert len(timers) == 1


def test_cancelled_timers_are_compacted_so_the_heap_stays_bounded() -> None:
    timers = Timers()
    keep = [timers.call_at(1000.0 + i, lambda: None) for i in range(10)]
    for i in range(10_000):  # set and called off: a TTL decided in time
        timers.call_at(500.0 + i, lambda: None).cancel()
    assert len(timers) == len(keep)
    assert timers.heap_size() <= 4 * len(keep) + 64
    assert timers.next_deadline() == 1000.0


def test_clear_calls_every_timer_off() -> None:
    timers = Timers()
    fired: list[int] = []
    handles = [timers.call_at(float(i), fired.append, i) for i in range(5)]
    timers.clear()
    assert len(timers) == 0 and timers.next_deadline() is None
    assert all(h.done for h in handles)
    assert run_due(timers, 100.0) == 0 and fired == []
    handles[0].cancel()  # harmless after clear
    assert len(timers) == 0


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["set", "cancel", "run"]),
            st.integers(0, 30),
            st.floats(0, 100, allow_nan=False),
        ),
        max_size=200,
    )
)
def test_runs_exactly_the_live_timers_in_deadline_order(ops: list[tuple[str, int, float]]) -> None:
    timers = Timers()
    handles: list[Timer] = []
    model: dict[int, float] = {}  # handle index -> deadline, for live timers
    fired: list[int] = []
    for op, pick, value in ops:
        if op == "set":
            handles.append(timers.call_at(value, fired.append, len(handles)))
            model[len(handles) - 1] = value
        elif op == "cancel" and handles:
            index = pick % len(handles)
            handles[index].cancel()
            model.pop(index, None)
        elif op == "run":
            fired.clear()
            run_due(timers, value)
            due = sorted((at, i) for i, at in model.items() if at <= value)
            assert fired == [i for _, i in due]
            for i in fired:
                del model[i]
        assert len(timers) == len(model)
        assert timers.next_deadline() == (min(model.values()) if model else None)
