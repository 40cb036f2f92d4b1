"""Titles of conversations: one clean line of at most 60 characters."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.titles import TITLE_MAX, clean_name, title_from_message


def test_title_is_the_first_line_of_the_first_message() -> None:
    assert title_from_message("plan the trip\nto Lisbon in May") == "plan the trip"


def test_title_skips_leading_blank_lines() -> None:
    assert title_from_message("\n   \n  hello there  \nmore") == "hello there"


def test_title_strips_control_characters() -> None:
    assert title_from_message("\x1b[31mred\x1b[0m alert\x07") == "[31mred [0m alert"


def test_a_long_title_ends_on_a_word_with_an_ellipsis() -> None:
    title = title_from_message("word " * 40)
    assert title is not None
    assert len(title) <= TITLE_MAX
    assert title.endswith("word…")


def test_a_message_without_text_gives_no_title() -> None:
    assert title_from_message(" \n\t\n") is None


def test_clean_name_keeps_a_short_name_unchanged() -> None:
    assert clean_name("plans") == "plans"


@given(st.text())
def test_a_title_is_one_short_clean_line(content: str) -> None:
    title = title_from_message(content)
    if title is None:
        return
    assert 0 < len(title) <= TITLE_MAX
    assert title == title.strip()
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in title)
