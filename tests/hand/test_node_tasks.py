"""Background tasks on a Hand (DESIGN §8), driven through a scripted Mind:
receipts, redelivery answered with the original receipt, delivery_conflict,
cancel racing completion, every task re-announced after a reconnect, and a
task the previous Hand process left unfinished announced ``lost``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from halfpi.client.transport import Transport
from halfpi.core.policy import Rule
from halfpi.hand.node import HandNode
from halfpi.hand.policy import HandPolicy
from halfpi.hand.tasks import TaskBook
from tests.support.scripted_mind import ScriptedMind
from tests.support.wait import until

ECHO = {"argv": ["echo", "built"]}


@contextlib.asynccontextmanager
async def tasked_hand(state: Path, *, features: tuple[str, ...] = ("tasks",),
                      ) -> AsyncIterator[tuple[ScriptedMind, HandNode]]:
    mind = ScriptedMind()

    async def connector(url: str) -> Transport:
        return mind

    async def stop_instead_of_retrying(seconds: float) -> None:
        await node.stop()

    node = HandNode("ws://mind/v1/hand", "hph_x", "dev", connector=connector,
                    sleep=stop_instead_of_retrying,
                    policy=HandPolicy([state.parent], {"exec_command": Rule.NEVER}, []),
                    state_dir=state)
    serving = asyncio.create_task(node.run_forever())
    await mind.expect("hand.hello")
    mind.tell("hand.welcome", hand_id="dev", generation=1, adopted=[], abandon=[], protect=[],
              features=list(features))
    await asyncio.wait_for(node.connected.wait(), 10)
    try:
        yield mind, node
    finally:
        await node.stop()
        await mind.close()
        await asyncio.wait_for(serving, 10)


def updates(mind: ScriptedMind, task_id: str) -> list[str]:
    return [f["payload"]["state"] for f in mind.from_hand
            if f["type"] == "hand.task.update" and f["payload"]["task_id"] == task_id]


async def test_a_delivered_task_runs_to_its_end_and_its_log_is_read_back(tmp_path: Path) -> None:
    async with tasked_hand(tmp_path / "state") as (mind, _):
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command", args=ECHO)
        receipt = await mind.expect("hand.task.receipt", delivery_id="d-1")
        assert (receipt["state"], receipt["deduplicated"]) == ("queued", False)
        task_id = receipt["task_id"]
        done = await mind.expect("hand.task.update", task_id=task_id, state="succeeded")
        assert done["exit_code"] == 0
        assert updates(mind, task_id) == ["running", "succeeded"]
        mind.tell("hand.task.log", task_id=task_id, offset=0)
        page = await mind.expect("hand.task.log_page", task_id=task_id)
        assert base64.b64decode(page["data_b64"]) == b"built\n"
        assert (page["next_offset"], page["truncated"]) == (6, False)


async def test_a_redelivery_gets_the_original_receipt_and_never_a_second_run(
    tmp_path: Path,
) -> None:
    async with tasked_hand(tmp_path / "state") as (mind, _):
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command", args=ECHO)
        first = await mind.expect("hand.task.receipt", delivery_id="d-1")
        await mind.expect("hand.task.update", task_id=first["task_id"], state="succeeded")
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command", args=ECHO)
        await mind.expect("hand.task.receipt", delivery_id="d-1", deduplicated=True)
        receipts = [f["payload"] for f in mind.from_hand if f["type"] == "hand.task.receipt"]
        assert [r["task_id"] for r in receipts] == [first["task_id"]] * 2
        assert receipts[1]["state"] == "succeeded"
        assert receipts[1]["received_at"] == first["received_at"]
        assert updates(mind, first["task_id"]) == ["running", "succeeded"]  # ran once


async def test_the_same_delivery_id_with_another_payload_is_refused(tmp_path: Path) -> None:
    async with tasked_hand(tmp_path / "state") as (mind, _):
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command", args=ECHO)
        await mind.expect("hand.task.receipt", delivery_id="d-1")
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command",
                  args={"argv": ["echo", "something else"]})
        refused = await mind.expect("hand.task.refused", delivery_id="d-1")
        assert refused["code"] == "delivery_conflict"


async def test_a_cancel_ends_a_running_task_and_one_after_its_end_changes_nothing(
    tmp_path: Path,
) -> None:
    async with tasked_hand(tmp_path / "state") as (mind, _):
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command",
                  args={"argv": ["sleep", "30"]})
        task_id = (await mind.expect("hand.task.receipt", delivery_id="d-1"))["task_id"]
        await mind.expect("hand.task.update", task_id=task_id, state="running")
        mind.tell("hand.task.cancel", task_id=task_id)
        await mind.expect("hand.task.update", task_id=task_id, state="cancelled")
        mind.tell("hand.task.cancel", task_id=task_id)  # it already ended
        await until(lambda: len(updates(mind, task_id)) == 3)
        assert updates(mind, task_id) == ["running", "cancelled", "cancelled"]


async def test_a_task_left_unfinished_by_the_previous_hand_is_announced_lost(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    # What a Hand killed mid-task leaves on disk: a task running, nothing more.
    book = TaskBook(state / "dev.tasks")
    book.open(100.0)
    task_id = book.deliver("d-1", "exec_command", ECHO, None, now=101.0).task_id
    book.move(task_id, "running", 102.0)
    book.close()

    async with tasked_hand(state) as (mind, _):
        lost = await mind.expect("hand.task.update", task_id=task_id)
        assert lost["state"] == "lost"
        assert "restarted" in lost["error"]
        # And a redelivery of it is answered, never run again.
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command", args=ECHO)
        again = await mind.expect("hand.task.receipt", delivery_id="d-1")
        assert (again["task_id"], again["state"], again["deduplicated"]) == (
            task_id, "lost", True)


async def test_a_mind_that_does_not_speak_of_tasks_is_told_nothing_of_them(
    tmp_path: Path,
) -> None:
    async with tasked_hand(tmp_path / "state") as (mind, _):
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command", args=ECHO)
        await mind.expect("hand.task.update", state="succeeded")
    async with tasked_hand(tmp_path / "state", features=()) as (mind, _):
        # A receipt comes after whatever the Hand says on connecting.
        mind.tell("hand.task.deliver", delivery_id="d-2", tool="exec_command", args=ECHO)
        await mind.expect("hand.task.receipt", delivery_id="d-2")
        assert not [f for f in mind.from_hand if f["type"] == "hand.task.update"]


async def test_I11_a_stopping_hand_ends_its_running_task_and_records_it_lost(
    tmp_path: Path,
) -> None:
    async with tasked_hand(tmp_path / "state") as (mind, node):
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command",
                  args={"argv": ["sleep", "30"]})
        task_id = (await mind.expect("hand.task.receipt", delivery_id="d-1"))["task_id"]
        await mind.expect("hand.task.update", task_id=task_id, state="running")
    # The Hand has stopped (tasked_hand waited for it): nothing of it runs on,
    # and the task says how it ended — nobody cancelled it.
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert node.book is not None
    record = node.book.get(task_id)
    assert record is not None
    assert record.state == "lost"
    assert record.error == "the Hand stopped while the task was unfinished"


async def test_a_task_delivered_as_the_hand_stops_never_starts_and_nothing_is_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    stopping: list[asyncio.Future[None]] = []
    async with tasked_hand(tmp_path / "state") as (mind, node):
        said = mind.send

        async def stop_once_the_receipt_is_out(text: str) -> None:
            await said(text)
            if json.loads(text)["type"] == "hand.task.receipt":  # before the work is scheduled
                stopping.append(asyncio.ensure_future(node.stop()))

        monkeypatch.setattr(mind, "send", stop_once_the_receipt_is_out)
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command", args=ECHO)
        task_id = (await mind.expect("hand.task.receipt", delivery_id="d-1"))["task_id"]
        await stopping[0]
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert node.book is not None
    record = node.book.get(task_id)
    assert record is not None
    assert (record.state, record.started_at) == ("lost", None)  # its command never started
    assert "running" not in updates(mind, task_id)

