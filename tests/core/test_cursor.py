"""Cursors: the opaque ``"<epoch>.<seq>"`` strings a Face sends back (DESIGN §3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.cursor import Cursor, encode_cursor, parse_cursor
from halfpi.core.ids import new_epoch
from halfpi.errors import ErrorCode, InvalidRequest

epochs = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters="."), min_size=1, max_size=20
)


def test_encode_is_epoch_dot_seq() -> None:
    assert encode_cursor("ab12", 7) == "ab12.7"
    assert Cursor("ab12", 7).encode() == "ab12.7"


def test_parse_reads_epoch_and_seq() -> None:
    assert parse_cursor("ab12.7") == Cursor("ab12", 7)
    assert parse_cursor("ab12.0") == Cursor("ab12", 0)


def test_parse_takes_the_last_dot_as_separator() -> None:
    assert parse_cursor("a.b.3") == Cursor("a.b", 3)


def test_round_trip_with_a_fresh_epoch() -> None:
    epoch = new_epoch()
    assert "." not in epoch
    assert parse_cursor(encode_cursor(epoch, 12345)) == Cursor(epoch, 12345)


@given(epoch=epochs, seq=st.integers(min_value=0, max_value=10**15))
def test_round_trip_property(epoch: str, seq: int) -> None:
    text = encode_cursor(epoch, seq)
    assert text == Cursor(epoch, seq).encode()
    assert parse_cursor(text) == Cursor(epoch, seq)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        ".",
        ".5",
        "abc.",
        "abc.-1",
        "abc.+1",
        "abc. 1",
        "abc.1 ",
        "abc.1_000",
        "abc.1.5x",
        "abc.0x10",
        "e." + "1" * 64,
    ],
)
def test_malformed_cursor_is_invalid_request_naming_the_field(text: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_cursor(text, field="since.c_1")
    assert caught.value.field == "since.c_1"
    assert caught.value.code is ErrorCode.INVALID_REQUEST


def test_malformed_cursor_names_since_by_default() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_cursor("nonsense")
    assert caught.value.field == "since"


def test_overlong_cursor_is_refused_even_if_well_formed() -> None:
    text = "e" * 60 + ".1234"
    assert len(text) > 64
    with pytest.raises(InvalidRequest):
        parse_cursor(text)


@pytest.mark.parametrize("text", ["e.\u00b2", "e.1\u00b9"])
def test_non_ascii_digit_cursor_is_invalid_request(text: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_cursor(text, field="since.c")
    assert caught.value.field == "since.c"


def test_cursor_seq_must_be_ascii_digits() -> None:
    with pytest.raises(InvalidRequest):
        parse_cursor("e.\u0663")


@given(text=st.text(alphabet=st.characters(codec="ascii"), max_size=80))
def test_parse_never_raises_anything_but_invalid_request(text: str) -> None:
    try:
        cursor = parse_cursor(text, field="since.c")
    except InvalidRequest as exc:
        assert exc.field == "since.c"
    else:
        assert cursor.seq >= 0
        assert cursor.epoch
        assert len(text) <= 64
