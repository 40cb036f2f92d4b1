"""Connections that have not authenticated yet are capped per address and in
total, below the descriptor limit (docs/operations.md, "Limits"); repeated
accept failures are told once per interval. Time is passed in."""

from __future__ import annotations

from halfpi.core.pending import PendingConnections, PendingLimits, Tally, limits_for

A = "192.0.2.1"
B = "192.0.2.2"


def test_caps_stay_below_the_descriptor_limit() -> None:
    for nofile in (64, 256, 1024, 4096, 65_536, 1_048_576):
        limits = limits_for(nofile)
        assert 0 < limits.per_address <= limits.total
        # The other half is for authenticated connections and the Mind's own files.
        assert limits.total <= nofile // 2
    assert limits_for(1024) == PendingLimits(total=512, per_address=64)


def test_a_connection_within_the_caps_displaces_nobody() -> None:
    pending: PendingConnections[int] = PendingConnections(PendingLimits(total=4, per_address=2))
    assert pending.admit(1, A) == []
    assert pending.admit(2, B) == []
    assert pending.admit(3, A) == []
    assert pending.count == 3
    assert pending.of(A) == 2


def test_over_the_per_address_cap_the_oldest_of_that_address_goes() -> None:
    pending: PendingConnections[int] = PendingConnections(PendingLimits(total=10, per_address=2))
    pending.admit(1, A)
    pending.admit(2, B)
    pending.admit(3, A)
    assert pending.admit(4, A) == [1]  # A's oldest, not B's older one
    assert pending.of(A) == 2
    assert pending.count == 3
    assert pending.displaced == 1


def test_over_the_total_cap_the_oldest_of_all_goes() -> None:
    pending: PendingConnections[int] = PendingConnections(PendingLimits(total=3, per_address=3))
    pending.admit(1, A)
    pending.admit(2, B)
    pending.admit(3, A)
    assert pending.admit(4, B) == [1]
    assert pending.count == 3


def test_an_authenticated_connection_no_longer_counts() -> None:
    pending: PendingConnections[int] = PendingConnections(PendingLimits(total=2, per_address=2))
    pending.admit(1, A)
    pending.settle(1)  # its hello was welcomed: it is the principal's now
    pending.admit(2, A)
    assert pending.admit(3, A) == []  # 1 is not displaced: it is not pending
    pending.settle(1)  # twice, or after its close: nothing
    pending.settle(99)
    assert pending.count == 2
    assert pending.of(A) == 2


def test_a_flood_from_one_address_never_displaces_another_address() -> None:
    limits = PendingLimits(total=100, per_address=8)
    pending: PendingConnections[int] = PendingConnections(limits)
    pending.admit(0, B)  # a Face, mid-handshake
    displaced = [k for i in range(1, 10_001) for k in pending.admit(i, A)]
    assert 0 not in displaced
    assert len(displaced) == 10_000 - 8
    assert pending.count == 9
    assert pending.of(B) == 1


def test_a_tally_tells_once_per_interval_with_the_count() -> None:
    tally = Tally(interval_s=10.0)
    told = [(now, tally.note(now)) for now in (0.0, 0.001, 0.002, 5.0, 10.0, 10.5, 25.0)]
    assert [(now, n) for now, n in told if n is not None] == [(0.0, 1), (10.0, 4), (25.0, 2)]


def test_a_tally_of_a_million_failures_in_a_second_tells_once() -> None:
    tally = Tally(interval_s=10.0)
    told = [n for i in range(1_000_000) if (n := tally.note(i / 1_000_000)) is not None]
    assert told == [1]
    assert tally.note(10.0) == 1_000_000  # the next line carries what was held back


def test_a_tally_flushed_at_the_end_of_its_interval_tells_what_was_held_back() -> None:
    tally = Tally(interval_s=10.0)
    assert tally.note(0.0) == 1
    assert [tally.note(t) for t in (1.0, 2.0, 3.0)] == [None, None, None]
    assert tally.flush(10.0) == 3  # the burst ended: its count is not lost
    assert tally.note(15.0) is None  # a line was told at 10.0: the next at 20.0 or later
    assert tally.flush(20.0) == 1
    assert tally.flush(30.0) is None  # nothing held back
    assert tally.note(30.5) == 1


def test_an_ipv6_network_counts_as_one_address() -> None:
    """Any IPv6 host has a /64 of its own: 10,000 addresses of one /64 are
    one address to the per-address cap, and displace nobody else."""
    limits = PendingLimits(total=100, per_address=8)
    pending: PendingConnections[int] = PendingConnections(limits)
    pending.admit(0, "2001:db8:0:2::1")  # a Face, mid-handshake, in another /64
    displaced = [k for i in range(1, 10_001) for k in pending.admit(i, f"2001:db8::{i:x}")]
    assert 0 not in displaced
    assert pending.of("2001:db8::ffff") == 8
    assert pending.count == 9
    # An IPv4 address is itself, written mapped into IPv6 or not.
    pending.admit(10_001, "::ffff:192.0.2.9")
    pending.admit(10_002, "192.0.2.9")
    assert pending.of("192.0.2.9") == 2
    assert pending.of("192.0.2.10") == 0


def test_a_flood_from_many_addresses_never_displaces_a_face_mid_handshake() -> None:
    """Over the total cap, the connection displaced is the oldest of the
    address holding the most: a flood from ten addresses fills the total,
    but a Face holding one pending connection is never the one to go (only
    a flood from as many addresses as the total could reach it)."""
    limits = PendingLimits(total=100, per_address=16)
    pending: PendingConnections[int] = PendingConnections(limits)
    attackers = [f"198.51.100.{n}" for n in range(10)]
    for i in range(1, 1_001):
        pending.admit(i, attackers[i % 10])
    pending.admit(0, B)  # a Face, mid-handshake
    displaced = [k for i in range(1_001, 11_001) for k in pending.admit(i, attackers[i % 10])]
    assert 0 not in displaced
    assert pending.of(B) == 1
    assert pending.count == 100
    assert max(pending.of(a) for a in attackers) - min(pending.of(a) for a in attackers) <= 1
