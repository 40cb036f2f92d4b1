"""Failed handshakes are throttled per address (DESIGN §11), with time passed in."""

from __future__ import annotations

import pytest

from halfpi.core.throttle import HandshakeThrottle, ThrottleLimits, client_address

LIMITS = ThrottleLimits(base_s=1.0, cap_s=8.0, max_wait_s=8.0, forget_after_s=100.0,
                        max_addresses=4)
A = "192.0.2.1"
B = "192.0.2.2"


def fail(throttle: HandshakeThrottle, address: str, now: float) -> float:
    """One whole failed attempt at ``now``; returns how long it had to wait."""
    wait = throttle.admit(address, now)
    assert wait is not None
    throttle.failed(address, now + wait)
    return wait


def test_an_address_without_failures_is_never_delayed() -> None:
    throttle = HandshakeThrottle(LIMITS)
    for i in range(100):
        assert throttle.admit(A, float(i) / 1000) == 0.0
        throttle.succeeded(A)
    assert throttle.tracked == 0  # nothing kept for a well-behaved address


def test_each_failure_doubles_the_wait_up_to_the_cap() -> None:
    throttle = HandshakeThrottle(LIMITS)
    now = 0.0
    waits = []
    for _ in range(7):
        wait = fail(throttle, A, now)
        waits.append(wait)
        now += wait  # the next guess comes the moment the last one was answered
    assert waits == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_failed_returns_the_running_count() -> None:
    throttle = HandshakeThrottle(LIMITS)
    counts = []
    for i in range(3):
        assert throttle.admit(A, 100.0 * i) is not None
        counts.append(throttle.failed(A, 100.0 * i + 1))
    assert counts == [1, 2, 3]


def test_a_wait_already_served_is_not_added_again() -> None:
    throttle = HandshakeThrottle(LIMITS)
    fail(throttle, A, 0.0)
    fail(throttle, A, 1.0)  # waited 0 (came late enough), now 2 failures
    assert throttle.admit(A, 50.0) == 0.0


def test_parallel_attempts_from_one_address_are_spaced_not_multiplied() -> None:
    throttle = HandshakeThrottle(LIMITS)
    fail(throttle, A, 0.0)
    # Eight connections ask at the same instant: each gets its own later slot,
    # and those that would wait longer than max_wait are refused outright.
    waits = [throttle.admit(A, 1.0) for _ in range(8)]
    admitted = [w for w in waits if w is not None]
    assert admitted == sorted(admitted)
    assert len(set(admitted)) == len(admitted), waits  # no two share a slot
    assert max(admitted) <= LIMITS.max_wait_s
    assert waits.count(None) >= 4, waits


def test_refused_attempts_do_not_push_the_wait_further() -> None:
    throttle = HandshakeThrottle(LIMITS)
    for now in (0.0, 1.0, 3.0, 7.0, 15.0):
        fail(throttle, A, now)
    first = throttle.admit(A, 15.0)
    assert first is not None
    refused = [throttle.admit(A, 15.0) for _ in range(50)]
    assert refused == [None] * 50
    assert throttle.refused(A) == 50
    throttle.failed(A, 15.0 + first)
    # One cap later the address may try again, however many were refused.
    assert throttle.admit(A, 15.0 + first + LIMITS.cap_s) == 0.0


def test_addresses_are_throttled_independently() -> None:
    throttle = HandshakeThrottle(LIMITS)
    for now in (0.0, 1.0, 3.0):
        fail(throttle, A, now)
    assert throttle.admit(B, 3.0) == 0.0
    assert throttle.admit(A, 3.0) == 4.0


def test_success_resets_the_count() -> None:
    throttle = HandshakeThrottle(LIMITS)
    for now in (0.0, 1.0, 3.0):
        fail(throttle, A, now)
    wait = throttle.admit(A, 3.0)
    assert wait == 4.0  # the right token still waits its turn …
    throttle.succeeded(A)
    assert throttle.admit(A, 7.0) == 0.0  # … and then the address is trusted again
    throttle.succeeded(A)
    assert throttle.tracked == 0


def test_an_attempt_in_flight_counts_as_a_failure_until_it_succeeds() -> None:
    throttle = HandshakeThrottle(LIMITS)
    assert throttle.admit(A, 0.0) == 0.0  # in flight: its outcome is not known yet
    assert throttle.admit(A, 0.0) == 0.0  # the first of the presumed failures is free
    assert throttle.admit(A, 0.0) == 1.0  # the next waits as if one had failed
    throttle.succeeded(A)
    throttle.succeeded(A)
    throttle.succeeded(A)
    assert throttle.tracked == 0


def test_failures_are_forgotten_after_a_quiet_period() -> None:
    throttle = HandshakeThrottle(LIMITS)
    for now in (0.0, 1.0, 3.0, 7.0):
        fail(throttle, A, now)
    assert throttle.admit(A, 7.0 + LIMITS.forget_after_s) == 0.0
    throttle.succeeded(A)
    assert throttle.tracked == 0


def test_the_table_of_addresses_is_bounded() -> None:
    throttle = HandshakeThrottle(LIMITS)
    for i in range(50):
        fail(throttle, f"198.51.100.{i}", float(i))
    assert throttle.tracked <= LIMITS.max_addresses


@pytest.mark.parametrize("failures", [1, 5, 40])
def test_waits_never_exceed_max_wait(failures: int) -> None:
    throttle = HandshakeThrottle(LIMITS)
    now = 0.0
    for _ in range(failures):
        now += fail(throttle, A, now)
    for _ in range(20):
        wait = throttle.admit(A, now)
        assert wait is None or wait <= LIMITS.max_wait_s


def test_a_trusted_proxy_names_the_client_by_the_hop_it_added() -> None:
    trusted = frozenset({"10.0.0.5"})
    # The last entry is the one our proxy added; earlier ones the client may forge.
    forwarded = ["198.51.100.7, 203.0.113.9", "192.0.2.44"]
    assert client_address("10.0.0.5", forwarded, trusted) == "192.0.2.44"
    assert client_address("10.0.0.5", ["203.0.113.9 "], trusted) == "203.0.113.9"


def test_an_untrusted_peer_is_its_own_address_whatever_it_forwards() -> None:
    trusted = frozenset({"10.0.0.5"})
    assert client_address("192.0.2.1", ["203.0.113.9"], trusted) == "192.0.2.1"
    assert client_address("10.0.0.5", [], trusted) == "10.0.0.5"
    assert client_address("10.0.0.5", [" "], trusted) == "10.0.0.5"


def test_a_repeated_thing_is_worth_a_log_line_at_powers_of_two_only() -> None:
    from halfpi.core.throttle import worth_logging

    assert [n for n in range(0, 70) if worth_logging(n)] == [1, 2, 4, 8, 16, 32, 64]
    assert sum(worth_logging(n) for n in range(1, 1_000_001)) == 20
