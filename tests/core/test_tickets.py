"""Stream tickets (DESIGN §9): one use, 60 s, bound; time passed in."""

from __future__ import annotations

from halfpi.core.tickets import TicketBook, hash_ticket

T0 = 1_000_000.0


def book() -> TicketBook:
    return TicketBook(ttl_s=60.0, per_principal=3)


def test_a_ticket_is_redeemed_once() -> None:
    tickets = book()
    tickets.issue("hps_one", "p_1", ("c_a",), "summary", T0)
    bound = tickets.redeem("hps_one", T0 + 1)
    assert bound is not None
    assert (bound.principal_id, bound.conversations, bound.detail_mode) == (
        "p_1", ("c_a",), "summary")
    assert tickets.redeem("hps_one", T0 + 2) is None


def test_a_ticket_expires_after_its_time() -> None:
    tickets = book()
    tickets.issue("hps_one", "p_1", ("c_a",), "summary", T0)
    assert tickets.redeem("hps_one", T0 + 60.0) is None


def test_an_unknown_ticket_is_refused() -> None:
    assert book().redeem("hps_never", T0) is None


def test_tickets_are_kept_hashed() -> None:
    tickets = book()
    tickets.issue("hps_secret", "p_1", ("c_a",), "summary", T0)
    assert "hps_secret" not in repr(tickets.__dict__)
    assert hash_ticket("hps_secret") in tickets.by_hash


def test_a_principal_holds_a_bounded_number_of_tickets_oldest_dropped() -> None:
    tickets = book()
    for n in range(4):
        tickets.issue(f"hps_{n}", "p_1", ("c_a",), "summary", T0 + n)
    assert tickets.redeem("hps_0", T0 + 5) is None
    assert tickets.redeem("hps_3", T0 + 5) is not None


def test_expired_tickets_are_forgotten_as_new_ones_come() -> None:
    tickets = book()
    tickets.issue("hps_old", "p_1", ("c_a",), "summary", T0)
    tickets.issue("hps_new", "p_2", ("c_a",), "summary", T0 + 120)
    assert hash_ticket("hps_old") not in tickets.by_hash
