"""Tool runs on Hands (DESIGN §8): first terminal wins (I10), never re-run (I11).

The registry is tested on its own with a fake link and a fake clock (no
sockets; its grace and deadlines pass in microseconds), then the whole Mind
on a fake clock, then end to end: a Hand speaking the raw protocol over a
real socket, real :class:`HandNode` instances (tasks of this loop) that die
and come back, and a Mind process killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets

from halfpi.core.events import EventData, HandLinkRefused
from halfpi.core.hand_wire import (
    HAND_PROTOCOL,
    HandHello,
    HandInfo,
    HandProgress,
    HandResult,
    HandRunRef,
    HandStarted,
    HandTool,
)
from halfpi.face.client import ConnectionLost, Transport
from halfpi.hand.node import HandNode
from halfpi.mind.hands import DEADLINE_SLACK_S, HandInUse, HandRegistry, ToolRun
from halfpi.mind.tools import CANCEL_SETTLE_S
from tests.support.cli import halfpi_cli
from tests.support.client import FaceClient
from tests.support.clock import FakeClock
from tests.support.frames import Frame, event, events_of
from tests.support.hand import FakeLink, allow_check, hello_payload, honest_result
from tests.support.mind import LocalMind, MindProcess, hand_ready, local_mind
from tests.support.procs import Marks
from tests.support.rig import Peer, Rig, fake_time_mind

# -- the registry alone ---------------------------------------------------------------------


def hello(instance: str = "inst-1", runs: tuple[tuple[str, int], ...] = ()) -> HandHello:
    return HandHello(
        token="t",
        hand_id="dev",
        instance_id=instance,
        info=HandInfo(hostname="h", os="o", arch="a", version="0"),
        tools=[HandTool(name="exec_command")],
        protocol=HAND_PROTOCOL,
        runs=[HandRunRef(run_id=r, generation=g) for r, g in runs],
    )


def result(run_id: str, generation: int, status: str = "succeeded") -> HandResult:
    return HandResult(**honest_result(run_id, generation, status))


@dataclass
class Watched:
    """A run plus every state change the registry reported for it."""

    run: ToolRun
    states: list[str] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)

    @property
    def terminal(self) -> list[str]:
        return [s for s in self.states if s != "running"]


def new_run(run_id: str = "x_1") -> Watched:
    watched: Watched

    def on_state(status: str) -> None:
        watched.states.append(status)

    def on_progress(kind: str, text: str, gap: bool) -> None:
        watched.progress.append(text)

    run = ToolRun(run_id, "dev", "exec_command", {"argv": ["true"]}, 60.0, "c_1", "t_1",
                  on_progress=on_progress, on_state=on_state)
    watched = Watched(run)
    return watched


def registry(grace_s: float = 60.0) -> HandRegistry:
    """A registry whose timers run on a fake clock (:func:`advance`)."""
    return HandRegistry(FakeClock().scheduler(), grace_s)


def advance(hands: HandRegistry, seconds: float) -> None:
    clock = hands.scheduler.clock
    assert isinstance(clock, FakeClock)
    clock.advance(seconds)


def started_run(hands: HandRegistry) -> tuple[FakeLink, Watched]:
    link = FakeLink(hands)
    hands.connect(link, hello(), "p_hand")
    watched = new_run()
    hands.start(watched.run)
    (order,) = link.of("hand.run")
    assert order["run_id"] == watched.run.run_id and order["generation"] == 1
    hands.on_started(link, HandStarted(run_id=watched.run.run_id, generation=1))
    assert watched.states == ["running"]
    return link, watched


@pytest.mark.parametrize("order", ["result_then_cancel", "cancel_then_results"])
async def test_I10_cancel_and_result_race_first_terminal_wins(order: str) -> None:
    hands = registry()
    link, watched = started_run(hands)
    run = watched.run
    if order == "result_then_cancel":
        hands.on_result(link, result(run.run_id, 1, "succeeded"))
        hands.cancel(run)  # back to back, after the result
        hands.on_result(link, result(run.run_id, 1, "cancelled"))  # the Hand's late answer
        expected = "succeeded"
        assert link.of("hand.cancel") == [], "a finished run is not cancelled"
    else:
        hands.cancel(run)
        assert link.of("hand.cancel") == [{"run_id": run.run_id}]
        assert not run.done.done(), "a cancel is a request; the Hand's answer decides"
        hands.on_result(link, result(run.run_id, 1, "cancelled"))
        hands.on_result(link, result(run.run_id, 1, "succeeded"))  # finished meanwhile
        expected = "cancelled"
    assert watched.terminal == [expected], "one terminal state, reported once"
    assert run.state == expected
    assert run.done.result()["status"] == expected
    assert run.run_id not in hands.runs
    # Both results are acknowledged: the Hand may forget them either way.
    assert link.acked() == [run.run_id, run.run_id]


async def test_I10_mind_side_cancel_while_hand_away_wins_over_resent_result() -> None:
    hands = registry()
    link, watched = started_run(hands)
    run = watched.run
    hands.disconnect(link)
    hands.cancel(run)  # the Hand cannot be told: the Mind decides, at once
    assert watched.terminal == ["cancelled"]
    assert run.done.result()["status"] == "cancelled"
    back = FakeLink(hands)
    welcome = hands.connect(back, hello(runs=((run.run_id, 1),)), "p_hand")
    assert welcome.adopted == [] and welcome.abandon == [run.run_id]
    hands.on_result(back, result(run.run_id, welcome.generation, "succeeded"))
    assert watched.terminal == ["cancelled"]
    assert back.of("hand.run") == []


async def test_stale_generation_refused_and_adopted_run_accepts_resend() -> None:
    hands = registry()
    link, watched = started_run(hands)
    run = watched.run
    hands.disconnect(link)
    back = FakeLink(hands)
    welcome = hands.connect(back, hello(runs=((run.run_id, 1),)), "p_hand")
    assert welcome.generation == 2
    assert welcome.adopted == [run.run_id] and welcome.abandon == []
    assert run.generation == 2

    # Stamped with the old generation: refused and not acknowledged.
    hands.on_progress(back, HandProgress(run_id=run.run_id, generation=1, kind="stdout",
                                         data="old"))
    hands.on_result(back, result(run.run_id, 1, "succeeded"))
    assert back.acked() == [] and not run.done.done()
    assert watched.terminal == [] and watched.progress == []
    # The old connection's late frames are refused the same way.
    hands.on_result(link, result(run.run_id, 1, "failed"))
    assert link.acked() == [] and not run.done.done()

    # The Hand re-sends under the adopting generation: accepted, once.
    hands.on_progress(back, HandProgress(run_id=run.run_id, generation=2, kind="stdout",
                                         data="new"))
    hands.on_result(back, result(run.run_id, 2, "succeeded"))
    assert back.acked() == [run.run_id]
    assert watched.progress == ["new"]
    assert watched.terminal == ["succeeded"]
    assert back.of("hand.run") == [], "an adopted run is never sent again"


async def test_a_second_link_for_a_live_hand_is_refused_and_the_first_keeps_its_runs() -> None:
    """A stolen token does not displace a Hand that is still there (issue:
    an impostor took over and returned a forged result): the newcomer is
    refused, the first link stays bound and its run still reports."""
    hands = registry(grace_s=10.0)
    link, watched = started_run(hands)
    impostor = FakeLink(hands)
    with pytest.raises(HandInUse) as refused:
        hands.connect(impostor, hello(instance="inst-2", runs=((watched.run.run_id, 1),)),
                      "p_hand")
    assert refused.value.holder is link
    assert link.closed == [] and impostor.closed == []
    state = hands.hands["dev"]
    assert state.link is link and state.generation == 1
    refused_record = state.to_wire()["refused"]
    assert refused_record["count"] == 1 and refused_record["address"] == impostor.address
    assert refused_record["at"] >= state.connected_at
    assert impostor.of("hand.run") == []
    hands.on_result(link, result(watched.run.run_id, 1))
    assert watched.terminal == ["succeeded"]


async def test_refused_links_are_audited_where_a_person_waits_on_the_hand() -> None:
    """``hand.link_refused`` in each conversation with a run on the Hand, for
    the 1st, 2nd, 4th, 8th… refusal: a claimant retrying every second for
    an hour writes a dozen events, not thousands."""
    hands = registry()
    published: list[tuple[set[str], EventData]] = []
    hands.on_audit = lambda conversations, data: published.append((conversations, data))
    started_run(hands)  # a run in c_1
    for n in range(1, 9):
        impostor = FakeLink(hands)
        impostor.address = f"203.0.113.{n}"
        with pytest.raises(HandInUse):
            hands.connect(impostor, hello(instance=f"inst-x{n}"), "p_hand")
    assert [(c, d) for c, d in published] == [
        ({"c_1"}, HandLinkRefused(hand_id="dev", address=f"203.0.113.{n}", count=n))
        for n in (1, 2, 4, 8)
    ]
    assert hands.hands["dev"].to_wire()["refused"]["count"] == 8


async def test_superseding_connection_keeps_runs_and_closes_the_old_one() -> None:
    """A Hand that comes back while its old link has failed its liveness
    check (a ping went unanswered) takes its place and keeps its runs."""
    hands = registry(grace_s=10.0)
    link, watched = started_run(hands)
    link.live = False
    newer = FakeLink(hands)
    welcome = hands.connect(newer, hello(runs=((watched.run.run_id, 1),)), "p_hand")
    assert link.closed and link.closed[0][0] == 1001
    assert welcome.adopted == [watched.run.run_id]
    state = hands.hands["dev"]
    assert state.link is newer and state.grace is None
    assert hands.connected("dev")
    advance(hands, 30.0)  # past the grace: the old link's close started none for the new one
    assert not watched.run.done.done()
    hands.on_result(newer, result(watched.run.run_id, 2))
    assert watched.terminal == ["succeeded"]


async def test_I11_new_instance_loses_runs_of_the_old_one() -> None:
    hands = registry()
    link, watched = started_run(hands)
    hands.disconnect(link)
    fresh = FakeLink(hands)
    welcome = hands.connect(fresh, hello(instance="inst-2"), "p_hand")
    assert welcome.adopted == [] and welcome.abandon == []
    assert watched.terminal == ["lost"]
    outcome = watched.run.done.result()
    assert outcome["error_category"] == "lost" and "restarted" in outcome["error"]
    # The old process's result, should it ever arrive, changes nothing.
    hands.on_result(fresh, result(watched.run.run_id, welcome.generation))
    assert watched.terminal == ["lost"]
    assert fresh.of("hand.run") == []


async def test_I11_reconnect_without_the_run_loses_it() -> None:
    hands = registry()
    link, watched = started_run(hands)
    hands.disconnect(link)
    back = FakeLink(hands)
    hands.connect(back, hello(), "p_hand")  # same process, but it no longer has the run
    assert watched.terminal == ["lost"]
    assert back.of("hand.run") == []


async def test_I11_hand_away_beyond_grace_loses_its_runs() -> None:
    hands = registry(grace_s=10.0)
    link, watched = started_run(hands)
    hands.disconnect(link)
    advance(hands, 9.999)
    assert not watched.run.done.done() and watched.terminal == [], "not before the grace"
    advance(hands, 0.001)
    assert watched.terminal == ["lost"]
    outcome = watched.run.done.result()
    assert outcome["status"] == "lost" and outcome["error_category"] == "lost"
    assert "stayed away too long" in outcome["error"]
    back = FakeLink(hands)
    welcome = hands.connect(back, hello(runs=((watched.run.run_id, 1),)), "p_hand")
    assert welcome.abandon == [watched.run.run_id], "the Hand is told to kill it"
    assert back.of("hand.run") == []
    assert watched.terminal == ["lost"]


async def test_I11_hand_back_within_grace_keeps_its_runs() -> None:
    hands = registry(grace_s=10.0)
    link, watched = started_run(hands)
    hands.disconnect(link)
    advance(hands, 9.999)
    back = FakeLink(hands)
    welcome = hands.connect(back, hello(runs=((watched.run.run_id, 1),)), "p_hand")
    assert welcome.adopted == [watched.run.run_id]
    advance(hands, 30.0)  # past the grace, which was called off: the run is still the Hand's
    assert watched.terminal == [] and not watched.run.done.done()
    hands.on_result(back, result(watched.run.run_id, welcome.generation))
    assert watched.terminal == ["succeeded"]


async def test_a_silent_run_times_out_at_the_minds_deadline_and_the_hand_is_told() -> None:
    hands = registry()
    link, watched = started_run(hands)  # timeout_s 60: the Mind waits 5 s more
    advance(hands, 64.999)
    assert watched.terminal == [] and link.of("hand.cancel") == []
    advance(hands, 0.001)
    assert watched.terminal == ["timed_out"]
    outcome = watched.run.done.result()
    assert outcome["status"] == "timed_out" and outcome["error_category"] == "timeout"
    assert link.of("hand.cancel") == [{"run_id": watched.run.run_id}]
    hands.on_result(link, result(watched.run.run_id, 1, "timed_out"))  # the Hand's late word
    assert watched.terminal == ["timed_out"]


async def test_a_finished_run_leaves_no_timer_behind() -> None:
    hands = registry()
    link, watched = started_run(hands)
    assert len(hands.scheduler.timers) == 1  # the run's deadline
    hands.on_result(link, result(watched.run.run_id, 1))
    assert len(hands.scheduler.timers) == 0
    advance(hands, 3600.0)
    assert watched.terminal == ["succeeded"] and link.of("hand.cancel") == []


# -- the Mind's timers for runs, on a fake clock (whole Mind, no sockets) --------------------

SLEEP_TOOL = '/tool exec_command {"command": "sleep 30", "timeout_s": 60, "hand": "dev"}'


async def running_chat(rig: Rig) -> tuple[Peer, Peer, str, str]:
    """A Face following a conversation whose chat runs a tool on Hand ``dev``
    (started, then silent): ``(face, hand, chat request_id, run_id)``."""
    hand = await rig.hand("dev")
    face = await rig.face()
    cid = await rig.conversation(face)
    chat = await rig.command(face, "face.chat", conversation_id=cid, content=SLEEP_TOOL)
    run_id, generation = await rig.dispatched(hand)
    hand.send("hand.started", {"run_id": run_id, "generation": generation})
    await rig.expect(face, event("run.changed", run_id=run_id, status="running"))
    return face, hand, chat, run_id


async def test_I11_hand_away_past_grace_its_run_is_lost_and_never_sent_again(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home", approval_required=()) as rig:
        grace = rig.mind.config.hand_grace_s
        face, hand, chat, run_id = await running_chat(rig)
        hand.session.on_closed()  # its connection is gone (the process was killed)
        await rig.expect(face, event("hand.disconnected", hand_id="dev"))
        rig.advance(grace - 0.001)
        assert run_id in rig.mind.hands.runs, "not lost before the grace"
        rig.advance(0.001)
        assert run_id not in rig.mind.hands.runs
        completed = await rig.expect(face, event("chat.tool_completed", request_id=chat))
        data = completed["payload"]["data"]
        assert (data["run_id"], data["status"], data["error_category"]) == (run_id, "lost", "lost")
        reply = await rig.reply(face, chat)
        assert reply["payload"]["content"].startswith(
            "exec_command lost: the Hand stayed away too long"
        )

        # The same Hand as a new process: welcomed, never sent the lost run.
        back = await rig.hand("dev", instance="2")
        welcome = back.seen(lambda f: f["type"] == "hand.welcome")[0]["payload"]
        assert welcome["adopted"] == [] and welcome["abandon"] == []
        cid = completed["payload"]["conversation_id"]
        await rig.command(face, "face.chat", conversation_id=cid, content=SLEEP_TOOL)
        fresh, _ = await rig.dispatched(back)
        assert fresh != run_id
        assert [f["payload"]["run_id"] for f in back.wire.of_type("hand.run")] == [fresh]


async def test_a_silent_run_times_out_at_the_minds_deadline_through_the_chat(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home", approval_required=()) as rig:
        face, hand, chat, run_id = await running_chat(rig)
        deadline = 60 + DEADLINE_SLACK_S  # the call's timeout_s, then the Mind's slack
        rig.advance(deadline - 0.001)
        assert run_id in rig.mind.hands.runs and hand.wire.of_type("hand.cancel") == []
        rig.advance(0.001)
        assert [f["payload"] for f in hand.wire.of_type("hand.cancel")] == [{"run_id": run_id}]
        completed = await rig.expect(face, event("chat.tool_completed", request_id=chat))
        data = completed["payload"]["data"]
        assert (data["status"], data["error_category"]) == ("timed_out", "timeout")
        reply = await rig.reply(face, chat)
        assert reply["payload"]["content"].startswith("exec_command timed_out")


async def test_a_cancelled_run_whose_hand_stays_silent_is_lost_after_the_settle_time(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home", approval_required=()) as rig:
        face, hand, chat, run_id = await running_chat(rig)
        cid = (await rig.expect(face, event("chat.started")))["payload"]["conversation_id"]
        await rig.command(face, "face.chat.cancel", conversation_id=cid, target_request_id=chat)
        await rig.expect(hand, lambda f: f["type"] == "hand.cancel")
        rig.advance(CANCEL_SETTLE_S - 0.001)
        assert run_id in rig.mind.hands.runs, "the Hand's answer is still awaited"
        rig.advance(0.001)
        completed = await rig.expect(face, event("chat.tool_completed", request_id=chat))
        assert completed["payload"]["data"]["status"] == "lost"
        reply = await rig.reply(face, chat)
        assert reply["payload"]["status"] == "cancelled"


# -- end to end: a Hand speaking the raw protocol --------------------------------------------


def read_one(db: Path, table: str, key: str, value: str) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,)).fetchone()
        assert row is not None, (table, value)
        return dict(row)


async def snapshot(face: FaceClient, cid: str) -> dict[str, Any]:
    request_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    reply = await face.reply(request_id)
    assert reply["type"] == "face.snapshot", reply
    return dict(reply["payload"])


def hand_url(lmind: LocalMind) -> str:
    return f"ws://127.0.0.1:{lmind.server.port}/v1/hand"


async def add_hand(lmind: LocalMind, label: str) -> str:
    """``halfpi hand add LABEL`` as a real process; the Mind then knows the token."""
    run = await halfpi_cli("hand", "add", label, "--home", str(lmind.config.home))
    assert run.returncode == 0, run.stderr
    token = run.stdout.strip()
    await lmind.mind.refresh_credentials()
    assert lmind.mind.auth.authenticate(token, "hand") is not None
    return token


async def raw_hand(lmind: LocalMind, token: str, label: str, instance: str,
                   runs: list[dict[str, Any]] | None = None) -> tuple[FaceClient, Frame]:
    hand = await FaceClient.connect(hand_url(lmind), hello=False)
    await hand.send("hand.hello", hello_payload(token, label, instance, runs=runs))
    welcome = await hand.expect(lambda f: f["type"] == "hand.welcome")
    return hand, welcome["payload"]


def terminal_run_states(frames: list[Frame], run_id: str) -> list[str]:
    return [f["payload"]["data"]["status"] for f in events_of(frames, "run.changed", run_id=run_id)
            if f["payload"]["data"]["status"] not in ("queued", "running")]


def of_type(type_: str) -> Callable[[Frame], bool]:
    return lambda f: f["type"] == type_


def hand_result(run_id: str, generation: int, status: str) -> dict[str, Any]:
    return honest_result(run_id, generation, status)


@dataclass
class Scene:
    lmind: LocalMind
    owner: FaceClient
    watcher: FaceClient
    cid: str


@contextlib.asynccontextmanager
async def scene(home: Path, **config: Any) -> AsyncIterator[Scene]:
    """A Mind with no local Hand, and two Faces subscribed to one conversation.
    Its raw Hands run exec_command without approval (their rule, and no floor)."""
    config.setdefault("approval_required", ())
    async with local_mind(home, local_hand=False, **config) as lmind:
        owner = await FaceClient.connect(lmind.url, lmind.token)
        watcher = await FaceClient.connect(lmind.url, lmind.token)
        cid = await owner.create_conversation()
        await owner.subscribe(cid)
        await watcher.subscribe(cid, detail_mode="summary")
        try:
            yield Scene(lmind, owner, watcher, cid)
        finally:
            await owner.close()
            await watcher.close()


async def dispatched(hand: FaceClient) -> tuple[str, int]:
    """Answer the policy check, then take the order."""
    check = await hand.expect(of_type("hand.check"))
    await hand.send("hand.checked", allow_check(check["payload"]))
    order = await hand.expect(of_type("hand.run"))
    return order["payload"]["run_id"], order["payload"]["generation"]


@pytest.mark.parametrize("first", ["succeeded", "cancelled"])
async def test_I10_cancel_and_result_race_first_terminal_wins_end_to_end(
    tmp_path: Path, first: str
) -> None:
    second = "cancelled" if first == "succeeded" else "succeeded"
    async with scene(tmp_path / "home") as s:
        token = await add_hand(s.lmind, "fake")
        hand, _ = await raw_hand(s.lmind, token, "fake", "inst-1")
        chat_id = await s.owner.command("face.chat", conversation_id=s.cid,
                                        content='/tool exec_command {"argv": ["true"]}')
        run_id, generation = await dispatched(hand)
        await hand.send("hand.started", {"run_id": run_id, "generation": generation})
        await s.owner.expect(event("run.changed", run_id=run_id, status="running"))

        cancel_id = await s.owner.command("face.run.cancel", run_id=run_id)
        await s.owner.reply(cancel_id, ("face.accepted", "face.error"))
        await hand.expect(lambda f: f["type"] == "hand.cancel"
                          and f["payload"]["run_id"] == run_id)
        # Two terminal reports back to back: the Hand finished as the cancel landed.
        await hand.send("hand.result", hand_result(run_id, generation, first))
        await hand.send("hand.result", hand_result(run_id, generation, second))

        chat = await s.owner.reply(chat_id)
        assert chat["payload"]["status"] == "succeeded"
        assert chat["payload"]["content"].startswith(f"exec_command {first}")
        cancel = await s.owner.reply(cancel_id)
        assert cancel["payload"]["data"]["target_status"] == first
        assert cancel["payload"]["data"]["outcome"] == (
            "cancelled" if first == "cancelled" else "already_finished")
        await s.watcher.expect(event("chat.completed", request_id=chat_id))
        for face in (s.owner, s.watcher):
            completed = events_of(face.seen, "chat.tool_completed", request_id=chat_id)
            assert [c["payload"]["data"]["status"] for c in completed] == [first]
            assert terminal_run_states(face.seen, run_id) == [first]
        # Both reports were acknowledged, so the Hand keeps neither.
        await hand.send("hand.ping", {})
        await hand.expect(of_type("hand.pong"))
        acked = [r for f in hand.seen if f["type"] == "hand.ack" for r in f["payload"]["run_ids"]]
        assert acked == [run_id, run_id]
        assert len([f for f in hand.seen if f["type"] == "hand.run"]) == 1
        snap = await snapshot(s.owner, s.cid)
        assert [r["status"] for r in snap["tool_history"]] == [first]
        assert snap["active_runs"] == []
        stored = read_one(s.lmind.config.db_path, "tool_runs", "run_id", run_id)
        assert stored["status"] == first
        await hand.close()


async def test_I10_run_cancel_after_the_result_converges(tmp_path: Path) -> None:
    async with scene(tmp_path / "home") as s:
        token = await add_hand(s.lmind, "fake")
        hand, _ = await raw_hand(s.lmind, token, "fake", "inst-1")
        chat_id = await s.owner.command("face.chat", conversation_id=s.cid,
                                        content='/tool exec_command {"argv": ["true"]}')
        run_id, generation = await dispatched(hand)
        await hand.send("hand.result", hand_result(run_id, generation, "succeeded"))
        await hand.expect(of_type("hand.ack"))
        await s.owner.reply(chat_id)
        cancel_id = await s.owner.command("face.run.cancel", run_id=run_id)
        reply = await s.owner.reply(cancel_id)
        assert reply["type"] == "face.result", reply
        assert reply["payload"]["data"] == {
            "outcome": "already_finished", "run_id": run_id, "target_status": "succeeded"}
        await hand.close()


async def test_run_cancel_replay_returns_the_stored_result(tmp_path: Path) -> None:
    async with scene(tmp_path / "home") as s:
        token = await add_hand(s.lmind, "fake")
        hand, _ = await raw_hand(s.lmind, token, "fake", "inst-1")
        chat_id = await s.owner.command("face.chat", conversation_id=s.cid,
                                        content='/tool exec_command {"argv": ["true"]}')
        run_id, generation = await dispatched(hand)
        cancel_id = await s.owner.command("face.run.cancel", run_id=run_id)
        await hand.expect(of_type("hand.cancel"))
        await hand.send("hand.result", hand_result(run_id, generation, "cancelled"))
        first = await s.owner.reply(cancel_id)
        assert first["payload"]["data"]["outcome"] == "cancelled"
        await s.owner.reply(chat_id)
        # The same request again (an SDK re-sends it after a reconnect): same answer.
        await s.owner.command("face.run.cancel", cancel_id, run_id=run_id)
        again = await s.owner.reply(cancel_id)
        assert again["type"] == "face.result", again
        assert again["payload"]["data"] == first["payload"]["data"]
        await hand.close()


async def test_stale_generation_result_refused_then_adopted_run_accepts_resend(
    tmp_path: Path,
) -> None:
    async with scene(tmp_path / "home") as s:
        token = await add_hand(s.lmind, "fake")
        hand, welcome = await raw_hand(s.lmind, token, "fake", "inst-1")
        assert welcome["generation"] == 1
        chat_id = await s.owner.command("face.chat", conversation_id=s.cid,
                                        content='/tool exec_command {"argv": ["true"]}')
        run_id, generation = await dispatched(hand)
        assert generation == 1
        await hand.close()  # the link drops; the run goes on on the device

        hand, welcome = await raw_hand(s.lmind, token, "fake", "inst-1",
                                       runs=[{"run_id": run_id, "generation": 1}])
        assert welcome["generation"] == 2
        assert welcome["adopted"] == [run_id] and welcome["abandon"] == []
        # A result stamped with the old generation is refused: no ack. The
        # pong proves the Mind handled it (frames are handled in order).
        await hand.send("hand.result", hand_result(run_id, 1, "succeeded"))
        await hand.send("hand.ping", {})
        await hand.expect(of_type("hand.pong"))
        assert [f for f in hand.seen if f["type"] == "hand.ack"] == []
        assert events_of(s.owner.seen, "chat.tool_completed") == []
        # Re-sent under the adopting generation: accepted and acknowledged.
        await hand.send("hand.result", hand_result(run_id, 2, "succeeded"))
        ack = await hand.expect(of_type("hand.ack"))
        assert ack["payload"]["run_ids"] == [run_id]
        chat = await s.owner.reply(chat_id)
        assert chat["payload"]["content"].startswith("exec_command succeeded")
        completed = events_of(s.owner.seen, "chat.tool_completed", request_id=chat_id)
        assert [c["payload"]["data"]["status"] for c in completed] == ["succeeded"]
        assert terminal_run_states(s.owner.seen, run_id) == ["succeeded"]
        assert len([f for f in hand.seen if f["type"] == "hand.run"]) == 0
        await hand.close()


# -- I11 with real HandNodes -----------------------------------------------------------------


class RecordingTransport:
    """A Hand's WebSocket transport that records every frame the Hand receives
    and can die the way a killed process's connection does."""

    def __init__(self, ws: Any, frames: list[Frame]) -> None:
        self.ws = ws
        self.frames = frames

    @staticmethod
    def _lost(exc: websockets.ConnectionClosed) -> ConnectionLost:
        return ConnectionLost(exc.rcvd.code if exc.rcvd else None,
                              exc.rcvd.reason if exc.rcvd else "")

    async def send(self, text: str) -> None:
        try:
            await self.ws.send(text)
        except websockets.ConnectionClosed as exc:
            raise self._lost(exc) from None

    async def recv(self) -> str:
        try:
            text = await self.ws.recv()
        except websockets.ConnectionClosed as exc:
            raise self._lost(exc) from None
        self.frames.append(json.loads(text))
        return str(text)

    async def close(self) -> None:
        await self.ws.close()

    def abort(self) -> None:
        """Cut the TCP connection with no close handshake."""
        self.ws.transport.abort()


@dataclass
class RunningHand:
    node: HandNode
    task: asyncio.Task[Any]
    frames: list[Frame]
    transports: list[RecordingTransport]

    def orders(self) -> list[str]:
        return [f["payload"]["run_id"] for f in self.frames if f["type"] == "hand.run"]

    def crash(self) -> None:
        """Die at once: the link is cut and the process loop stops, in one step."""
        for transport in self.transports:
            transport.abort()
        self.task.cancel()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        # Whatever it still ran (a dead process's children) is killed now.
        for run in list(self.node.runs.values()):
            run.cancelled.set()
        tasks = [r.task for r in self.node.runs.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)


async def start_hand(lmind: LocalMind, token: str, label: str) -> RunningHand:
    frames: list[Frame] = []
    transports: list[RecordingTransport] = []

    async def connector(url: str) -> Transport:
        try:
            ws = await websockets.connect(url, max_size=None, open_timeout=10,
                                          ping_interval=None)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise ConnectionLost(None, str(exc)) from None
        transport = RecordingTransport(ws, frames)
        transports.append(transport)
        return transport

    node = HandNode(hand_url(lmind), token, label, connector=connector)
    task = asyncio.create_task(node.run_forever())
    await asyncio.wait_for(node.connected.wait(), 10)
    assert lmind.mind.hands.connected(label)
    return RunningHand(node, task, frames, transports)


async def approve_next(face: FaceClient, chat_id: str) -> None:
    requested = await face.expect(event("approval.requested", request_id=chat_id))
    resolve_id = await face.command("face.approval.resolve",
                                    approval_id=requested["payload"]["data"]["approval_id"],
                                    decision="allow_once")
    assert (await face.reply(resolve_id))["payload"]["data"]["outcome"] == "applied"


async def test_I11_hand_lost_run_is_never_rerun(tmp_path: Path) -> None:
    """A Hand process that dies and comes back as a new one, within the
    grace: its run is lost at once. (Past the grace, on a fake clock:
    ``test_I11_hand_away_past_grace_its_run_is_lost_and_never_sent_again``.)"""
    async with scene(tmp_path / "home", hand_grace_s=30.0) as s:
        token = await add_hand(s.lmind, "dev")
        old = await start_hand(s.lmind, token, "dev")
        new: RunningHand | None = None
        try:
            chat_id = await s.owner.command(
                "face.chat", conversation_id=s.cid,
                content='/tool exec_command {"command": "sleep 30", "hand": "dev"}')
            await approve_next(s.owner, chat_id)
            running = await s.owner.expect(event("run.changed", status="running"))
            run_id = running["payload"]["data"]["run_id"]
            assert old.orders() == [run_id]

            old.crash()
            new = await start_hand(s.lmind, token, "dev")  # a new process, same name

            chat = await s.owner.reply(chat_id, timeout=15)
            assert chat["payload"]["status"] == "succeeded"
            assert chat["payload"]["content"].startswith("exec_command lost")
            await s.watcher.expect(event("chat.completed", request_id=chat_id))
            for face in (s.owner, s.watcher):
                completed = events_of(face.seen, "chat.tool_completed", request_id=chat_id)
                assert len(completed) == 1
                data = completed[0]["payload"]["data"]
                assert (data["status"], data["error_category"], data["success"]) == (
                    "lost", "lost", False)
                assert terminal_run_states(face.seen, run_id) == ["lost"]

            # The new Hand works, and was never asked to run the lost one.
            again_id = await s.owner.command(
                "face.chat", conversation_id=s.cid,
                content='/tool exec_command {"argv": ["echo", "fresh"], "hand": "dev"}')
            await approve_next(s.owner, again_id)
            again = await s.owner.reply(again_id, timeout=15)
            assert again["payload"]["content"].startswith("exec_command succeeded")
            assert len(new.orders()) == 1 and run_id not in new.orders()
            assert old.orders() == [run_id]
            stored = read_one(s.lmind.config.db_path, "tool_runs", "run_id", run_id)
            assert stored["status"] == "lost"
        finally:
            await old.stop()
            if new is not None:
                await new.stop()


# -- I11 across a Mind restart ---------------------------------------------------------------


@dataclass
class Interrupted:
    """What a Mind left behind when it was killed: a running tool and a pending approval."""

    running_cid: str
    run_id: str
    pending_cid: str
    approval_id: str
    started: str  # what the command wrote when it started: unique to that start


async def kill_mind_mid_tool(mind: MindProcess, pidfile: Path, marks: Marks) -> Interrupted:
    face = await FaceClient.connect(mind.url, mind.token)
    running_cid = await face.create_conversation("running")
    pending_cid = await face.create_conversation("pending")
    await face.subscribe(running_cid)
    await face.subscribe(pending_cid)
    # A start writes a nonce of its own (a pid alone repeats in a run's
    # PID namespace); the mark lets the test end what the crash left.
    command = (f"{marks.export()}od -An -N8 -tx8 /dev/urandom | tr -d ' ' > {pidfile}; "
               "echo started; exec sleep 30")
    chat_id = await face.command("face.chat", conversation_id=running_cid,
                                 content="/tool exec_command " + json.dumps({"command": command}))
    await approve_next(face, chat_id)
    await face.expect(lambda f: f["type"] == "face.chat.tool.progress"
                      and "started" in f["payload"]["data"])
    run_id = events_of(face.seen, "run.changed", status="running")[0]["payload"]["data"]["run_id"]
    waiting_id = await face.command("face.chat", conversation_id=pending_cid,
                                    content='/tool exec_command {"argv": ["true"]}')
    requested = await face.expect(event("approval.requested", request_id=waiting_id))
    mind.kill()
    await face.close()
    return Interrupted(running_cid, run_id, pending_cid,
                       requested["payload"]["data"]["approval_id"],
                       pidfile.read_text().strip())


@pytest.mark.e2e
async def test_I11_mind_restart_marks_runs_lost_and_approvals_cancelled(
    mind_proc: MindProcess, tmp_path: Path, marks: Marks
) -> None:
    pidfile = tmp_path / "tool.start"
    left = await kill_mind_mid_tool(mind_proc, pidfile, marks)
    mind_proc.start()
    face = await FaceClient.connect(mind_proc.url, mind_proc.token)
    snap = await snapshot(face, left.running_cid)
    (record,) = snap["tool_history"]
    assert (record["status"], record["error_category"], record["success"]) == (
        "lost", "lost", False)
    assert record["run_id"] == left.run_id, "the record knew its run before the crash"
    assert snap["active_runs"] == [] and snap["pending_chats"] == []
    pending = await snapshot(face, left.pending_cid)
    assert pending["pending_approvals"] == [] and pending["pending_chats"] == []
    # The call that only waited for its approval never ran: cancelled, not lost.
    (waited,) = pending["tool_history"]
    assert (waited["status"], waited["error_category"], waited["run_id"]) == (
        "cancelled", "cancelled", None)
    db = mind_proc.home / "halfpi.db"
    assert read_one(db, "tool_runs", "run_id", left.run_id)["status"] == "lost"
    approval = read_one(db, "approvals", "approval_id", left.approval_id)
    assert approval["status"] == "cancelled" and approval["decided_at"] is not None

    # A decision now converges on the cancellation; it runs nothing.
    resolve_id = await face.command("face.approval.resolve",
                                    approval_id=left.approval_id, decision="allow_once")
    late = await face.reply(resolve_id)
    assert late["payload"]["data"]["outcome"] == "already_resolved"
    assert late["payload"]["data"]["resolution"]["status"] == "cancelled"

    # Nothing was re-run: the command's start file is the one it wrote
    # before the crash (read through the new Mind's own Hand).
    await face.subscribe(left.running_cid)
    read = await face.chat_to_end(
        left.running_cid, "/tool read_file " + json.dumps({"path": str(pidfile)}))
    assert read["payload"]["content"].splitlines()[-1] == left.started
    for cid in (left.running_cid, left.pending_cid):
        again = await snapshot(face, cid)
        assert again["active_runs"] == []
    await face.close()


async def test_I11_a_mind_shutting_down_lets_its_local_hand_end_its_running_task(
    tmp_path: Path,
) -> None:
    """The Mind stops its in-process Hand and waits for it to end what it runs
    (bounded), not cutting it short: the task's command is ended and the
    task recorded, before the event loop's shutdown could catch it mid-way."""
    async with local_mind(tmp_path / "home", hand_approval=(("exec_command", "never"),)) as lmind:
        await hand_ready(lmind)
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        # A command that ignores SIGTERM: ending it takes the kill grace.
        args = json.dumps({"argv": ["sh", "-c", "trap '' TERM; sleep 30"]})
        started = await face.chat_to_end(cid, f"/task exec_command {args}")
        assert started["payload"]["status"] == "succeeded", started
        await face.expect(lambda f: f["type"] == "face.event"
                          and f["payload"]["type"] == "task.progress"
                          and f["payload"]["data"]["task"]["state"] == "running")
        await face.close()
        hand = lmind.mind.local_hand
        assert isinstance(hand, HandNode) and hand.book is not None
    [record] = hand.book.tasks()
    assert record.state == "lost", record
    assert record.error == "the Hand stopped while the task was unfinished"


async def test_a_link_that_takes_the_place_of_one_presumed_dead_is_audited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A laptop that sleeps stops answering pings; a copied token may then
    take its Hand's place. That take-over is an audit line naming both
    addresses, as a refusal is, so an operator can tell it from a restart."""
    hands = registry()
    first = FakeLink(hands)
    first.address = "192.0.2.10"
    hands.connect(first, hello(), "p_hand")
    first.live = False  # it failed its liveness check
    newer = FakeLink(hands)
    newer.address = "203.0.113.7"
    with caplog.at_level(logging.WARNING, logger="halfpi.hands"):
        hands.connect(newer, hello(instance="inst-2"), "p_hand")
    (line,) = [r.getMessage() for r in caplog.records if "audit" in r.getMessage()]
    assert "'dev'" in line and "203.0.113.7" in line and "192.0.2.10" in line, line
    assert "halfpi hand revoke dev" in line, line
