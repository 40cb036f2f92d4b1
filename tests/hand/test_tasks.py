"""The Hand's book of background tasks (DESIGN §8) on a real SQLite file:
delivery ids deduplicated across a restart, ``delivery_conflict``, the first
terminal state wins, unfinished tasks ``lost`` after a restart (never
re-run), a bounded log."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from halfpi.errors import DeliveryConflict, ErrorCode, IllegalTransition, NotFound
from halfpi.hand.tasks import TRUNCATED, TaskBook

BUILD = {"argv": ["make", "-j2"], "cwd": "/src"}


def opened(state: Path, now: float = 100.0, **kwargs: int) -> TaskBook:
    book = TaskBook(state, **kwargs)
    book.open(now)
    return book


def test_a_redelivery_after_a_hand_restart_gets_the_original_receipt(tmp_path: Path) -> None:
    book = opened(tmp_path / "state")
    first = book.deliver("d-1", "exec_command", BUILD, 600.0, now=101.0)
    assert (first.state, first.deduplicated) == ("queued", False)
    book.move(first.task_id, "running", 102.0)
    book.close()

    again = opened(tmp_path / "state", now=200.0)  # the Hand restarted
    repeat = again.deliver("d-1", "exec_command", {"cwd": "/src", "argv": ["make", "-j2"]},
                           600.0, now=201.0)
    assert repeat.deduplicated is True
    assert repeat.task_id == first.task_id
    assert repeat.received_at == 101.0  # the original receipt
    assert repeat.state == "lost"  # what the task became, not a second run
    assert [t.task_id for t in again.tasks()] == [first.task_id]


def test_the_same_delivery_id_with_another_payload_is_delivery_conflict(tmp_path: Path) -> None:
    book = opened(tmp_path / "state")
    book.deliver("d-1", "exec_command", BUILD, None, now=101.0)
    book.close()
    again = opened(tmp_path / "state")
    with pytest.raises(DeliveryConflict) as caught:
        again.deliver("d-1", "exec_command", {"argv": ["rm", "-rf", "/src"]}, None, now=102.0)
    assert caught.value.code is ErrorCode.DELIVERY_CONFLICT
    assert caught.value.field == "delivery_id"
    assert len(again.tasks()) == 1


def test_cancel_racing_completion_the_first_terminal_state_wins(tmp_path: Path) -> None:
    book = opened(tmp_path / "state")
    task = book.deliver("d-1", "exec_command", BUILD, None, now=101.0).task_id
    assert book.move(task, "running", 102.0) is True
    assert book.move(task, "succeeded", 103.0, exit_code=0) is True
    assert book.move(task, "cancelled", 103.5) is False  # too late: no error
    record = book.get(task)
    assert record is not None
    assert (record.state, record.exit_code, record.ended_at) == ("succeeded", 0, 103.0)
    with pytest.raises(IllegalTransition):
        other = book.deliver("d-2", "exec_command", BUILD, None, now=104.0).task_id
        book.move(other, "running", 105.0)
        book.move(other, "queued", 106.0)


def test_a_hand_restart_marks_unfinished_tasks_lost_and_never_reruns_them(
    tmp_path: Path,
) -> None:
    book = opened(tmp_path / "state")
    queued = book.deliver("d-1", "exec_command", BUILD, None, now=101.0).task_id
    running = book.deliver("d-2", "exec_command", BUILD, None, now=101.0).task_id
    done = book.deliver("d-3", "exec_command", BUILD, None, now=101.0).task_id
    book.move(running, "running", 102.0)
    book.move(done, "running", 102.0)
    book.move(done, "failed", 103.0, exit_code=2)
    book.close()

    again = TaskBook(tmp_path / "state")
    lost = again.open(500.0)
    assert sorted(lost) == sorted([queued, running])
    states = {t.task_id: (t.state, t.ended_at) for t in again.tasks()}
    assert states == {queued: ("lost", 500.0), running: ("lost", 500.0), done: ("failed", 103.0)}
    assert again.move(running, "succeeded", 501.0) is False  # lost stands
    again.close()
    assert TaskBook(tmp_path / "state").open(600.0) == []  # nothing twice


def test_the_log_is_bounded_and_says_where_it_stopped(tmp_path: Path) -> None:
    book = opened(tmp_path / "state", log_limit=10)
    task = book.deliver("d-1", "exec_command", BUILD, None, now=101.0).task_id
    assert book.append_log(task, b"012345") == 6
    assert book.append_log(task, b"6789abcdef") == 4
    assert book.append_log(task, b"more") == 0
    page = book.read_log(task, 0, 1000)
    assert page.data == b"0123456789" + TRUNCATED
    assert page.truncated is True
    assert book.read_log(task, 4, 3).data == b"456"
    assert book.read_log(task, 4, 3).next_offset == 7


def test_the_book_and_its_logs_are_private(tmp_path: Path) -> None:
    book = opened(tmp_path / "state")
    task = book.deliver("d-1", "exec_command", BUILD, None, now=101.0).task_id
    book.append_log(task, b"secret output")
    for path in (tmp_path / "state" / "tasks.db", tmp_path / "state" / "tasks" / f"{task}.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((tmp_path / "state" / "tasks").stat().st_mode) == 0o700


def test_an_unknown_task_is_task_not_found(tmp_path: Path) -> None:
    book = opened(tmp_path / "state")
    for call in (lambda: book.move("t_00", "running", 1.0),
                 lambda: book.append_log("t_00", b"x"),
                 lambda: book.read_log("../../etc/passwd", 0, 10)):
        with pytest.raises(NotFound) as caught:
            call()
        assert caught.value.code is ErrorCode.TASK_NOT_FOUND
    assert book.get("t_00") is None
