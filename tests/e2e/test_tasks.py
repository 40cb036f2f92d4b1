"""Background tasks end to end (DESIGN §8): a real ``halfpi mind``, a real
``halfpi hand`` behind a fault proxy, killed with SIGKILL and started again.

The receipt of a delivery is lost (the proxy swallows everything after the
delivery), the Hand is killed mid-task and restarted: the Mind delivers the
same delivery id again, the new Hand process answers with the original
receipt (``deduplicated``) and the task ``lost`` — it ran once, never twice."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import hand_add
from tests.support.client import FaceClient
from tests.support.hand import HandProcess
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy

pytestmark = pytest.mark.e2e

Frame = dict[str, Any]


def task_of(frame: Frame, type_: str) -> dict[str, Any] | None:
    if frame["type"] == "face.event" and frame["payload"]["type"] == type_:
        return dict(frame["payload"]["data"]["task"])
    return None


def stored(home: Path, task_id: str, column: str) -> Any:
    with sqlite3.connect(f"file:{home / 'halfpi.db'}?mode=ro", uri=True) as db:
        return db.execute(f"SELECT {column} FROM tasks WHERE task_id = ?", (task_id,)).fetchone()[0]


def answer_of(home: Path, task_id: str) -> Any:
    """The Hand's last receipt the Mind recorded (None: only its updates)."""
    raw = stored(home, task_id, "answer")
    return json.loads(raw) if raw else None


def delivery_of(home: Path, task_id: str) -> str:
    return str(stored(home, task_id, "delivery_id"))


async def until(condition: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_redelivery_to_a_restarted_hand_gets_the_original_receipt_and_runs_nothing(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    token = (await hand_add(home, "laptop")).token
    mind = MindProcess(home, extra_args=("--no-local-hand",)).start()
    proxy = await FaultProxy(mind.port).start()
    hand_url = f"ws://127.0.0.1:{proxy.port}/v1/hand"
    hands: list[HandProcess] = []
    face = None

    def start_hand() -> HandProcess:
        hand = HandProcess(hand_url, token, "laptop", work / f"hand-{len(hands)}.log",
                           ("--approval", "exec_command=never"))
        hands.append(hand)
        return hand

    try:
        start_hand()
        face = await FaceClient.connect(mind.url, mind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        listed: list[Any] = []

        async def hand_connected() -> bool:
            rid = await face.command("face.hand.list")
            reply = await face.reply(rid)
            listed[:] = reply["payload"]["data"]["hands"]
            return any(h["hand_id"] == "laptop" and h["connected"] for h in listed)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not await hand_connected():
            assert loop.time() < deadline, hands[0].log()
            await asyncio.sleep(0.1)

        # After the delivery passes, the proxy swallows everything: the
        # Hand has the task, the Mind never hears its receipt.
        def swallow_after_delivery(chunk: bytes) -> bool:
            if b"hand.task.deliver" in chunk:
                proxy.blackhole = True
            return False

        proxy.cut_when = swallow_after_delivery
        marker = work / "ran.txt"
        args = {"argv": ["sh", "-c", f"echo ran >> {marker}; sleep 3"]}
        await face.chat_to_end(cid, f"/task exec_command {json.dumps(args)}")
        started = await face.expect(lambda f: task_of(f, "task.started") is not None)
        task_id = task_of(started, "task.started")["task_id"]  # type: ignore[index]
        await until(marker.exists, 20, "the task to run on the Hand")

        hands[0].kill()
        proxy.cut_when = None
        proxy.cut_all()
        proxy.blackhole = False
        start_hand()

        lost = await face.expect(
            lambda f: (task_of(f, "task.completed") or {}).get("task_id") == task_id, 30)
        assert task_of(lost, "task.completed")["state"] == "lost"  # type: ignore[index]
        assert marker.read_text() == "ran\n", "run once, never again"
        # Whether the restarted Hand first re-announced the task or was
        # delivered it again (and answered with the original receipt), its
        # book holds one task for the delivery id, and so does the Mind.
        delivery_id = delivery_of(home, task_id)
        book = work / "hand-home" / "hands" / "laptop.tasks" / "tasks.db"
        with sqlite3.connect(f"file:{book}?mode=ro", uri=True) as db:
            assert db.execute("SELECT count(*) FROM tasks WHERE delivery_id = ?",
                              (delivery_id,)).fetchone() == (1,)
            assert db.execute("SELECT count(*) FROM tasks").fetchone() == (1,)
        answer = answer_of(home, task_id)
        assert answer is None or answer["deduplicated"] is True, answer
    finally:
        if face is not None:
            await face.close()
        for hand in hands:
            hand.kill()
        await proxy.stop()
        mind.kill()
