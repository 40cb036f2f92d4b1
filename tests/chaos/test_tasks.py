"""Background tasks under chaos (DESIGN §8, I10, I11): nothing lost, nothing
run twice, whatever dies.

A real Mind process, a real ``halfpi hand`` process connected through a
fault proxy, and the SDK as the Face. Each of ``HALFPI_TASK_CHAOS`` (≥ 50)
short schedules, drawn from its own seed, admits a few tasks (each one
appends its own label to a file when it runs) and mixes in faults: kill -9
of the Mind right after a task was asked for (mid-dispatch), kill -9 of the
Hand while a task runs, duplicate-delivery storms (the proxy repeats every
``hand.task.deliver`` frame it carries), and the link between them cut.
Then everything heals and settles, and:

- every admitted task ran at most once (its label is in the file at most once),
  and one request admitted at most one task;
- every task is in exactly one terminal state (``lost`` and ``dead``
  included): the Store keeps the first, and a ``succeeded`` task ran once;
- the Face's view equals the Mind's snapshot (tasks included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shlex
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest

from halfpi.core.backoff import backoff
from halfpi.core.events import HandPage, Snapshot
from halfpi.core.states import OUTBOX
from halfpi.face.client import FaceClient, Result
from halfpi.face.view import ConversationView
from tests.support.cli import hand_add
from tests.support.client import FaceClient as RawClient
from tests.support.hand import HandProcess
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCHEDULES = int(os.environ.get("HALFPI_TASK_CHAOS", "50"))
SEED = int(os.environ.get("HALFPI_TASK_CHAOS_SEED", "1607"))
FAULTS = ("kill_mind", "kill_hand", "storm", "cut", "none", "none")
STORM = 4  # each delivery frame arrives this many times


def repeat_deliveries(chunk: bytes) -> bytes:
    """Every ``hand.task.deliver`` frame of a chunk of whole WebSocket frames
    (Mind → Hand: unmasked) repeated; a chunk that is not whole frames passes."""
    frames: list[bytes] = []
    at = 0
    while at < len(chunk):
        if at + 2 > len(chunk):
            return chunk
        size, head = chunk[at + 1] & 0x7F, 2
        if size == 126:
            size, head = int.from_bytes(chunk[at + 2:at + 4], "big"), 4
        elif size == 127:
            size, head = int.from_bytes(chunk[at + 2:at + 10], "big"), 10
        end = at + head + size
        if end > len(chunk):
            return chunk
        frames.append(chunk[at:end])
        at = end
    return b"".join(f * STORM if b'"hand.task.deliver"' in f else f for f in frames)


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.home = tmp / "home"
        self.home.mkdir()
        self.work = tmp / "work"
        self.work.mkdir()
        self.runs = self.work / "runs.txt"
        self.runs.touch()
        self.mind = MindProcess(self.home, extra_args=("--no-local-hand",))
        self.proxy: FaultProxy | None = None
        self.hand: HandProcess | None = None
        self.token = ""
        self.hands = 0

    async def start(self) -> None:
        self.token = (await hand_add(self.home, "box")).token
        await asyncio.to_thread(self.mind.start)
        self.proxy = await FaultProxy(self.mind.port).start()
        self.start_hand()

    def start_hand(self) -> None:
        assert self.proxy is not None
        self.hands += 1
        self.hand = HandProcess(f"ws://127.0.0.1:{self.proxy.port}/v1/hand", self.token, "box",
                                self.work / f"hand-{self.hands}.log",
                                ("--approval", "exec_command=never"))

    def ran(self) -> Counter[str]:
        return Counter(self.runs.read_text().split())

    async def stop(self) -> None:
        if self.hand is not None:
            self.hand.kill()
        if self.proxy is not None:
            await self.proxy.stop()
        self.mind.kill()


def task_command(label: str, slow: bool, runs: Path) -> str:
    script = f"echo {label} >> {shlex.quote(str(runs))}" + ("; sleep 0.5" if slow else "")
    return "/task exec_command " + json.dumps({"argv": ["sh", "-c", script], "hand": "box"})


async def hand_connected(client: FaceClient) -> bool:
    try:
        listed = await client.request("face.hand.list")
    except Exception:  # the Mind is restarting: ask again
        return False
    assert isinstance(listed, Result) and isinstance(listed.data, HandPage)
    return any(h["hand_id"] == "box" and h["connected"] for h in listed.data.hands)


def label_of(task: dict[str, Any]) -> str:
    script = task["args"]["argv"][2]
    return str(script.split()[1])


async def until(condition: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def run_schedule(world: World, client: FaceClient, index: int) -> None:
    rng = random.Random(SEED + index)
    proxy = world.proxy
    assert proxy is not None
    cid = await asyncio.wait_for(client.create_conversation(f"chaos {index}"), 30)
    await client.subscribe(cid)
    handles = []
    labels = []
    for step in range(rng.randint(1, 3)):
        label = f"s{index}t{step}"
        slow = rng.random() < 0.5
        fault = rng.choice(FAULTS)
        if fault == "storm":
            proxy.rewrite_to_client = repeat_deliveries
        labels.append(label)
        if os.environ.get("HALFPI_TASK_CHAOS_DEBUG"):
            print(index, label, "slow" if slow else "quick", fault, flush=True)
        await until(partial(hand_connected, client), 30, "the Hand to be connected")
        handles.append(await client.chat(cid, task_command(label, slow or fault == "kill_hand",
                                                           world.runs)))
        if fault == "kill_mind":
            if rng.random() < 0.5:  # sometimes right away, sometimes a moment later
                await asyncio.sleep(rng.uniform(0.0, 0.3))  # the schedule's own time
            await asyncio.to_thread(world.mind.kill)
            await asyncio.to_thread(world.mind.start)
        elif fault == "kill_hand":
            async def started(label: str = label) -> bool:
                return label in world.ran()

            with_start = rng.random() < 0.8
            if with_start:
                # Killed before it started (the wait ran out) is also a schedule.
                with contextlib.suppress(AssertionError):
                    await until(started, 5, "the task to start")
            assert world.hand is not None
            await asyncio.to_thread(world.hand.kill)
            world.start_hand()
        elif fault == "cut":
            proxy.cut_all()
        # One chat at a time in a conversation: this one ends first.
        await asyncio.wait_for(asyncio.gather(handles[-1].result(), return_exceptions=True), 60)
    # Heal, then let everything settle.
    proxy.rewrite_to_client = None
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(h.result() for h in handles), return_exceptions=True), 60)
    if os.environ.get("HALFPI_TASK_CHAOS_DEBUG"):
        print(index, [(getattr(o, "status", o), getattr(o, "content", ""),
                       getattr(o, "data", "")) for o in outcomes])
    await check(world, client, cid, set(labels))


async def check(world: World, client: FaceClient, cid: str, labels: set[str]) -> None:
    truth_face = await RawClient.connect(world.mind.url, world.mind.token)
    try:
        tasks: list[dict[str, Any]] = []

        async def settled() -> bool:
            rid = await truth_face.command("face.task.list", limit=200)
            listed = (await truth_face.reply(rid))["payload"]["data"]["tasks"]
            tasks[:] = [t for t in listed if t["conversation_id"] == cid]
            return all(OUTBOX.is_terminal(t["state"]) for t in tasks)

        try:
            await until(settled, 60, "every task to reach a terminal state")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {tasks}; ran: {world.ran()}") from None
        rid = await truth_face.command("face.conversation.snapshot", conversation_id=cid,
                                       messages_limit=500)
        snapshot = (await truth_face.reply(rid))["payload"]
    finally:
        await truth_face.close()
    ran = world.ran()
    admitted = Counter(label_of(t) for t in tasks)
    assert set(admitted) <= labels
    assert all(n == 1 for n in admitted.values()), f"a request admitted two tasks: {admitted}"
    for task in tasks:
        label = label_of(task)
        assert ran[label] <= 1, f"{label} ran {ran[label]} times: {task}"
        if task["state"] == "succeeded":
            assert ran[label] == 1, task
    for label in labels - set(admitted):
        assert ran[label] == 0, f"{label} ran without being admitted"
    truth = ConversationView(cid)
    truth.apply_snapshot(msgspec.convert(snapshot, Snapshot))
    try:
        view = await client.wait_view(
            cid,
            lambda v: v.epoch == truth.epoch and v.seq >= truth.seq and not v.streaming
            and v.summary()["tasks"] == truth.summary()["tasks"],
            30,
        )
    except TimeoutError:
        view = client.views[cid]
        raise AssertionError(
            f"the Face's view never became the snapshot: {view.summary()} (at {view.cursor},"
            f" tasks {view.tasks}) != {truth.summary()} (at {truth.cursor})") from None
    assert view.summary() == truth.summary()


async def chaos(tmp: Path) -> Counter[str]:
    world = World(tmp)
    states: Counter[str] = Counter()
    await world.start()
    client = FaceClient(world.mind.url, world.mind.token,
                        delays=lambda: backoff(initial=0.02, cap=0.3))
    try:
        await client.connect(timeout=30)
        first = int(os.environ.get("HALFPI_TASK_CHAOS_FIRST", "0"))  # to replay one
        for index in range(first, first + SCHEDULES):
            try:
                await asyncio.wait_for(run_schedule(world, client, index), 120)
            except BaseException as exc:
                raise AssertionError(f"schedule {index} (seed {SEED + index}) failed: "
                                     f"{exc!r}\nMind: {world.mind.log()}") from exc
        truth = await RawClient.connect(world.mind.url, world.mind.token)
        try:
            rid = await truth.command("face.task.list", limit=200)
            for task in (await truth.reply(rid))["payload"]["data"]["tasks"]:
                states[task["state"]] += 1
        finally:
            await truth.close()
    finally:
        await client.close()
        await world.stop()
    return states


def test_tasks_run_at_most_once_and_end_once_under_chaos(tmp_path: Path) -> None:
    states = asyncio.run(chaos(tmp_path))
    print("task states:", dict(states))
    assert sum(states.values()) >= SCHEDULES, states
    assert states["succeeded"] > 0, states
