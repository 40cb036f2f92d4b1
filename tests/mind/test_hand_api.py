"""The Mind API of the Hand link (``mind/hand_api.py``), without a socket:
where each message of a Hand goes, and the welcome a Hand is given whole
(the transport adds nothing to it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from halfpi.core.hand_wire import (
    HAND_MESSAGES,
    HAND_PROTOCOL,
    HandChecked,
    HandHello,
    HandInfo,
    HandPing,
    HandProgress,
    HandResult,
    HandRunRef,
    HandStarted,
    HandTaskLogPage,
    HandTaskReceipt,
    HandTaskRefused,
    HandTaskUpdate,
    HandTool,
    HandWelcome,
)
from halfpi.mind import hand_api
from halfpi.mind.hands import HandRegistry
from halfpi.mind.service import Mind
from tests.support.clock import FakeClock
from tests.support.hand import FakeLink


class Recorder:
    """Stands for the Hand registry or the task outbox: records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, args))


MESSAGES: list[tuple[Any, str, str]] = [
    (HandResult(run_id="x_1", generation=1, status="succeeded"), "hands", "on_result"),
    (HandProgress(run_id="x_1", generation=1, kind="stdout", data="hi"), "hands",
     "on_progress"),
    (HandStarted(run_id="x_1", generation=1), "hands", "on_started"),
    (HandChecked(check_id="k1", verdict="allow", reason="inside"), "hands", "on_checked"),
    (HandTaskUpdate(task_id="t_1", delivery_id="d_1", tool="exec_command", state="running",
                    created_at=1.0), "tasks", "on_update"),
    (HandTaskReceipt(delivery_id="d_1", task_id="t_1", state="queued", deduplicated=False,
                     received_at=1.0), "tasks", "on_receipt"),
    (HandTaskRefused(code="task_not_found", message="no such task", task_id="t_1"), "tasks",
     "on_refused"),
    (HandTaskLogPage(task_id="t_1", offset=0, next_offset=0, data_b64="", truncated=False,
                     state="running"), "tasks", "on_log_page"),
]


def fake_mind() -> Any:
    return SimpleNamespace(hands=Recorder(), tasks=Recorder())


@pytest.mark.parametrize(("message", "where", "method"), MESSAGES,
                         ids=[type(m).__name__ for m, _, _ in MESSAGES])
def test_each_hand_message_is_routed_to_its_part_of_the_mind(
    message: Any, where: str, method: str
) -> None:
    """A run's message goes to the Hand registry with its link (the
    generation is checked there); a task's to the outbox by Hand label."""
    mind = fake_mind()
    link = FakeLink(cast(HandRegistry, None), "dev")
    hand_api.handle(cast(Mind, mind), link, message)
    first = link if where == "hands" else "dev"
    assert getattr(mind, where).calls == [(method, (first, message))]
    other = "tasks" if where == "hands" else "hands"
    assert getattr(mind, other).calls == [] and link.sent == []


def test_every_hand_message_but_the_hello_has_a_route() -> None:
    routed = {type(m) for m, _, _ in MESSAGES} | {HandPing}
    assert routed == set(hand_api.HANDLERS)
    assert set(HAND_MESSAGES.values()) - routed == {HandHello}


def test_a_ping_is_answered_with_a_pong_and_a_late_hello_is_ignored() -> None:
    mind = fake_mind()
    link = FakeLink(cast(HandRegistry, None), "dev")
    hand_api.handle(cast(Mind, mind), link, HandPing())
    hand_api.handle(cast(Mind, mind), link, hello())
    assert link.sent == [("hand.pong", {})]
    assert mind.hands.calls == mind.tasks.calls == []


def hello(runs: tuple[str, ...] = ()) -> HandHello:
    return HandHello(token="t", hand_id="dev", instance_id="i1",
                     info=HandInfo(hostname="h", os="o", arch="a", version="0"),
                     tools=[HandTool(name="exec_command")], protocol=HAND_PROTOCOL,
                     runs=[HandRunRef(run_id=r, generation=1) for r in runs])


def test_the_welcome_is_composed_whole_protected_paths_included(tmp_path: Path) -> None:
    """The Mind's home and credential files, resolved, and the ``tasks``
    feature: what the Hand transport used to write into the welcome itself."""
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "link").symlink_to(home)
    hands = HandRegistry(FakeClock().scheduler(), 60.0)
    mind = SimpleNamespace(hands=hands, config=SimpleNamespace(
        private_paths=[tmp_path / "link", tmp_path / "openai.key"]))
    link = FakeLink(hands, "dev")
    welcome = hand_api.welcome(cast(Mind, mind), link, hello(runs=("x_9",)), "p_hand")
    assert welcome == HandWelcome(
        hand_id="dev", generation=1, adopted=[], abandon=["x_9"],
        protect=[str(home.resolve()), str((tmp_path / "openai.key").resolve())],
        features=["tasks"])
    assert hands.connected("dev") and hands.hands["dev"].link is link
