"""A Hand's word on whether a command ran confined reaches the Mind's result."""

from __future__ import annotations

import json

import pytest

from halfpi.core.hand_wire import decode_hand_message
from tests.mind.test_hand_runs import registry, started_run


@pytest.mark.parametrize("confined", [True, False, None])
async def test_the_confined_flag_of_a_hand_result_reaches_the_run_outcome(
    confined: bool | None,
) -> None:
    hands = registry()
    link, watched = started_run(hands)
    payload = {"run_id": watched.run.run_id, "generation": 1, "status": "succeeded",
               "exit_code": 0}
    if confined is not None:
        payload["confined"] = confined
    kind, message = decode_hand_message(json.dumps({"type": "hand.result", "payload": payload}))
    assert kind == "hand.result"
    hands.on_result(link, message)
    assert watched.run.done.result()["confined"] is confined


@pytest.mark.parametrize("how", ["mount", "landlock", "none"])
async def test_how_a_hand_confined_a_command_reaches_the_run_outcome(how: str) -> None:
    hands = registry()
    link, watched = started_run(hands)
    payload = {"run_id": watched.run.run_id, "generation": 1, "status": "succeeded",
               "exit_code": 0, "confined": how != "none", "confinement": how}
    _, message = decode_hand_message(json.dumps({"type": "hand.result", "payload": payload}))
    hands.on_result(link, message)
    assert watched.run.done.result()["confinement"] == how
