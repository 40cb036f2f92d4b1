"""Wire decoding (DESIGN §4): strict frames, errors that name the field, nothing else escapes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halfpi.core.wire import COMMANDS, MUTATIONS, READS, REPLAY_SAFE, decode_command, request_id_of
from halfpi.errors import ErrorCode, InvalidRequest

# One full payload per command type: every optional field given.
EXAMPLES: dict[str, dict[str, Any]] = {
    "face.hello": {"token": "hpf_x", "client": {"name": "sdk", "version": "1.0"}, "protocol": 3},
    "face.conversation.create": {"request_id": "r1", "name": "notes"},
    "face.conversation.rename": {"request_id": "r1", "conversation_id": "c_1", "name": "plans"},
    "face.conversation.list": {"request_id": "r1", "limit": 10, "before": "c_1"},
    "face.conversation.snapshot": {
        "request_id": "r1",
        "conversation_id": "c_1",
        "detail_mode": "summary",
        "messages_limit": 20,
    },
    "face.conversation.messages": {
        "request_id": "r1",
        "conversation_id": "c_1",
        "limit": 50,
        "before_seq": 9,
    },
    "face.subscribe": {
        "request_id": "r1",
        "conversation_ids": ["c_1", "c_2"],
        "since": {"c_1": "ab.7"},
        "transient_types": ["face.chat.delta"],
        "detail_mode": "transparent",
        "snapshot": True,
    },
    "face.unsubscribe": {"request_id": "r1", "conversation_ids": ["c_1"]},
    "face.chat": {"request_id": "r1", "conversation_id": "c_1", "content": "hello"},
    "face.chat.cancel": {"request_id": "r2", "conversation_id": "c_1", "target_request_id": "r1"},
    "face.approval.resolve": {
        "request_id": "r1",
        "approval_id": "a_1",
        "decision": "deny_once",
        "reason": "no",
    },
    "face.approval.list": {"request_id": "r1"},
    "face.run.cancel": {"request_id": "r1", "run_id": "run_1"},
    "face.task.cancel": {"request_id": "r1", "task_id": "t_1"},
    "face.task.list": {"request_id": "r1", "limit": 5, "hand": "laptop"},
    "face.task.get": {"request_id": "r1", "task_id": "t_1"},
    "face.task.log": {"request_id": "r1", "task_id": "t_1", "offset": 10, "limit": 100},
    "face.hand.list": {"request_id": "r1"},
    "face.ping": {"request_id": "r1"},
}

# The smallest valid payload per command type.
MINIMAL: dict[str, dict[str, Any]] = {
    "face.hello": EXAMPLES["face.hello"],
    "face.conversation.create": {"request_id": "r1"},
    "face.conversation.rename": EXAMPLES["face.conversation.rename"],
    "face.conversation.list": {"request_id": "r1"},
    "face.conversation.snapshot": {"request_id": "r1", "conversation_id": "c_1"},
    "face.conversation.messages": {"request_id": "r1", "conversation_id": "c_1", "limit": 1},
    "face.subscribe": {"request_id": "r1", "conversation_ids": ["c_1"]},
    "face.unsubscribe": {"request_id": "r1", "conversation_ids": ["c_1"]},
    "face.chat": {"request_id": "r1", "conversation_id": "c_1", "content": ""},
    "face.chat.cancel": EXAMPLES["face.chat.cancel"],
    "face.approval.resolve": {"request_id": "r1", "approval_id": "a_1", "decision": "allow_once"},
    "face.approval.list": {"request_id": "r1"},
    "face.run.cancel": EXAMPLES["face.run.cancel"],
    "face.task.cancel": EXAMPLES["face.task.cancel"],
    "face.task.list": {"request_id": "r1"},
    "face.task.get": EXAMPLES["face.task.get"],
    "face.task.log": {"request_id": "r1", "task_id": "t_1"},
    "face.hand.list": {"request_id": "r1"},
    "face.ping": {},
}


def frame(type_: Any, payload: Any = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"type": type_, **extra}
    if payload is not None:
        body["payload"] = payload
    return json.dumps(body).encode()


def invalid(data: bytes | str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode_command(data)
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert not caught.value.retryable
    return caught.value


def test_examples_cover_every_command() -> None:
    assert set(EXAMPLES) == set(COMMANDS)
    assert set(MINIMAL) == set(COMMANDS)


@pytest.mark.parametrize("type_", sorted(COMMANDS))
def test_every_command_type_decodes_with_all_fields(type_: str) -> None:
    got_type, payload = decode_command(frame(type_, EXAMPLES[type_]))
    assert got_type == type_
    assert type(payload) is COMMANDS[type_]
    assert msgspec.to_builtins(payload) == EXAMPLES[type_]


@pytest.mark.parametrize("type_", sorted(COMMANDS))
def test_every_command_type_decodes_with_only_required_fields(type_: str) -> None:
    got_type, payload = decode_command(frame(type_, MINIMAL[type_]))
    assert got_type == type_
    assert type(payload) is COMMANDS[type_]
    built = msgspec.to_builtins(payload)
    assert {k: built[k] for k in MINIMAL[type_]} == MINIMAL[type_]


def test_defaults_are_filled_in() -> None:
    _, listing = decode_command(frame("face.conversation.list", {"request_id": "r"}))
    assert (listing.limit, listing.before) == (50, None)
    _, sub = decode_command(frame("face.subscribe", MINIMAL["face.subscribe"]))
    assert (sub.since, sub.transient_types, sub.detail_mode, sub.snapshot) == (
        None,
        None,
        None,
        False,
    )
    _, log = decode_command(frame("face.task.log", MINIMAL["face.task.log"]))
    assert (log.offset, log.limit) == (0, 65_536)


def test_str_and_bytes_decode_alike() -> None:
    data = frame("face.chat", EXAMPLES["face.chat"])
    assert decode_command(data) == decode_command(data.decode())


def test_decoded_commands_are_frozen() -> None:
    _, chat = decode_command(frame("face.chat", EXAMPLES["face.chat"]))
    with pytest.raises(AttributeError):
        chat.content = "changed"


@pytest.mark.parametrize("type_", sorted(set(COMMANDS) - {"face.hello", "face.ping"}))
def test_every_command_requires_request_id(type_: str) -> None:
    payload = {k: v for k, v in EXAMPLES[type_].items() if k != "request_id"}
    assert invalid(frame(type_, payload)).field == "request_id"


def test_command_sets() -> None:
    assert {
        "face.conversation.create",
        "face.conversation.rename",
        "face.chat",
        "face.chat.cancel",
        "face.approval.resolve",
        "face.run.cancel",
        "face.task.cancel",
    } == MUTATIONS
    assert not MUTATIONS & READS
    assert set(COMMANDS) - {"face.hello", "face.ping"} == READS | MUTATIONS
    assert list(REPLAY_SAFE) == sorted(MUTATIONS | READS)
    assert "face.approval.list" in READS


# -- errors name the field -------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        # unknown fields
        (frame("face.chat", {**EXAMPLES["face.chat"], "bogus": 1}), "bogus"),
        (frame("face.ping", {}, extra=1), "extra"),
        (
            frame(
                "face.hello",
                {**EXAMPLES["face.hello"], "client": {"name": "n", "version": "1", "os": "x"}},
            ),
            "client.os",
        ),
        # wrong types
        (frame("face.chat", {**EXAMPLES["face.chat"], "conversation_id": 5}), "conversation_id"),
        (frame("face.chat", {**EXAMPLES["face.chat"], "content": None}), "content"),
        (frame("face.conversation.list", {"request_id": "r", "limit": "10"}), "limit"),
        (frame("face.subscribe", {**EXAMPLES["face.subscribe"], "snapshot": "yes"}), "snapshot"),
        (
            frame("face.subscribe", {"request_id": "r", "conversation_ids": ["c", 3]}),
            "conversation_ids[1]",
        ),
        (
            frame(
                "face.hello",
                {**EXAMPLES["face.hello"], "client": {"name": 1, "version": "1"}},
            ),
            "client.name",
        ),
        (frame(7, {}), "type"),
        # missing fields
        (frame("face.chat", {"request_id": "r", "conversation_id": "c"}), "content"),
        (
            frame("face.hello", {**EXAMPLES["face.hello"], "client": {"name": "n"}}),
            "client.version",
        ),
        (frame("face.ping"), "payload"),
        (json.dumps({"payload": {}}).encode(), "type"),
        # constraints and enums
        (
            frame(
                "face.approval.resolve", {**EXAMPLES["face.approval.resolve"], "decision": "maybe"}
            ),
            "decision",
        ),
        (frame("face.conversation.list", {"request_id": "r", "limit": 0}), "limit"),
        (frame("face.conversation.list", {"request_id": "r", "limit": 201}), "limit"),
        (
            frame(
                "face.conversation.messages",
                {**EXAMPLES["face.conversation.messages"], "before_seq": 0},
            ),
            "before_seq",
        ),
        (frame("face.subscribe", {"request_id": "r", "conversation_ids": []}), "conversation_ids"),
        (
            frame("face.subscribe", {**EXAMPLES["face.subscribe"], "detail_mode": "full"}),
            "detail_mode",
        ),
        (frame("face.conversation.create", {"request_id": ""}), "request_id"),
        (frame("face.conversation.create", {"request_id": "r" * 129}), "request_id"),
        # payload of the wrong shape
        (frame("face.ping", []), "payload"),
        (frame("face.ping", "x"), "payload"),
        (b'{"type":"face.ping","payload":null}', "payload"),
        # unknown type
        (frame("face.nope", {}), "type"),
        (frame("face.chat.delta", {}), "type"),
    ],
)
def test_invalid_frames_name_the_field(data: bytes, field: str) -> None:
    assert invalid(data).field == field


def test_unknown_type_message_is_bounded() -> None:
    exc = invalid(frame("x" * 10_000, {}))
    assert exc.field == "type"
    assert len(exc.message) < 200


def test_trailing_whitespace_is_accepted() -> None:
    assert decode_command(b'{"type":"face.ping","payload":{}} \n')[0] == "face.ping"


@pytest.mark.parametrize(
    "data",
    [
        b'{"type":"face.ping","payload":{}}{}',
        b'{"type":"face.ping","payload":{}} x',
        b'{"type":"face.ping","payload":{}}\n{"type":"face.ping","payload":{}}',
        b'{"type":"face.ping","payload":{}},',
    ],
)
def test_trailing_data_is_rejected(data: bytes) -> None:
    invalid(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"{",
        b'{"type":"face.ping","payload":{}',
        b"\xff\xfe",
        b"[]",
        b'"face.ping"',
        b"null",
        b"42",
        "{'type': 'face.ping'}",
        b'{"type":"face.chat","payload":{"request_id":"r","conversation_id":"c","content":"\xff"}}',
    ],
)
def test_non_json_or_non_object_frames_are_rejected(data: bytes | str) -> None:
    invalid(data)


@pytest.mark.parametrize("key", ["", "c" * 129])
def test_invalid_since_key_names_the_since_field(key: str) -> None:
    payload = {"request_id": "r", "conversation_ids": ["c"], "since": {key: "e.1"}}
    assert invalid(frame("face.subscribe", payload)).field == "since"


def test_deeply_nested_payload_is_invalid_request() -> None:
    depth = 5_000
    data = b'{"type":"face.ping","payload":' + b"[" * depth + b"]" * depth + b"}"
    assert invalid(data).field == "payload"


def test_str_frame_with_lone_surrogate_is_invalid_request() -> None:
    invalid('{"type":"face.ping","payload":{"request_id":"\ud800"}}')


# -- request_id_of ----------------------------------------------------------------


def test_request_id_of_finds_the_id_in_an_invalid_frame() -> None:
    data = frame("face.chat", {"request_id": "r9", "content": 5})
    invalid(data)
    assert request_id_of(data) == "r9"


@pytest.mark.parametrize(
    "data",
    [
        b"garbage",
        b"[]",
        frame("face.chat", "x"),
        frame("face.chat", {"request_id": 5}),
        frame("face.chat", {"request_id": ""}),
        frame("face.chat", {"request_id": "r" * 129}),
        frame("face.chat", {}),
    ],
)
def test_request_id_of_gives_up_politely(data: bytes) -> None:
    assert request_id_of(data) is None


# -- fuzz: nothing but InvalidRequest escapes ---------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(min_size=1, max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)

field_names = sorted(
    {name for cls in COMMANDS.values() for name in cls.__struct_fields__} | {"bogus"}
)
payloads = st.dictionaries(
    st.sampled_from(field_names) | st.text(max_size=8), json_values, max_size=8
)
types = st.sampled_from(sorted(COMMANDS)) | st.text(max_size=20)


def _accepts_or_invalid(data: bytes | str) -> InvalidRequest | None:
    try:
        type_, payload = decode_command(data)
    except InvalidRequest as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST
        return exc
    assert isinstance(payload, COMMANDS[type_])
    return None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _accepts_or_invalid(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values)
def test_fuzz_arbitrary_json_values(value: Any) -> None:
    _accepts_or_invalid(json.dumps(value).encode())


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(type_=types, payload=payloads | json_values)
def test_fuzz_envelopes_with_arbitrary_payloads(type_: str, payload: Any) -> None:
    data = json.dumps({"type": type_, "payload": payload})
    exc = _accepts_or_invalid(data)
    if exc is not None:
        # A well-formed envelope always gets an error that names a field.
        assert exc.field
    if exc is not None and type_ not in COMMANDS:
        assert exc.field == "type"


@settings(max_examples=200)
@given(type_=st.sampled_from(sorted(COMMANDS)), data=st.data())
def test_fuzz_one_field_replaced(type_: str, data: st.DataObject) -> None:
    payload = dict(EXAMPLES[type_])
    name = data.draw(st.sampled_from(sorted(payload)))
    payload[name] = data.draw(json_values)
    exc = _accepts_or_invalid(frame(type_, payload))
    if exc is not None:
        assert exc.field is not None
        assert exc.field.split(".")[0].split("[")[0] == name
