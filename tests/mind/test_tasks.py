"""Background tasks, the Mind's side (DESIGN §8): admitted with the chat,
delivered from the outbox on the Mind's clock (2 s * 2^n, 3 attempts, then
``dead``), the Hand's answers applied (first terminal wins, I10), ``stale``
while the Hand is away, and ``face.task.*``.

A whole Mind on a fake clock (``tests/support/rig.py``); the test plays the
Hand with raw frames, so every delivery and answer is in its hands."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from halfpi.core.tasks import answer_wait
from tests.support.metrics import samples
from tests.support.rig import Peer, Rig, fake_time_mind

Frame = dict[str, Any]
ECHO = {"argv": ["echo", "built"]}


def task_event(type_: str, **fields: Any) -> Callable[[Frame], bool]:
    def match(frame: Frame) -> bool:
        if frame["type"] != "face.event" or frame["payload"]["type"] != type_:
            return False
        task = frame["payload"]["data"]["task"]
        return all(task.get(k) == v for k, v in fields.items())

    return match


def deliveries(hand: Peer) -> list[Frame]:
    return [f["payload"] for f in hand.wire.of_type("hand.task.deliver")]


async def start_task(rig: Rig, face: Peer, cid: str, args: dict[str, Any] = ECHO) -> str:
    """``/task exec_command ARGS`` in ``cid``; the task id once it is admitted."""
    chat = await rig.command(face, "face.chat", conversation_id=cid,
                             content=f"/task exec_command {json.dumps(args)}")
    reply = await rig.reply(face, chat)
    assert reply["payload"]["status"] == "succeeded", reply
    started = await rig.expect(face, task_event("task.started"))
    return str(started["payload"]["data"]["task"]["task_id"])


async def task_delivered(rig: Rig) -> tuple[Peer, Peer, str, str, dict[str, Any]]:
    """A Hand ``dev`` and a Face, a task started in a new conversation, and the
    delivery the Hand got for it."""
    hand = await rig.hand("dev")
    face = await rig.face()
    cid = await rig.conversation(face)
    task_id = await start_task(rig, face, cid)
    order = (await rig.take(hand, lambda f: f["type"] == "hand.task.deliver"))["payload"]
    return hand, face, cid, task_id, order


def receipt(delivery: Frame, hand_task: str = "h1", state: str = "queued",
            deduplicated: bool = False) -> dict[str, Any]:
    return {"delivery_id": delivery["delivery_id"], "task_id": hand_task, "state": state,
            "deduplicated": deduplicated, "received_at": 1.0}


def update(delivery: Frame, state: str, hand_task: str = "h1", **fields: Any) -> dict[str, Any]:
    return {"task_id": hand_task, "delivery_id": delivery["delivery_id"], "tool": "exec_command",
            "state": state, "created_at": 1.0, "started_at": None, "ended_at": None,
            "exit_code": None, "error": None, "log_bytes": 0, "log_truncated": False, **fields}


async def test_a_task_started_by_a_chat_is_delivered_and_its_end_shown(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, cid, task_id, order = await task_delivered(rig)
        assert (order["tool"], order["args"]) == ("exec_command", ECHO)
        row = await rig.mind.store.get_task(task_id)
        assert row is not None and row.delivery_id == order["delivery_id"]
        assert row.request_id and row.conversation_id == cid and row.attempts == 1
        hand.send("hand.task.receipt", receipt(order))
        hand.send("hand.task.update", update(order, "running", started_at=2.0))
        hand.send("hand.task.update", update(order, "succeeded", started_at=2.0,
                                             ended_at=3.0, exit_code=0, log_bytes=6))
        done = await rig.expect(face, task_event("task.completed", task_id=task_id))
        task = done["payload"]["data"]["task"]
        assert (task["state"], task["exit_code"], task["stale"]) == ("succeeded", 0, False)
        stored = await rig.mind.store.get_task(task_id)
        assert stored is not None and stored.hand_task_id == "h1" and stored.state == "succeeded"


async def test_redelivery_waits_2_then_4_seconds_and_the_row_is_dead_after_3_attempts(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        rig.mind.tasks.draw = lambda: 0.5  # no jitter: the waits are exact
        hand = await rig.hand("dev")
        face = await rig.face()
        cid = await rig.conversation(face)
        task_id = await start_task(rig, face, cid)
        await rig.take(hand, lambda f: f["type"] == "hand.task.deliver")
        for wait, attempt in ((2.0, 2), (4.0, 3)):
            await until_attempts(rig, task_id, attempt - 1)
            rig.advance(wait - 0.001)
            assert len(deliveries(hand)) == attempt - 1, "not before its time"
            rig.advance(0.001)
            await rig.take(hand, lambda f: f["type"] == "hand.task.deliver")
        await until_attempts(rig, task_id, 3)
        rig.advance(8.0 - 0.001)
        row = await rig.mind.store.get_task(task_id)
        assert row is not None and row.state == "queued"
        rig.advance(0.001)
        dead = await rig.expect(face, task_event("task.completed", task_id=task_id))
        assert dead["payload"]["data"]["task"]["state"] == "dead"
        assert len(deliveries(hand)) == 3
        assert len({d["delivery_id"] for d in deliveries(hand)}) == 1, "one delivery id"


@pytest.mark.parametrize("draw", [0.0, 0.999999])
def test_the_wait_between_attempts_is_jittered_by_a_quarter_and_capped(draw: float) -> None:
    for attempts, base in ((1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 30.0), (9, 30.0)):
        wait = answer_wait(attempts, draw)
        assert base * 0.75 <= wait <= base * 1.25
        assert wait == pytest.approx(base * (0.75 if draw == 0.0 else 1.25), rel=1e-5)


async def until_attempts(rig: Rig, task_id: str, attempts: int) -> None:
    async def counted() -> bool:
        row = await rig.mind.store.get_task(task_id)
        return row is not None and row.attempts == attempts

    await until_async(counted)


async def until_async(check: Callable[[], Any], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_a_receipt_stops_redelivery(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        rig.mind.tasks.draw = lambda: 0.5
        hand, _face, _cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.receipt", receipt(order))

        async def delivered() -> bool:
            row = await rig.mind.store.get_task(task_id)
            return row is not None and row.delivered_at is not None

        await until_async(delivered)
        rig.advance(60.0)
        assert len(deliveries(hand)) == 1


async def test_a_delivery_conflict_makes_the_task_dead_never_a_second_task(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.refused", {"delivery_id": order["delivery_id"],
                                        "code": "delivery_conflict",
                                        "message": "another payload under this id"})
        dead = await rig.expect(face, task_event("task.completed", task_id=task_id))
        task = dead["payload"]["data"]["task"]
        assert task["state"] == "dead" and task["error"].startswith("delivery_conflict")


async def test_cancel_racing_completion_converges_on_the_first_terminal_state(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.receipt", receipt(order))
        hand.send("hand.task.update", update(order, "running"))
        await rig.expect(face, task_event("task.progress", task_id=task_id, state="running"))
        cancel = await rig.command(face, "face.task.cancel", task_id=task_id)
        await rig.take(hand, lambda f: f["type"] == "hand.task.cancel")
        # The Hand finished first; its late "cancelled" is refused by the Store.
        hand.send("hand.task.update", update(order, "succeeded", exit_code=0))
        hand.send("hand.task.update", update(order, "cancelled"))
        result = await rig.reply(face, cancel)
        data = result["payload"]["data"]
        assert (data["outcome"], data["target_status"]) == ("already_finished", "succeeded")
        row = await rig.mind.store.get_task(task_id)
        assert row is not None and row.state == "succeeded"
        ends = [f for f in face.wire.frames if task_event("task.completed")(f)]
        assert [e["payload"]["data"]["task"]["state"] for e in ends] == ["succeeded"]


async def test_a_task_is_stale_while_its_hand_is_away_and_fresh_once_it_is_back(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.receipt", receipt(order))
        hand.send("hand.task.update", update(order, "running"))
        await rig.expect(face, task_event("task.progress", task_id=task_id, state="running"))
        hand.session.close(1000, "gone")
        await rig.expect(face, task_event("task.progress", task_id=task_id, stale=True))
        listed = await rig.reply(face, await rig.command(face, "face.task.list"))
        assert [(t["task_id"], t["state"], t["stale"])
                for t in listed["payload"]["data"]["tasks"]] == [(task_id, "running", True)]
        snap = await rig.reply(face, await rig.command(face, "face.conversation.snapshot",
                                                       conversation_id=cid))
        assert snap["payload"]["tasks"][0]["stale"] is True
        back = await rig.hand("dev")
        back.send("hand.task.update", update(order, "succeeded", exit_code=0))
        done = await rig.expect(face, task_event("task.completed", task_id=task_id))
        assert done["payload"]["data"]["task"]["stale"] is False
        got = await rig.reply(face, await rig.command(face, "face.task.get", task_id=task_id))
        assert (got["payload"]["data"]["state"], got["payload"]["data"]["stale"]) == (
            "succeeded", False)


async def test_a_task_waits_for_its_hand_and_is_delivered_once_it_connects(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand = await rig.hand("dev")
        face = await rig.face()
        cid = await rig.conversation(face)
        hand.session.close(1000, "gone")
        task_id = await start_task(rig, face, cid, {**ECHO, "hand": "dev"})
        rig.advance(120.0)
        assert deliveries(hand) == []
        back = await rig.hand("dev")
        order = (await rig.take(back, lambda f: f["type"] == "hand.task.deliver"))["payload"]
        row = await rig.mind.store.get_task(task_id)
        assert row is not None and order["delivery_id"] == row.delivery_id


async def test_the_log_is_read_from_the_hand_with_its_body_only_for_transparent_viewers(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.receipt", receipt(order))
        await rig.expect(face, task_event("task.progress", task_id=task_id))
        asked = await rig.command(face, "face.task.log", task_id=task_id, offset=0)
        read = (await rig.take(hand, lambda f: f["type"] == "hand.task.log"))["payload"]
        assert read["task_id"] == "h1"
        hand.send("hand.task.log_page", {"task_id": "h1", "offset": 0, "next_offset": 6,
                                         "data_b64": base64.b64encode(b"built\n").decode(),
                                         "truncated": False, "state": "running"})
        page = (await rig.reply(face, asked))["payload"]["data"]
        assert (page["data"], page["next_offset"]) == ("built\n", 6)
        observer = await rig.face()
        observer.session.conn.detail_mode = "summary"  # type: ignore[union-attr]
        asked = await rig.command(observer, "face.task.log", task_id=task_id, offset=0)
        await rig.take(hand, lambda f: f["type"] == "hand.task.log")
        hand.send("hand.task.log_page", {"task_id": "h1", "offset": 0, "next_offset": 6,
                                         "data_b64": base64.b64encode(b"built\n").decode(),
                                         "truncated": False, "state": "running"})
        page = (await rig.reply(observer, asked))["payload"]["data"]
        assert "data" not in page and page["next_offset"] == 6


async def test_an_unknown_task_is_task_not_found(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        face = await rig.face()
        for command in ("face.task.get", "face.task.cancel", "face.task.log"):
            reply = await rig.reply(face, await rig.command(face, command, task_id="k_nope"))
            assert reply["payload"]["code"] == "task_not_found", command


async def test_a_task_cancelled_before_its_receipt_is_stopped_on_the_hand_when_it_answers(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        cancel = await rig.command(face, "face.task.cancel", task_id=task_id)
        result = await rig.reply(face, cancel)
        assert result["payload"]["data"]["outcome"] == "cancelled"
        hand.send("hand.task.receipt", receipt(order, "h9"))
        stop = await rig.take(hand, lambda f: f["type"] == "hand.task.cancel")
        assert stop["payload"] == {"task_id": "h9"}
        row = await rig.mind.store.get_task(task_id)
        assert row is not None and row.state == "cancelled"


async def test_a_dead_task_stays_dead_when_a_late_receipt_arrives(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.refused", {"delivery_id": order["delivery_id"],
                                        "code": "unavailable", "message": "no state"})
        await rig.expect(face, task_event("task.completed", task_id=task_id, state="dead"))
        hand.send("hand.task.update", update(order, "succeeded", exit_code=0))
        hand.send("hand.task.receipt", receipt(order))
        await rig.mind.tasks.terminal(task_id)  # the answers were applied
        row = await rig.mind.store.get_task(task_id)
        assert row is not None and row.state == "dead"
        ends = [f for f in face.wire.frames if task_event("task.completed")(f)]
        assert len(ends) == 1


def task_samples(rig: Rig) -> dict[tuple[str, str], float]:
    """The task metrics of a scrape: (sample name, its state label) → value."""
    return samples(rig.mind, "halfpi_task", "state")


async def test_tasks_admitted_delivered_and_ended_are_counted_for_metrics(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        assert task_samples(rig) == {("halfpi_tasks_admitted_total", ""): 1,
                                     ("halfpi_task_deliveries_total", ""): 1}
        hand.send("hand.task.receipt", receipt(order))
        hand.send("hand.task.update", update(order, "succeeded", started_at=2.0,
                                             ended_at=3.0, exit_code=0, log_bytes=6))
        await rig.expect(face, task_event("task.completed", task_id=task_id))
        assert task_samples(rig) == {("halfpi_tasks_admitted_total", ""): 1,
                                     ("halfpi_task_deliveries_total", ""): 1,
                                     ("halfpi_tasks_ended_total", "succeeded"): 1}


async def test_a_hand_back_while_an_away_attempt_is_written_gets_the_task_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatcher finds the Hand away and writes when to look again;
    the Hand reconnects while that write is on its way (its reconnect's
    attempt finds this one in flight and leaves the task to it): the task is
    delivered as soon as the write is done, not at the next look."""
    async with fake_time_mind(tmp_path / "home") as rig:
        hand = await rig.hand("dev")
        face = await rig.face()
        cid = await rig.conversation(face)
        hand.session.close(1000, "gone")
        write = rig.mind.store.write
        writing, go_on = asyncio.Event(), asyncio.Event()

        def slow_write(tx: Any) -> Any:
            if not tx.task_updates or writing.is_set():
                return write(tx)
            writing.set()  # the away-attempt's write: held until the Hand is back

            async def later() -> Any:
                await go_on.wait()
                return await write(tx)

            return asyncio.ensure_future(later())

        monkeypatch.setattr(rig.mind.store, "write", slow_write)
        await start_task(rig, face, cid, {**ECHO, "hand": "dev"})
        await writing.wait()  # the away-attempt is writing
        back = await rig.hand("dev")
        go_on.set()
        order = await rig.take(back, lambda f: f["type"] == "hand.task.deliver")
        assert order["payload"]["tool"] == "exec_command"
