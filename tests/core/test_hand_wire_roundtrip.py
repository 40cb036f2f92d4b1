"""The Hand link typed both ways (DESIGN §9): every message is a struct of
``core/hand_wire.py``, and its JSON is byte for byte what the Mind and the
Hand sent when they built dicts (docs/hands.md, "The Hand protocol").

Each ``OLD_*`` frame below is what the dict-building code produced, copied
from it; a struct that encodes differently changes the wire."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from halfpi.core.hand_wire import (
    HAND_PROTOCOL,
    MIND_MESSAGES,
    HandAck,
    HandCancel,
    HandCheck,
    HandChecked,
    HandHello,
    HandInfo,
    HandPing,
    HandPolicyInfo,
    HandPong,
    HandProgress,
    HandResult,
    HandRun,
    HandRunRef,
    HandStarted,
    HandTaskCancel,
    HandTaskDeliver,
    HandTaskLog,
    HandTaskLogPage,
    HandTaskReceipt,
    HandTaskRefused,
    HandTaskUpdate,
    HandTool,
    HandWelcome,
    decode_from_mind,
    decode_hand_message,
    encode_to_hand,
    encode_to_mind,
)
from halfpi.errors import ErrorCode, InvalidRequest


def frame(type_: str, payload: dict[str, Any]) -> bytes:
    """How the Mind encoded a message it built as a dict (the old
    ``encode_hand_message``)."""
    return msgspec.json.encode({"type": type_, "payload": payload})


# -- Mind → Hand: what mind/hands.py, mind/tasks.py and the Hand session built ----------

MIND_TO_HAND: list[tuple[Any, str, dict[str, Any]]] = [
    (
        HandWelcome(hand_id="dev", generation=2, adopted=["x_1"], abandon=["x_2"],
                    protect=["/home/m/.halfpi"], features=["tasks"]),
        "hand.welcome",
        # hands.connect, then the session's protect and features
        {"hand_id": "dev", "generation": 2, "adopted": ["x_1"], "abandon": ["x_2"],
         "protect": ["/home/m/.halfpi"], "features": ["tasks"]},
    ),
    (
        HandCheck(check_id="k1", tool="read_file", args={"path": "/etc/hosts"}),
        "hand.check",
        {"check_id": "k1", "tool": "read_file", "args": {"path": "/etc/hosts"}},
    ),
    (
        HandRun(run_id="x_1", generation=1, tool="exec_command",
                args={"argv": ["true"], "cwd": "/tmp"}, timeout_s=30.0, approved=True),
        "hand.run",
        {"run_id": "x_1", "generation": 1, "tool": "exec_command",
         "args": {"argv": ["true"], "cwd": "/tmp"}, "timeout_s": 30.0, "approved": True},
    ),
    (HandCancel(run_id="x_1"), "hand.cancel", {"run_id": "x_1"}),
    (HandAck(run_ids=["x_1"]), "hand.ack", {"run_ids": ["x_1"]}),
    (HandPong(), "hand.pong", {}),
    (
        HandTaskDeliver(delivery_id="d_1", tool="exec_command", args={"command": "make"},
                        approved=False, timeout_s=600.0),
        "hand.task.deliver",
        {"delivery_id": "d_1", "tool": "exec_command", "args": {"command": "make"},
         "approved": False, "timeout_s": 600.0},
    ),
    (
        HandTaskDeliver(delivery_id="d_2", tool="exec_command", args={"command": "make"},
                        approved=True),
        "hand.task.deliver",
        # no timeout: the key is left out, not null
        {"delivery_id": "d_2", "tool": "exec_command", "args": {"command": "make"},
         "approved": True},
    ),
    (HandTaskCancel(task_id="t_ab12"), "hand.task.cancel", {"task_id": "t_ab12"}),
    (
        HandTaskLog(task_id="t_ab12", offset=4096, limit=65536),
        "hand.task.log",
        {"task_id": "t_ab12", "offset": 4096, "limit": 65536},
    ),
]


@pytest.mark.parametrize(("message", "type_", "old"), MIND_TO_HAND,
                         ids=[f"{t}-{i}" for i, (_, t, _) in enumerate(MIND_TO_HAND)])
def test_every_mind_message_encodes_as_the_dict_it_replaced(
    message: Any, type_: str, old: dict[str, Any]
) -> None:
    assert encode_to_hand(message) == frame(type_, old)
    assert decode_from_mind(frame(type_, old)) == message


def test_every_mind_message_type_has_a_struct_and_a_roundtrip_above() -> None:
    assert {t for _, t, _ in MIND_TO_HAND} == set(MIND_MESSAGES)


def test_the_hand_reads_what_the_docs_leave_optional_as_the_old_code_did() -> None:
    """docs/hands.md: ``timeout_s?``, ``approved?``, ``limit?``; a welcome
    without ``features`` comes from a Mind that speaks of no tasks."""
    deliver = decode_from_mind(frame("hand.task.deliver", {
        "delivery_id": "d_1", "tool": "exec_command", "args": {}}))
    assert isinstance(deliver, HandTaskDeliver)
    assert (deliver.approved, deliver.timeout) == (False, None)
    log = decode_from_mind(frame("hand.task.log", {"task_id": "t_1", "offset": 0}))
    assert log == HandTaskLog(task_id="t_1", offset=0, limit=None)
    welcome = decode_from_mind(frame("hand.welcome", {
        "hand_id": "dev", "generation": 1, "adopted": [], "abandon": []}))
    assert welcome == HandWelcome(hand_id="dev", generation=1)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        frame("hand.run", {"run_id": "x_1", "tool": "exec_command"}),  # no generation
        frame("hand.run", {"run_id": "x_1", "generation": "1", "tool": "exec_command"}),
        frame("hand.cancel", {"run_id": "x_1", "why": "extra"}),
        frame("hand.explode", {}),
        frame("hand.ping", {}),  # a Hand's message, not the Mind's
    ],
    ids=["not-json", "missing-field", "wrong-type", "unknown-field", "unknown-type", "hands"],
)
def test_a_malformed_mind_message_is_one_stable_error(data: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_from_mind(data)
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert caught.value.message.startswith(("bad message from the Mind", "unknown type"))


# -- Hand → Mind: what hand/node.py built -------------------------------------------------

HAND_TO_MIND: list[tuple[Any, str, dict[str, Any]]] = [
    (
        HandHello(token="hph_x", hand_id="dev", instance_id="i1",
                  info=HandInfo(hostname="h", os="Linux", arch="x86_64", version="1.0"),
                  tools=[HandTool(name="exec_command")],
                  policy=HandPolicyInfo(roots=["/w"], rules={"exec_command": "always"}),
                  protocol=HAND_PROTOCOL, runs=[HandRunRef(run_id="x_1", generation=1)]),
        "hand.hello",
        {"token": "hph_x", "hand_id": "dev", "instance_id": "i1",
         "info": {"hostname": "h", "os": "Linux", "arch": "x86_64", "version": "1.0"},
         "tools": [{"name": "exec_command"}],
         "policy": {"roots": ["/w"], "rules": {"exec_command": "always"}},
         "protocol": HAND_PROTOCOL, "runs": [{"run_id": "x_1", "generation": 1}]},
    ),
    (
        HandChecked(check_id="k1", verdict="deny", reason="no", category="forbidden_path"),
        "hand.checked",
        {"check_id": "k1", "verdict": "deny", "reason": "no", "category": "forbidden_path"},
    ),
    (
        HandChecked(check_id="k1", verdict="allow", reason="inside the roots"),
        "hand.checked",
        {"check_id": "k1", "verdict": "allow", "reason": "inside the roots"},  # no category
    ),
    (HandStarted(run_id="x_1", generation=1), "hand.started", {"run_id": "x_1", "generation": 1}),
    (
        HandProgress(run_id="x_1", generation=1, kind="stdout", data="hi\n", gap=False),
        "hand.progress",
        {"run_id": "x_1", "generation": 1, "kind": "stdout", "data": "hi\n", "gap": False},
    ),
    (HandPing(), "hand.ping", {}),
    (
        HandTaskReceipt(delivery_id="d_1", task_id="t_1", state="queued", deduplicated=False,
                        received_at=1.5),
        "hand.task.receipt",
        {"delivery_id": "d_1", "task_id": "t_1", "state": "queued", "deduplicated": False,
         "received_at": 1.5},
    ),
    (
        HandTaskRefused(code="delivery_conflict", message="m", delivery_id="d_1"),
        "hand.task.refused",
        {"delivery_id": "d_1", "code": "delivery_conflict", "message": "m"},  # no task_id
    ),
    (
        HandTaskRefused(code="task_not_found", message="no such task", task_id="t_1"),
        "hand.task.refused",
        {"task_id": "t_1", "code": "task_not_found", "message": "no such task"},
    ),
    (
        HandTaskUpdate(task_id="t_1", delivery_id="d_1", tool="exec_command", state="queued",
                       created_at=1.0),
        "hand.task.update",
        {"task_id": "t_1", "delivery_id": "d_1", "tool": "exec_command", "state": "queued",
         "created_at": 1.0, "started_at": None, "ended_at": None, "exit_code": None,
         "error": None, "log_bytes": 0, "log_truncated": False},
    ),
    (
        HandTaskLogPage(task_id="t_1", offset=0, next_offset=3, data_b64="aGkK",
                        truncated=False, state="running"),
        "hand.task.log_page",
        {"task_id": "t_1", "offset": 0, "next_offset": 3, "data_b64": "aGkK",
         "truncated": False, "state": "running"},
    ),
]


@pytest.mark.parametrize(("message", "type_", "old"), HAND_TO_MIND,
                         ids=[f"{t}-{i}" for i, (_, t, _) in enumerate(HAND_TO_MIND)])
def test_every_hand_message_says_what_the_dict_it_replaced_said(
    message: Any, type_: str, old: dict[str, Any]
) -> None:
    """The same keys and values (the Hand's old ``json.dumps`` spaced them)."""
    assert msgspec.json.decode(encode_to_mind(message)) == {"type": type_, "payload": old}
    assert decode_hand_message(encode_to_mind(message)) == (type_, message)


def test_a_result_means_to_the_mind_what_the_dict_it_replaced_meant() -> None:
    """The old Hand left out a result's empty optional fields (all but
    ``exit_code``); the struct says them as null: the Mind reads both alike."""
    old = {"run_id": "x_1", "generation": 1, "status": "failed", "exit_code": None,
           "stdout": "", "stderr": "", "output_bytes": 0, "digest": "", "truncated": False,
           "error_category": "spawn_failed", "error": "no such program"}
    result = HandResult(run_id="x_1", generation=1, status="failed",
                        error_category="spawn_failed", error="no such program")
    assert decode_hand_message(encode_to_mind(result)) == ("hand.result", result)
    assert decode_hand_message(frame("hand.result", old)) == ("hand.result", result)
