"""Two clocks: a step of the wall clock stalls no timer of the Mind (issue 23, 4).

Wall time is what people see and what is stored (``ts``, ``expires_at``,
``created_at``); every duration — heartbeats, liveness, revocation polling,
approval TTLs, a Hand's grace, a run's deadline, the maintenance round —
counts on the monotonic clock (STYLE: two clocks; aioquic takes ``now``).
An operator or NTP setting the system clock back an hour must not stop the
Mind's timers for an hour, nor one set forward fire them all at once.

The rig's :class:`FakeClock` moves the wall clock alone (``step_wall``);
one test drives a Mind's scheduler from the real event loop while its wall
clock jumps.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config
from halfpi.errors import CloseCode
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.hands import DEADLINE_SLACK_S
from halfpi.mind.service import Mind
from halfpi.mind.subscriptions import ConversationView
from halfpi.store.sqlite import SQLiteStore
from tests.mind.test_approvals import waiting_approval
from tests.mind.test_hand_runs import running_chat
from tests.mind.test_maintenance import maintenance_after
from tests.mind.test_tasks import (
    deliveries,
    receipt,
    start_task,
    task_event,
    until_async,
    until_attempts,
)
from tests.support.clock import T0, WALL0
from tests.support.frames import Frame, event
from tests.support.rig import Peer, Rig, fake_time_mind
from tests.support.wait import until

HOUR = 3600.0
STEPS = pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["back", "forward"])


class SteppedWall:
    """The real wall clock, plus an offset the test sets (a clock step)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


async def test_a_running_minds_scheduler_ignores_a_step_of_its_wall_clock(
    tmp_path: Path,
) -> None:
    """Production: the scheduler is driven by the event loop. A timer due in
    50 ms fires in 50 ms although the wall clock went back an hour meanwhile;
    one due in an hour does not fire when the wall clock jumps an hour on."""
    config = Config(home=tmp_path, port=0, local_hand=False)
    wall = SteppedWall()
    mind = Mind(config, SQLiteStore(config.db_path), MemoryJournal(config.journal),
                ScriptedAgent(0.0), clock=wall)
    loop = asyncio.get_running_loop()
    mind.scheduler.start()
    try:
        soon = loop.create_future()
        mind.scheduler.call_later(0.05, soon.set_result, None)
        started = loop.time()
        wall.offset = -HOUR
        await asyncio.wait_for(soon, 5)
        assert loop.time() - started < 1.0

        later: list[str] = []
        mind.scheduler.call_later(HOUR, later.append, "an hour")
        wall.offset = +HOUR
        looked = loop.create_future()
        mind.scheduler.call_later(0.05, looked.set_result, None)  # the driver looked again
        await asyncio.wait_for(looked, 5)
        assert later == [], "a wall clock set forward fires no timer early"
    finally:
        mind.scheduler.close()


@STEPS
async def test_heartbeats_liveness_and_revocation_keep_time_across_a_wall_step(
    tmp_path: Path, step: float
) -> None:
    liveness = Config(home=tmp_path)
    async with fake_time_mind(
        tmp_path / "home",
        heartbeat_s=liveness.heartbeat_s,
        dead_after_s=liveness.dead_after_s,
    ) as rig:
        period = rig.mind.config.credential_poll_s
        face = await rig.face()
        hand = await rig.hand("dev")
        assert rig.clock.step_wall(step) == 0, "a wall step runs no timer"
        await maintenance_after(rig, liveness.heartbeat_s - period)
        assert face.wire.pings == 0
        await maintenance_after(rig, period)
        assert face.wire.pings == 1 and len(face.wire.of_type("face.ping")) == 1
        assert hand.wire.pings == 1

        # Revocation is polled every round (the maintenance round's own timer).
        await rig.mind.store.revoke_credential("hand", "dev", rig.clock.wall())
        await maintenance_after(rig, period)
        assert hand.wire.closed_with == CloseCode.REVOKED

        await maintenance_after(rig, liveness.dead_after_s - liveness.heartbeat_s - 2 * period)
        assert face.wire.closed_with is None, "not presumed dead before dead_after_s"
        await maintenance_after(rig, period)
        assert face.wire.closed_with == CloseCode.GOING_AWAY


@STEPS
async def test_an_approval_expires_after_its_ttl_whatever_the_wall_clock_does(
    tmp_path: Path, step: float
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        ttl = rig.mind.config.approval_ttl_s
        face, _, chat, approval_id = await waiting_approval(rig)
        requested = await rig.expect(face, event("approval.requested"))
        assert requested["payload"]["data"]["expires_at"] == WALL0 + ttl  # shown: wall time

        rig.clock.step_wall(step)
        rig.advance(ttl - 0.001)
        assert rig.mind.approvals.live[approval_id].state == "pending", "not before its TTL"
        rig.advance(0.001)
        resolved = await rig.expect(face, event("approval.resolved", approval_id=approval_id))
        assert resolved["payload"]["data"]["status"] == "expired"
        assert resolved["payload"]["ts"] == WALL0 + step + ttl  # stamped: wall time
        assert (await rig.reply(face, chat))["payload"]["content"].startswith(
            "exec_command expired")


@STEPS
async def test_a_decision_within_the_ttl_applies_whatever_the_wall_clock_says(
    tmp_path: Path, step: float
) -> None:
    """The decision is checked against the TTL's duration, not against
    ``expires_at`` on a wall clock that moved."""
    async with fake_time_mind(tmp_path / "home") as rig:
        face, _, _, approval_id = await waiting_approval(rig)
        rig.clock.step_wall(step)
        rig.advance(rig.mind.config.approval_ttl_s / 2)
        answer = await rig.reply(face, await rig.command(
            face, "face.approval.resolve", approval_id=approval_id, decision="allow_once"))
        assert answer["type"] == "face.result", answer
        assert answer["payload"]["data"]["outcome"] == "applied"


@STEPS
async def test_a_runs_deadline_keeps_time_across_a_wall_step(
    tmp_path: Path, step: float
) -> None:
    async with fake_time_mind(tmp_path / "home", approval_required=()) as rig:
        face, hand, chat, run_id = await running_chat(rig)
        rig.clock.step_wall(step)
        deadline = 60 + DEADLINE_SLACK_S  # the call's timeout_s, then the Mind's slack
        rig.advance(deadline - 0.001)
        assert hand.wire.of_type("hand.cancel") == [], "not before its deadline"
        rig.advance(0.001)
        assert [f["payload"] for f in hand.wire.of_type("hand.cancel")] == [{"run_id": run_id}]
        await rig.expect(face, event("chat.tool_completed", request_id=chat))


@STEPS
async def test_a_hands_grace_keeps_time_across_a_wall_step(
    tmp_path: Path, step: float
) -> None:
    async with fake_time_mind(tmp_path / "home", approval_required=()) as rig:
        face, hand, _, run_id = await running_chat(rig)
        hand.session.on_closed()  # the Hand's process was killed
        await rig.expect(face, event("hand.disconnected", hand_id="dev"))
        rig.clock.step_wall(step)
        grace = rig.mind.config.hand_grace_s
        rig.advance(grace - 0.001)
        assert run_id in rig.mind.hands.runs, "not lost before the grace"
        rig.advance(0.001)
        assert run_id not in rig.mind.hands.runs


@STEPS
async def test_a_tasks_redelivery_keeps_time_across_a_wall_step(
    tmp_path: Path, step: float
) -> None:
    """An outbox row's next attempt is stored as wall time; the wait for it
    is counted on the monotonic clock, and the row is due when it ends."""
    async with fake_time_mind(tmp_path / "home") as rig:
        rig.mind.tasks.draw = lambda: 0.5  # no jitter: the wait is exactly 2 s
        hand = await rig.hand("dev")
        face = await rig.face()
        cid = await rig.conversation(face)
        task_id = await start_task(rig, face, cid)
        await rig.take(hand, lambda f: f["type"] == "hand.task.deliver")
        await until_attempts(rig, task_id, 1)
        rig.clock.step_wall(step)
        rig.advance(2.0 - 0.001)
        assert len(deliveries(hand)) == 1, "not before its time"
        rig.advance(0.001)
        await rig.take(hand, lambda f: f["type"] == "hand.task.deliver")
        await until_attempts(rig, task_id, 2)


@STEPS
async def test_a_moved_subscription_retries_after_its_backoff_on_the_minds_clock(
    tmp_path: Path, step: float
) -> None:
    """Following a conversation again after it changed hands (cluster mode)
    retries with a backoff (0.1 s, doubling) on the Mind's scheduler."""
    async with fake_time_mind(tmp_path / "home") as rig:
        face = await rig.face()
        cid = await rig.conversation(face)
        subscriptions = face.session.subscriptions
        tries: list[float] = []

        async def flaky_view(conversation_id: str) -> ConversationView:
            tries.append(rig.clock.now)
            if len(tries) == 1:
                raise ConnectionError("the owner's node is not answering yet")
            return await rig.mind.view(conversation_id)

        subscriptions.move(cid, flaky_view)
        await until(lambda: len(tries) == 1 and rig.mind.scheduler.next_deadline() == T0 + 0.1)
        rig.clock.step_wall(step)
        rig.advance(0.1 - 0.001)
        assert len(tries) == 1, "not before its backoff"
        rig.advance(0.001)
        await until(lambda: cid in subscriptions)
        assert tries == [T0, pytest.approx(T0 + 0.1)]


async def test_what_a_face_is_shown_is_wall_time_never_the_monotonic_clock(
    tmp_path: Path,
) -> None:
    """``face.ping{ts}`` is a time a Face may show or compare with its own:
    wall time, as every ``ts``. The rig's two clocks never read alike, so a
    monotonic reading in its place is seen."""
    liveness = Config(home=tmp_path)
    async with fake_time_mind(tmp_path / "home", heartbeat_s=liveness.heartbeat_s) as rig:
        face = await rig.face()
        await maintenance_after(rig, liveness.heartbeat_s)
        pings = face.wire.of_type("face.ping")
        assert len(pings) == 1
        assert pings[0]["payload"]["ts"] == pytest.approx(rig.clock.wall(), abs=1.0)


DELIVER = "hand.task.deliver"


async def two_tasks_one_second_apart(
    rig: Rig, step: float
) -> tuple[Peer, Peer, str, str, Frame]:
    """Two tasks delivered, the first at T0 (due again at +2 s), the second
    at +1 s (due again at +3 s); the wall clock stepped by ``step`` between."""
    rig.mind.tasks.draw = lambda: 0.5  # no jitter: each waits exactly 2 s
    hand = await rig.hand("dev")
    face = await rig.face()
    cid = await rig.conversation(face)
    first = await start_task(rig, face, cid)
    order = (await rig.take(hand, lambda f: f["type"] == DELIVER))["payload"]
    await until_attempts(rig, first, 1)
    rig.clock.step_wall(step)
    rig.advance(1.0)
    await start_task(rig, face, cid)
    started = await rig.take(face, lambda f: task_event("task.started")(f)
                             and f["payload"]["data"]["task"]["task_id"] != first)
    second = str(started["payload"]["data"]["task"]["task_id"])
    await rig.take(hand, lambda f: f["type"] == DELIVER)
    await until_attempts(rig, second, 1)
    return face, hand, first, second, order


async def test_a_later_redelivery_is_not_dropped_for_an_earlier_one(tmp_path: Path) -> None:
    """Each row waiting for its Hand's receipt is looked at again when its
    wait ends, whatever else is waiting: an earlier wake that finds nothing
    due (its task was received) does not make the later one forgotten."""
    async with fake_time_mind(tmp_path / "home") as rig:
        face, hand, first, second, order = await two_tasks_one_second_apart(rig, 0.0)
        hand.send("hand.task.receipt", receipt(order))  # the first: never due again

        async def received() -> bool:
            row = await rig.mind.store.get_task(first)
            return row is not None and row.delivered_at is not None

        await until_async(received)
        rig.advance(1.0)  # +2 s: the first's wait ends; nothing is due
        # A round trip through the Store: the look at +2 s (asked first) is over.
        asked = await rig.command(face, "face.task.get", task_id=first)
        await rig.reply(face, asked)
        rig.advance(1.0)  # +3 s: the second's wait ends
        await until_attempts(rig, second, 2)


async def test_a_wait_set_before_a_wall_step_back_is_kept_by_a_later_one(
    tmp_path: Path,
) -> None:
    """The first task's wait was set before the wall clock went back an
    hour; the second's, set after, is earlier in wall time. The first is
    still delivered again after its 2 s, not an hour later."""
    async with fake_time_mind(tmp_path / "home") as rig:
        _, _, first, _, _ = await two_tasks_one_second_apart(rig, -HOUR)
        rig.advance(1.0)  # +2 s of the monotonic clock
        await until_attempts(rig, first, 2)
