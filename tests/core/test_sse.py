"""The SSE codec (DESIGN §9): resume tokens, events, positions; no I/O."""

from __future__ import annotations

import base64

import msgspec
import pytest

from halfpi.core.events import Evicted, to_message
from halfpi.core.outbound import DELTA, Message
from halfpi.core.sse import (
    Grant,
    event_bytes,
    open_token,
    position_of,
    seal_token,
    type_of,
)

KEY = b"k" * 32
CONVS = ("c_a", "c_b")


def test_a_token_round_trips_the_cursors_of_every_conversation() -> None:
    token = seal_token(KEY, "p_1", CONVS, {"c_a": "e1.4", "c_b": "e2.9"}, None)
    opened = open_token(KEY, token, CONVS, "p_1")
    assert opened is not None
    assert opened.cursors == {"c_a": "e1.4", "c_b": "e2.9"}
    assert opened.grant is None


def test_a_token_is_compact_and_url_safe() -> None:
    token = seal_token(KEY, "p_1", CONVS, {"c_a": "0a1b2c3d.12345", "c_b": "0a1b2c3e.7"}, None)
    assert len(token) < 64
    # Nothing a URL's query or a header would need escaped.
    assert set(token) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.,~"
    )


def test_a_conversation_without_a_position_is_left_out() -> None:
    token = seal_token(KEY, "p_1", CONVS, {"c_b": "e2.9"}, None)
    opened = open_token(KEY, token, CONVS, "p_1")
    assert opened is not None and opened.cursors == {"c_b": "e2.9"}


@pytest.mark.parametrize(
    ("principal", "conversations", "key"),
    [
        ("p_2", CONVS, KEY),  # another principal's
        ("p_1", ("c_a",), KEY),  # other conversations
        ("p_1", ("c_b", "c_a", "c_c"), KEY),
        ("p_1", CONVS, b"x" * 32),  # signed by another Mind (or an old key)
    ],
)
def test_a_foreign_token_does_not_open(
    principal: str, conversations: tuple[str, ...], key: bytes
) -> None:
    token = seal_token(KEY, "p_1", CONVS, {"c_a": "e1.4"}, None)
    assert open_token(key, token, conversations, principal) is None


@pytest.mark.parametrize("garbage", ["", "x", "!!!!", "A" * 5000, "AAAA", "__--"])
def test_a_malformed_token_does_not_open(garbage: str) -> None:
    assert open_token(KEY, garbage, CONVS, "p_1") is None


def test_a_token_with_its_tag_or_grant_altered_does_not_open() -> None:
    grant = Grant("p_1", 1_000_600, "summary")
    token = seal_token(KEY, "p_1", CONVS, {"c_a": "e1.4"}, grant)
    cursors, _, sealed = token.rpartition("~")
    raw = base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))
    for altered in (raw[:-1] + bytes([raw[-1] ^ 1]),  # the tag
                    raw.replace(b"1000600", b"9000600"),  # the grant's expiry
                    raw.replace(b"summary", b"transpa")):  # its detail mode
        text = base64.urlsafe_b64encode(altered).rstrip(b"=").decode()
        assert open_token(KEY, f"{cursors}~{text}", CONVS, None) is None


def test_an_altered_cursor_only_moves_where_the_stream_resumes() -> None:
    token = seal_token(KEY, "p_1", CONVS, {"c_a": "e1.4"}, None)
    moved = token.replace("e1.4", "e1.2", 1)  # the cursors ride in plain text
    opened = open_token(KEY, moved, CONVS, "p_1")
    assert opened is not None and opened.cursors == {"c_a": "e1.2"}


def test_a_grant_names_its_principal_and_opens_without_one() -> None:
    grant = Grant("p_1", 1_000_600, "summary")
    token = seal_token(KEY, "p_1", CONVS, {"c_a": "e1.4"}, grant)
    opened = open_token(KEY, token, CONVS, None)
    assert opened is not None and opened.grant == grant
    assert opened.cursors == {"c_a": "e1.4"}
    # Without a grant, a token says nothing about who holds it.
    plain = seal_token(KEY, "p_1", CONVS, {"c_a": "e1.4"}, None)
    assert open_token(KEY, plain, CONVS, None) is None


def test_type_and_position_of_frames() -> None:
    delta = Message("face.chat.delta", None, kind=DELTA, conversation_id="c_a", seq=7,
                    cursor="e1.7", request_id="r", text="hi")
    frame = delta.frame(3)
    assert type_of(frame) == "face.chat.delta"
    assert position_of(frame) == ("c_a", "e1.7")
    evicted = to_message(Evicted(cursors={"c_a": "e1.7"})).frame(4)
    assert type_of(evicted) == "face.evicted"
    assert position_of(evicted) is None
    reset = msgspec.json.encode({"type": "face.reset", "payload": {
        "event_seq": 1, "conversation_id": "c_b", "reason": "cursor_expired",
        "snapshot": {"conversation": {"id": "c_b"}, "cursor": "e2.40", "epoch": "e2"}}})
    assert position_of(reset) == ("c_b", "e2.40")
    snapshot = msgspec.json.encode({"type": "face.snapshot", "payload": {
        "event_seq": 1, "request_id": "s", "conversation": {"id": "c_a", "name": None},
        "cursor": "e1.3", "epoch": "e1"}})
    assert position_of(snapshot) == ("c_a", "e1.3")


def test_an_event_carries_the_websocket_frame_as_its_data() -> None:
    frame = b'{"type":"face.event","payload":{"event_seq":1,"text":"a\\nb"}}'
    assert event_bytes(frame, "face.event", "TOK") == (
        b"event: face.event\ndata: " + frame + b"\nid: TOK\n\n"
    )
