"""Durable Streams offsets and framing (core/durable.py, docs/protocol.md §20)."""

from __future__ import annotations

import json

import pytest

from halfpi.core.cursor import Cursor
from halfpi.core.durable import (
    CURSOR_EPOCH_S,
    CURSOR_INTERVAL_S,
    control_event,
    cursor_of,
    data_event,
    offset_of,
    stream_cursor,
)
from halfpi.errors import InvalidRequest


def test_offsets_sort_as_text_in_log_order() -> None:
    seqs = [0, 1, 2, 9, 10, 11, 99, 100, 12345, 10**15]
    offsets = [offset_of(Cursor("a1b2c3d4", s)) for s in seqs]
    assert sorted(offsets) == offsets
    assert len(set(offsets)) == len(offsets)


def test_an_offset_is_a_single_url_safe_token_never_a_sentinel() -> None:
    offset = offset_of(Cursor("a1b2c3d4", 7))
    assert not set(",&=?/").intersection(offset)
    assert offset not in ("-1", "now")
    assert len(offset) < 256


def test_an_offset_stands_for_its_cursor_and_a_cursor_is_accepted_as_one() -> None:
    cursor = Cursor("a1b2c3d4", 42)
    assert cursor_of(offset_of(cursor)) == cursor
    assert cursor_of("a1b2c3d4.42") == cursor


@pytest.mark.parametrize("text", ["12", "a_1", "a_x000000000000001", "", "a.b", "-2",
                                  "a/b_0000000000000001", "a.1_0000000000000001"])
def test_a_malformed_offset_is_an_invalid_request(text: str) -> None:
    with pytest.raises(InvalidRequest):
        cursor_of(text)


def test_the_stream_cursor_is_the_interval_and_never_goes_back() -> None:
    now = CURSOR_EPOCH_S + 1000 * CURSOR_INTERVAL_S + 5
    assert stream_cursor(now, None, 60) == "1000"
    assert stream_cursor(now, "990", 60) == "1000"  # the client's is behind
    assert stream_cursor(now, "1000", 60) == "1003"  # not behind: past it, by the jitter
    assert stream_cursor(now, "1200", 1) == "1201"
    assert stream_cursor(now, "junk", 60) == "1000"


def test_sse_data_is_one_json_array_and_control_follows() -> None:
    frames = [b'{"type":"face.event","payload":{}}', b'{"type":"face.chat.delta","payload":{}}']
    data = data_event(frames).decode()
    assert data.startswith("event: data\ndata: ")
    assert json.loads(data.split("data: ", 1)[1]) == [json.loads(f) for f in frames]
    control = control_event("e_0000000000000003", "1000", True).decode()
    assert control.startswith("event: control\n")
    body = json.loads(control.split("data: ", 1)[1])
    assert body == {"streamNextOffset": "e_0000000000000003", "streamCursor": "1000",
                    "upToDate": True}
    assert "upToDate" not in control_event("e_0000000000000003", "1000", False).decode()
