"""A request record's end, as the Store is asked to write it, moves by the
``REQUEST`` table: accepted → one of the request outcomes, nothing else."""

from __future__ import annotations

import pytest

from halfpi.core.states import REQUEST, REQUEST_TERMINAL
from halfpi.errors import IllegalTransition
from halfpi.store.base import FinishedRequest


@pytest.mark.parametrize("status", sorted(REQUEST_TERMINAL))
def test_a_request_may_end_with_any_request_outcome(status: str) -> None:
    finished = FinishedRequest("p_1", "r_1", status, {"status": status}, 1.0)
    assert REQUEST.is_terminal(finished.status)


@pytest.mark.parametrize("status", ["accepted", "running", "lost", "expired", "done"])
def test_a_request_cannot_end_with_a_status_that_is_not_an_outcome(status: str) -> None:
    with pytest.raises(IllegalTransition):
        FinishedRequest("p_1", "r_1", status, {"status": status}, 1.0)
