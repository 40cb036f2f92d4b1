"""Conversation titles: what a list shows for a conversation.

A conversation created without a name is titled from its first user message
when that chat is admitted; a rename replaces any title. Titles are shown in
terminals and lists, so they are one line with no control characters.
"""

from __future__ import annotations

import re

TITLE_MAX = 60
NAME_MAX = 200

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_SPACES = re.compile(r"\s+")


def clean_name(text: str, limit: int = NAME_MAX) -> str:
    """One line: control characters become spaces, runs of spaces one space,
    cut to ``limit`` characters (an ellipsis marks a cut)."""
    line = _SPACES.sub(" ", _CONTROLS.sub(" ", text)).strip()
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    if line[limit - 1] != " ":  # the cut splits a word: end on the word before it
        space = cut.rfind(" ")
        if space >= limit // 2:  # …when that keeps most of the line
            cut = cut[:space]
    return cut.rstrip() + "…"


def title_from_message(content: str) -> str | None:
    """The title of an unnamed conversation from its first user message: the
    first line that has any text, cleaned, at most 60 characters; None if
    the message has no text at all."""
    for line in content.splitlines():
        title = clean_name(line, TITLE_MAX)
        if title:
            return title
    return None
