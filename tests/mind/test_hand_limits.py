"""The Mind does not trust what a Hand says (DESIGN §8).

A Hand that breaks the limits (progress chunk, bytes and events per run,
result size) or lies about its output (length, digest) is faulty: the frame
is refused, the Hand is closed with 4009, its runs become ``lost``. Also the
policy round trip the Mind runs before a tool call (``hand.check``).
The registry is driven directly with a fake link: no sockets.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from halfpi.core.hand_wire import (
    CHUNK_BYTES,
    HAND_PROTOCOL,
    PROGRESS_EVENTS,
    HandChecked,
    HandHello,
    HandInfo,
    HandPolicyInfo,
    HandProgress,
    HandResult,
    HandStarted,
    HandTool,
)
from halfpi.core.policy import Verdict
from halfpi.mind.hands import CHECK_TIMEOUT_S, HandRegistry, HandUnavailable, ToolRun
from tests.support.clock import FakeClock
from tests.support.hand import FakeLink, honest_result


def hello(instance: str = "inst-1") -> HandHello:
    return HandHello(
        token="t",
        hand_id="dev",
        instance_id=instance,
        info=HandInfo(hostname="h", os="o", arch="a", version="0"),
        tools=[HandTool(name="exec_command"), HandTool(name="read_file")],
        policy=HandPolicyInfo(roots=["/work"], rules={"exec_command": "always",
                                                      "read_file": "outside_roots"}),
        protocol=HAND_PROTOCOL,
    )


class Watched:
    def __init__(self, run_id: str) -> None:
        self.states: list[str] = []
        self.progress: list[str] = []
        self.run = ToolRun(run_id, "dev", "exec_command", {"argv": ["true"]}, 60.0, "c_1",
                           "t_1", on_progress=self.on_progress, on_state=self.states.append)

    def on_progress(self, kind: str, text: str, gap: bool) -> None:
        self.progress.append(text)


def started(hands: HandRegistry, link: FakeLink, run_id: str = "x_1") -> Watched:
    watched = Watched(run_id)
    hands.start(watched.run)
    hands.on_started(link, HandStarted(run_id=run_id, generation=1))
    return watched


def connected(clock: FakeClock | None = None) -> tuple[HandRegistry, FakeLink]:
    hands = HandRegistry((clock or FakeClock()).scheduler(), 60.0)
    link = FakeLink(hands)
    hands.connect(link, hello(), "p_hand")
    return hands, link


def progress(run_id: str, data: str) -> HandProgress:
    return HandProgress(run_id=run_id, generation=1, kind="stdout", data=data)


def wire_result(**payload: Any) -> HandResult:
    return HandResult(**payload)


def assert_faulty(link: FakeLink, hands: HandRegistry, *watched: Watched) -> None:
    assert [code for code, _ in link.closed] == [4009], link.closed
    assert not hands.connected("dev")
    for w in watched:
        assert w.states[-1] == "lost", w.states
        outcome = w.run.done.result()
        assert outcome["status"] == "lost" and outcome["error_category"] == "lost"
        assert "broke" in outcome["error"], outcome


async def test_hand_sending_a_progress_chunk_over_4_kib_is_closed_and_its_runs_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hands, link = connected()
    watched, other = started(hands, link), started(hands, link, "x_2")
    hands.on_progress(link, progress("x_1", "ok"))
    with caplog.at_level(logging.WARNING, "halfpi.hands"):
        hands.on_progress(link, progress("x_1", "x" * (16 * 1024)))
    assert watched.progress == ["ok"], "the oversized chunk is not passed on"
    assert_faulty(link, hands, watched, other)
    assert "dev" in caplog.text and "4096" in caplog.text and "16384" in caplog.text


async def test_hand_sending_more_than_256_progress_events_is_closed() -> None:
    hands, link = connected()
    watched = started(hands, link)
    for _ in range(PROGRESS_EVENTS):
        hands.on_progress(link, progress("x_1", "y" * CHUNK_BYTES))
    assert link.closed == [] and len(watched.progress) == PROGRESS_EVENTS
    hands.on_progress(link, progress("x_1", "y"))
    assert len(watched.progress) == PROGRESS_EVENTS
    assert_faulty(link, hands, watched)


async def test_progress_bounds_are_per_run() -> None:
    hands, link = connected()
    first, second = started(hands, link), started(hands, link, "x_2")
    for _ in range(PROGRESS_EVENTS):
        hands.on_progress(link, progress("x_1", "a"))
        hands.on_progress(link, progress("x_2", "b"))
    assert link.closed == []
    assert len(first.progress) == len(second.progress) == PROGRESS_EVENTS


@pytest.mark.parametrize(
    "lie",
    [
        {"output_bytes": 5},
        {"digest": "sha256:lie"},
        {"stdout": "z" * (1024 * 1024 + 1), "truncated": True, "output_bytes": 2 << 20},
    ],
    ids=["length", "digest", "oversized_stdout"],
)
async def test_hand_lying_about_its_output_is_closed_and_the_lie_never_recorded(
    lie: dict[str, Any],
) -> None:
    hands, link = connected()
    watched = started(hands, link)
    payload = honest_result("x_1", 1, stdout="a" * 100)
    payload.update(lie)
    hands.on_result(link, wire_result(**payload))
    assert_faulty(link, hands, watched)
    assert link.acked() == []


async def test_honest_result_is_taken_and_acknowledged() -> None:
    hands, link = connected()
    watched = started(hands, link)
    hands.on_result(link, wire_result(**honest_result("x_1", 1, stdout="out\n",
                                                      stderr="err\n")))
    assert link.closed == [] and watched.states[-1] == "succeeded"
    assert link.acked() == ["x_1"]


async def test_hand_run_carries_the_approval() -> None:
    hands, link = connected()
    watched = Watched("x_1")
    watched.run.approved = True
    hands.start(watched.run)
    (order,) = link.of("hand.run")
    assert order["approved"] is True


async def test_policy_check_round_trip() -> None:
    hands, link = connected()
    pending = hands.check("dev", "read_file", {"path": "/etc/passwd"})
    (asked,) = link.of("hand.check")
    assert asked["tool"] == "read_file" and asked["args"] == {"path": "/etc/passwd"}
    # An answer on another connection, or for another check, is not the answer.
    stranger = FakeLink(hands, "other")
    hands.on_checked(stranger, HandChecked(check_id=asked["check_id"], verdict="allow",
                                           reason="trust me"))
    assert not pending.done()
    hands.on_checked(link, HandChecked(check_id=asked["check_id"], verdict="ask",
                                       reason="/etc/passwd is outside this Hand's roots"))
    decision = await pending
    assert decision.verdict is Verdict.ASK and "outside" in decision.reason


async def test_policy_check_fails_when_the_hand_goes_away() -> None:
    hands, link = connected()
    pending = hands.check("dev", "read_file", {"path": "a"})
    link.close(1000, "bye")
    with pytest.raises(HandUnavailable):
        await pending


async def test_policy_check_times_out_on_the_minds_clock() -> None:
    clock = FakeClock()
    hands, _ = connected(clock)
    pending = hands.check("dev", "read_file", {"path": "a"})
    clock.advance(CHECK_TIMEOUT_S - 0.001)
    assert not pending.done()
    clock.advance(0.001)
    with pytest.raises(HandUnavailable, match="did not answer"):
        await pending
    assert hands.checks == {}


async def test_hand_list_shows_the_hands_roots_and_rules() -> None:
    hands, _ = connected()
    wire = hands.hands["dev"].to_wire()
    assert wire["roots"] == ["/work"]
    assert wire["rules"] == {"exec_command": "always", "read_file": "outside_roots"}
