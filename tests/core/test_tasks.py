"""Background tasks' pure rules (DESIGN §8): delivery judgement, the
redelivery schedule, first terminal state wins."""

from __future__ import annotations

import pytest

from halfpi.core.tasks import (
    DELIVERY_ATTEMPTS,
    judge_delivery,
    redelivery_delay,
    settle,
    task_digest,
)
from halfpi.errors import IllegalTransition


def test_a_delivery_id_never_seen_makes_a_task_and_the_same_payload_again_is_a_duplicate() -> None:
    digest = task_digest("exec_command", {"argv": ["make"], "cwd": "/src"}, 60.0)
    assert judge_delivery(None, digest) == "new"
    again = task_digest("exec_command", {"cwd": "/src", "argv": ["make"]}, 60.0)
    assert again == digest  # key order does not matter
    assert judge_delivery(digest, again) == "duplicate"


def test_the_same_delivery_id_with_another_payload_is_a_conflict() -> None:
    first = task_digest("exec_command", {"argv": ["make"]}, None)
    for other in (task_digest("exec_command", {"argv": ["make", "test"]}, None),
                  task_digest("read_file", {"argv": ["make"]}, None),
                  task_digest("exec_command", {"argv": ["make"]}, 5.0)):
        assert judge_delivery(first, other) == "conflict"


@pytest.mark.parametrize(("failed", "low", "high"), [(1, 1.5, 2.5), (2, 3.0, 5.0)])
def test_redelivery_waits_2s_times_2_to_the_n_with_25_percent_jitter(
    failed: int, low: float, high: float
) -> None:
    assert redelivery_delay(failed, 0.0) == pytest.approx(low)
    assert redelivery_delay(failed, 0.5) == pytest.approx((low + high) / 2)
    assert redelivery_delay(failed, 0.999999) == pytest.approx(high, rel=1e-5)


def test_after_three_attempts_the_row_is_dead() -> None:
    assert DELIVERY_ATTEMPTS == 3
    assert redelivery_delay(3, 0.5) is None
    assert redelivery_delay(7, 0.5) is None
    with pytest.raises(ValueError):
        redelivery_delay(0, 0.5)


def test_the_cap_is_30_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    import halfpi.core.tasks as tasks

    monkeypatch.setattr(tasks, "DELIVERY_ATTEMPTS", 10)
    assert tasks.redelivery_delay(9, 0.5) == pytest.approx(30.0)
    assert tasks.redelivery_delay(9, 0.999999) == pytest.approx(37.5, rel=1e-5)


def test_the_first_terminal_state_wins() -> None:
    assert settle("running", "cancelled") is True
    assert settle("succeeded", "cancelled") is False  # cancel lost the race: no error
    assert settle("queued", "lost") is True
    with pytest.raises(IllegalTransition):
        settle("running", "queued")
