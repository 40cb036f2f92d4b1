"""The reconnect plan (pure): URLs in turn, backoff, reset, local cap, words."""

from __future__ import annotations

import itertools
import random

import pytest

from halfpi.client.redial import LOCAL_CAP_S, REMOTE_CAP_S, Narrator, Redial, Retry
from halfpi.core.backoff import backoff

A, B = "ws://a.test/v1/face", "ws://b.test/v1/face"


def flat() -> Redial:
    return Redial([A, B], delays=lambda: backoff(jitter=False))


def test_urls_are_dialed_in_turn_forever() -> None:
    plan = flat()
    assert [plan.next_url() for _ in range(5)] == [A, B, A, B, A]


def test_each_failure_waits_longer_and_says_where_why_and_until_when() -> None:
    plan = flat()
    plan.next_url()
    first = plan.failed("connection refused", now=10.0)
    plan.next_url()
    second = plan.failed("unknown host", now=20.0)
    assert first == Retry(A, 1, 0.25, 10.25, "connection refused")
    assert second == Retry(B, 2, 0.5, 20.5, "unknown host")


def test_a_welcome_starts_the_backoff_over_and_the_end_of_its_session_is_lost() -> None:
    plan = flat()
    for _ in range(4):
        plan.next_url()
        plan.failed("refused", 0.0)
    plan.next_url()
    plan.welcomed()
    ended = plan.failed("the Mind is restarting", 0.0)
    assert (ended.attempt, ended.delay, ended.lost) == (1, 0.25, True)
    plan.next_url()
    assert plan.failed("refused", 0.0).lost is False


@pytest.mark.parametrize(
    ("urls", "cap"),
    [
        (["ws://127.0.0.1:15707/v1/face"], LOCAL_CAP_S),
        (["ws://localhost/v1/face", "ws://[::1]:1/v1/face", "ws://127.3.2.1/x"], LOCAL_CAP_S),
        (["ws://127.0.0.1/v1/face", A], REMOTE_CAP_S),
        ([A], REMOTE_CAP_S),
    ],
)
def test_the_cap_is_two_seconds_only_when_every_url_is_on_this_machine(
    urls: list[str], cap: float
) -> None:
    assert Redial(urls).max_delay_s == cap


def test_the_default_delays_are_full_jitter_under_the_cap() -> None:
    plan = Redial("ws://127.0.0.1/v1/hand", rng=random.Random(3))
    delays = [plan.failed("x", 0.0).delay for _ in range(12)]
    assert delays == list(itertools.islice(backoff(cap=2.0, rng=random.Random(3)), 12))
    assert max(delays) <= 2.0


def test_no_url_is_a_usage_error() -> None:
    with pytest.raises(ValueError):
        Redial([])


def test_the_narrator_says_a_failure_once_per_change_of_reason() -> None:
    said = Narrator()
    lines = [
        said.failed(Retry(A, n, 0.25 * n, 0.0, why))
        for n, why in enumerate(["refused", "refused", "refused", "timeout", "timeout"], 1)
    ]
    assert lines == [
        f"cannot reach the Mind at {A}: refused; retrying in 0.2 s (attempt 1)",
        None,
        None,
        f"cannot reach the Mind at {A}: timeout; retrying in 1.0 s (attempt 4)",
        None,
    ]
    assert said.connected(A) == f"connected to the Mind at {A}"
    assert said.connected(A) is None  # nothing was said since
    assert said.failed(Retry(A, 1, 0.25, 0.0, "refused", lost=True)) == (
        f"lost the connection to the Mind at {A}: refused; reconnecting in 0.2 s"
    )


def test_a_located_mind_is_dialed_where_it_says_it_is_now() -> None:
    """A client that found its Mind through an address file (``--home``)
    asks again before every dial: a Mind restarted on another port is
    dialed there; while the file says nothing, the last address stands."""
    where: list[list[str] | None] = [None, [B], [B], None, [A]]
    plan = Redial([A], delays=lambda: backoff(jitter=False), locate=lambda: where.pop(0))
    assert [plan.next_url() for _ in range(5)] == [A, B, B, B, A]
    assert plan.urls == [A]

