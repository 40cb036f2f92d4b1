"""The commands the SDK sends: the Mind's own structs, encoded as the Mind reads them."""

from __future__ import annotations

import json

import pytest

from halfpi.core import wire
from halfpi.face.commands import command_of, encode
from halfpi.face.errors import CommandError


def test_a_field_at_its_default_is_left_out() -> None:
    resubscribe = wire.Subscribe(request_id="s-1", conversation_ids=["c_1"], since={"c_1": "e.3"})
    assert json.loads(encode(resubscribe)) == {
        "type": "face.subscribe",
        "payload": {"request_id": "s-1", "conversation_ids": ["c_1"], "since": {"c_1": "e.3"}},
    }
    assert json.loads(encode(wire.Ping())) == {"type": "face.ping", "payload": {}}


def test_what_is_encoded_decodes_to_the_same_command_on_the_minds_side() -> None:
    chat = wire.Chat(request_id="q-1", conversation_id="c_1", content="hi")
    assert wire.decode_command(encode(chat)) == ("face.chat", chat)


def test_a_command_given_as_data_is_the_struct_the_mind_reads() -> None:
    body = command_of("face.task.list", {"request_id": "t-1", "hand": "dev"})
    assert body == wire.TaskList(request_id="t-1", hand="dev")


@pytest.mark.parametrize(
    ("type_", "payload", "field"),
    [
        ("face.chat", {"request_id": "q-1", "content": "hi"}, "conversation_id"),
        ("face.chat", {"request_id": "q-1", "conversation_id": "c", "content": "hi", "x": 1},
         "x"),
        ("face.nonsense", {"request_id": "q-1"}, "type"),
        ("face.hello", {"token": "t", "client": {"name": "n", "version": "1"}, "protocol": 3},
         "type"),
    ],
)
def test_a_command_the_mind_would_refuse_is_refused_as_it_would(
    type_: str, payload: dict[str, object], field: str
) -> None:
    with pytest.raises(CommandError) as info:
        command_of(type_, payload)
    assert (info.value.code, info.value.field, info.value.retryable) == (
        "invalid_request", field, False)
