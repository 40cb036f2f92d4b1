"""The headless face's stdin lines: a line that is not a command gets one
sentence saying what a command looks like, never Python's own words
(``'type'``, ``list indices must be integers``)."""

from __future__ import annotations

import pytest

from halfpi.face.headless_lines import parse_command


def test_a_command_line_is_its_type_and_payload() -> None:
    assert parse_command('{"type": "face.chat", "payload": {"content": "hi"}}') == (
        "face.chat", {"content": "hi"})
    assert parse_command('{"type": "face.conversation.list"}') == ("face.conversation.list", {})


@pytest.mark.parametrize(("line", "says"), [
    ("nope", "not JSON"),
    ('{"type": "face.chat"', "not JSON"),
    ("[1, 2]", "a JSON object"),
    ('"x"', "a JSON object"),
    ('{"payload": {}}', '"type"'),
    ('{"type": 5}', '"type"'),
    ('{"type": ""}', '"type"'),
    ('{"type": "face.chat", "payload": [1]}', '"payload"'),
    ('{"type": "face.chat", "payload": {}, "x": 1}', '"x"'),
])
def test_a_line_that_is_not_a_command_is_one_plain_sentence(line: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_command(line)
    why = str(caught.value)
    assert says in why, why
    assert "{type, payload}" not in why or "e.g." in why
    for python in ("indices", "update sequence", "'type'", "Expecting value", "char "):
        assert python not in why, why
