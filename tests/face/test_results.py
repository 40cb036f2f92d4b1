"""A face.result as the SDK hands it back: its data typed by the command it answers."""

from __future__ import annotations

import pytest

from halfpi.core import events
from halfpi.face.errors import FaceError
from halfpi.face.results import Result


def wire_result(status: str, data: object) -> events.Result:
    return events.Result(request_id="q-1", status=status, data=data)


def test_the_data_is_the_struct_of_the_commands_outcome() -> None:
    result = Result.from_wire("face.chat", wire_result(
        "succeeded", {"conversation_id": "c_1", "run_id": "r_1", "cursor": "e.4"}))
    assert result.data == events.ChatOutcome(conversation_id="c_1", run_id="r_1", cursor="e.4")
    assert result.outcome(events.ChatOutcome).run_id == "r_1"


def test_a_request_the_mind_stopped_during_is_interrupted() -> None:
    result = Result.from_wire("face.conversation.create",
                              wire_result("interrupted", {"reason": "mind_restarted"}))
    assert result.data == events.Interrupted(reason="mind_restarted")
    with pytest.raises(FaceError, match="interrupted without Created"):
        result.outcome(events.Created)


def test_data_that_is_not_what_its_command_says_is_left_out_not_guessed() -> None:
    result = Result.from_wire("face.task.cancel", wire_result("succeeded", {"x": 1}))
    assert (result.status, result.data) == ("succeeded", None)
