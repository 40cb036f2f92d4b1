"""Every state machine as one transition table (STYLE §2); I10 first terminal wins."""

from __future__ import annotations

import itertools
import runpy
from pathlib import Path

import pytest

from halfpi.core import states
from halfpi.core.states import (
    APPROVAL,
    CHAT,
    CHAT_EVENT_FOR_STATUS,
    CHAT_TERMINAL,
    CONNECTION,
    MACHINES,
    OUTBOX,
    OUTBOX_TERMINAL,
    REQUEST,
    REQUEST_TERMINAL,
    RUN,
    TASK,
    Machine,
    render_docs,
)
from halfpi.errors import HalfpiError, IllegalTransition

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "interrupted"}
RUN_END = {"succeeded", "failed", "cancelled", "timed_out", "lost"}

EXPECTED: dict[str, tuple[str, dict[str, set[str]]]] = {
    "chat": (
        "running",
        {"running": {"cancel_requested", *TERMINAL}, "cancel_requested": set(TERMINAL)},
    ),
    "request": ("accepted", {"accepted": set(TERMINAL)}),
    "connection": (
        "awaiting_hello",
        {
            "awaiting_hello": {"open", "closing", "closed"},
            "open": {"closing", "closed"},
            "closing": {"closed"},
        },
    ),
    "run": (
        "queued",
        {
            "queued": {"running", *RUN_END},
            "running": set(RUN_END),
        },
    ),
    "task": (
        "queued",
        {
            "queued": {"running", *RUN_END},
            "running": set(RUN_END),
        },
    ),
    "approval": ("pending", {"pending": {"allowed", "denied", "expired", "cancelled"}}),
    "outbox": (
        "queued",
        {
            "queued": {"running", "dead", *RUN_END},
            "running": set(RUN_END),
        },
    ),
}


def _allowed(machine: Machine) -> set[tuple[str, str]]:
    return {(s, t) for s, targets in machine.transitions.items() for t in targets}


def test_every_machine_is_listed_once() -> None:
    assert [m.name for m in MACHINES] == ["chat", "request", "connection", "run", "task",
                                          "approval", "outbox"]
    assert (CHAT, REQUEST, CONNECTION, RUN, TASK, APPROVAL, OUTBOX) == MACHINES


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_machine_table_is_the_documented_one(machine: Machine) -> None:
    initial, table = EXPECTED[machine.name]
    assert machine.initial == initial
    assert {s: set(t) for s, t in machine.transitions.items()} == table
    assert machine.initial in machine.states


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_every_allowed_transition_is_accepted(machine: Machine) -> None:
    for source, target in _allowed(machine):
        assert machine.check(source, target) == target


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_every_other_transition_raises(machine: Machine) -> None:
    allowed = _allowed(machine)
    pairs = set(itertools.product(machine.states, machine.states)) - allowed
    assert pairs
    for source, target in pairs:
        with pytest.raises(IllegalTransition) as caught:
            machine.check(source, target)
        assert machine.name in str(caught.value)


def test_unknown_states_raise() -> None:
    with pytest.raises(IllegalTransition):
        CHAT.check("running", "exploded")
    with pytest.raises(IllegalTransition):
        CHAT.check("nowhere", "succeeded")


def test_illegal_transition_is_a_halfpi_error() -> None:
    assert issubclass(IllegalTransition, HalfpiError)


def test_chat_states() -> None:
    assert CHAT.states == {"running", "cancel_requested", *TERMINAL}
    assert frozenset(TERMINAL) == CHAT_TERMINAL
    assert {s for s in CHAT.states if CHAT.is_terminal(s)} == TERMINAL
    assert not CHAT.is_terminal("running")
    assert not CHAT.is_terminal("cancel_requested")


def test_the_outbox_knows_every_task_state_and_dead_ends_only_an_undelivered_task() -> None:
    assert OUTBOX.states == TASK.states | {"dead"}
    assert {s for s in OUTBOX.states if OUTBOX.is_terminal(s)} == RUN_END | {"dead"}
    assert frozenset(RUN_END | {"dead"}) == OUTBOX_TERMINAL
    assert OUTBOX.check("queued", "dead") == "dead"
    with pytest.raises(IllegalTransition):
        OUTBOX.check("running", "dead")
    assert not OUTBOX.first_terminal_wins("dead", "succeeded")


def test_request_states() -> None:
    assert {s for s in REQUEST.states if REQUEST.is_terminal(s)} == TERMINAL
    assert frozenset(TERMINAL) == REQUEST_TERMINAL
    assert not REQUEST.is_terminal("accepted")


def test_a_chat_request_ends_with_its_chats_terminal_status() -> None:
    assert REQUEST_TERMINAL == CHAT_TERMINAL


def test_connection_states() -> None:
    assert CONNECTION.states == {"awaiting_hello", "open", "closing", "closed"}
    assert {s for s in CONNECTION.states if CONNECTION.is_terminal(s)} == {"closed"}


def test_cancel_requested_cannot_go_back_to_running() -> None:
    with pytest.raises(IllegalTransition):
        CHAT.check("cancel_requested", "running")


def test_every_chat_terminal_status_publishes_a_chat_event() -> None:
    assert set(CHAT_EVENT_FOR_STATUS) == set(CHAT_TERMINAL)
    assert set(CHAT_EVENT_FOR_STATUS.values()) <= {
        "chat.completed",
        "chat.failed",
        "chat.cancelled",
        "chat.interrupted",
    }
    assert CHAT_EVENT_FOR_STATUS["succeeded"] == "chat.completed"
    assert CHAT_EVENT_FOR_STATUS["cancelled"] == "chat.cancelled"
    assert CHAT_EVENT_FOR_STATUS["interrupted"] == "chat.interrupted"


# -- I10 ------------------------------------------------------------------------


def test_I10_first_terminal_wins() -> None:
    assert CHAT.first_terminal_wins("running", "succeeded") is True
    # A later terminal decision converges on the one that stands.
    for late in TERMINAL:
        assert CHAT.first_terminal_wins("succeeded", late) is False


def test_I10_first_terminal_wins_after_cancel_requested() -> None:
    assert CHAT.first_terminal_wins("running", "cancel_requested") is True
    assert CHAT.first_terminal_wins("cancel_requested", "succeeded") is True
    assert CHAT.first_terminal_wins("succeeded", "cancelled") is False


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_I10_no_transition_out_of_any_terminal_state(machine: Machine) -> None:
    for state in machine.states:
        if machine.is_terminal(state):
            for target in machine.states:
                assert machine.first_terminal_wins(state, target) is False


def test_I10_a_non_terminal_illegal_move_still_raises() -> None:
    with pytest.raises(IllegalTransition):
        CHAT.first_terminal_wins("cancel_requested", "running")
    with pytest.raises(IllegalTransition):
        CONNECTION.first_terminal_wins("open", "awaiting_hello")


# -- generated docs -------------------------------------------------------------


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_mermaid_lists_every_transition_and_terminal(machine: Machine) -> None:
    lines = machine.mermaid().splitlines()
    assert lines[0] == "stateDiagram-v2"
    assert lines[1] == f"    [*] --> {machine.initial}"
    arrows = {tuple(line.strip().split(" --> ")) for line in lines[1:]}
    assert arrows == (
        {("[*]", machine.initial)}
        | _allowed(machine)
        | {(s, "[*]") for s in machine.states if machine.is_terminal(s)}
    )


def test_render_docs_has_a_mermaid_block_per_machine() -> None:
    doc = render_docs()
    assert doc.startswith("# State machines\n")
    assert doc.count("```mermaid\n") == len(MACHINES)
    for machine in MACHINES:
        section = f"## {machine.name}\n\n```mermaid\n{machine.mermaid()}\n```"
        assert section in doc


def test_running_the_module_prints_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(states.__file__, run_name="__main__")
    assert capsys.readouterr().out == render_docs()


def test_docs_states_md_is_generated_from_the_tables() -> None:
    docs = Path(states.__file__).resolve().parents[3] / "docs" / "states.md"
    if not docs.exists():
        pytest.skip("docs/ is not part of this installation")
    assert docs.read_text() == render_docs()
