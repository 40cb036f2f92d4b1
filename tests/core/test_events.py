"""Outbound messages as typed values (``core/events.py``): one definition for
the Mind that encodes them and the Face reducer that decodes them."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from msgspec import UNSET

from halfpi.core import events as ev
from halfpi.core.states import CHAT_EVENT_FOR_STATUS


def wire(value: msgspec.Struct) -> dict[str, Any]:
    decoded = json.loads(msgspec.json.encode(value))
    assert isinstance(decoded, dict)
    return decoded


# -- summary projection (I9) ------------------------------------------------------------


def test_summary_drops_bodies_but_keeps_facts() -> None:
    called = ev.ToolCalled(tool_call_id="t", args={"a": 1}, args_digest="sha256:x")
    assert "args" not in wire(called.summary())
    assert wire(called.summary())["args_digest"] == "sha256:x"
    done = ev.ToolCompleted(
        tool_call_id="t", result=ev.ToolOutput(stdout="x"), output_bytes=1, digest="d"
    )
    assert "result" not in wire(done.summary())
    assert (wire(done.summary())["output_bytes"], wire(done.summary())["digest"]) == (1, "d")
    asked = ev.ApprovalRequested(approval_id="a", args={"p": 1}, args_digest="sha256:y")
    assert "args" not in wire(asked.summary())
    record = ev.ToolRecord(tool_call_id="t", args=1, result=2, status="succeeded")
    assert {"args", "result"}.isdisjoint(wire(record.summary()))
    assert wire(record.summary())["status"] == "succeeded"


def test_summary_of_an_event_with_nothing_to_hide_is_the_event_itself() -> None:
    said = ev.ChatMessage(request_id="q", content="c")
    assert said.summary() is said
    summary_admission = ev.ToolCalled(tool_call_id="t", args_digest="d")
    assert summary_admission.summary() is summary_admission


# -- the wire is what docs/protocol.md says --------------------------------------------


def test_absent_fields_are_not_encoded_and_null_fields_are() -> None:
    resolved = ev.ApprovalResolved(
        approval_id="a1", status="cancelled", decision=None, decided_by=None, tool_call_id="t1"
    )
    assert wire(resolved) == {
        "approval_id": "a1",
        "status": "cancelled",
        "decision": None,
        "decided_by": None,
        "tool_call_id": "t1",
    }
    ended = ev.ChatEnded(request_id="q", run_id="r", status="succeeded", content="hi")
    assert list(wire(ended)) == ["request_id", "run_id", "status", "content"]
    failed = ev.ChatEnded(
        request_id="q", run_id="r", status="failed", content="", error_code="e", reason="why"
    )
    assert list(wire(failed)) == ["request_id", "run_id", "status", "content", "error_code",
                                  "reason"]


def test_an_error_names_its_field_only_when_it_has_one() -> None:
    bare = ev.Error(code="busy", message="m", retryable=True)
    assert wire(bare) == {"code": "busy", "message": "m", "retryable": True}
    named = ev.Error(code="invalid_request", message="m", retryable=False, request_id="r",
                     field="x")
    assert list(wire(named)) == ["code", "message", "retryable", "request_id", "field"]


def test_a_session_message_names_its_own_type() -> None:
    message = ev.to_message(ev.Evicted(cursors={"c": "e.4"}))
    assert message.type == "face.evicted"
    assert json.loads(message.frame(7)) == {
        "type": "face.evicted",
        "payload": {"event_seq": 7, "cursors": {"c": "e.4"}},
    }
    with pytest.raises(AssertionError):
        ev.to_message(ev.ChatOutcome(conversation_id="c", run_id="r"))


def test_registry_values_leave_out_what_is_absent() -> None:
    accepted = ev.Accepted(request_id="q", operation="run.cancel", run_id="x1")
    assert ev.builtins(accepted) == {"request_id": "q", "operation": "run.cancel", "run_id": "x1"}


# -- one rule, both sides ----------------------------------------------------------------


@pytest.mark.parametrize("status", sorted(CHAT_EVENT_FOR_STATUS))
def test_every_end_of_a_chat_keeps_an_assistant_message(status: str) -> None:
    ended = ev.ChatEnded(request_id="q", run_id="r", status=status, content="so far",
                         reason=UNSET if status == "succeeded" else "why")
    assert ended.kind() == CHAT_EVENT_FOR_STATUS[status]
    reply = ended.reply(9, 1.5)
    assert (reply.seq, reply.role, reply.content, reply.status, reply.ts) == (
        9, "assistant", "so far", status, 1.5
    )
    assert reply.reason == ended.reason


def test_a_hand_event_type_follows_its_class() -> None:
    assert ev.HandConnected(hand_id="h").kind() == "hand.connected"
    assert ev.HandDisconnected(hand_id="h").kind() == "hand.disconnected"


# -- a tolerant reader ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(ev.EVENT_TYPES))
def test_every_event_type_round_trips(kind: str) -> None:
    cls = ev.EVENT_TYPES[kind]
    required: dict[str, Any] = {
        "tool_call_id": "t1",
        "approval_id": "a1",
        "conversation": {"id": "c", "name": "n", "created_at": 1.0},
        "task": {"task_id": "k1"},
    }
    fields = {f: v for f, v in required.items() if f in cls.__struct_fields__}
    if cls is ev.ChatEnded:
        fields["status"] = {v: k for k, v in CHAT_EVENT_FOR_STATUS.items()}[kind]
    value = msgspec.convert(fields, cls)
    assert value.kind() == kind
    assert ev.decode_event(kind, json.loads(msgspec.json.encode(value))) == value


def test_a_newer_field_is_ignored_and_a_missing_one_takes_its_default() -> None:
    said = ev.decode_event("chat.message", {"request_id": "q", "content": "x", "mood": "calm"})
    assert said == ev.ChatMessage(request_id="q", role="user", content="x")


def test_an_unknown_event_type_decodes_to_nothing() -> None:
    assert ev.decode_event("task.changed", {"task_id": "k1"}) is None


def test_data_that_is_not_what_its_type_says_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        ev.decode_event("chat.tool_called", {"tool": "x"})  # no tool_call_id
