"""The message box and what was typed before the face took the terminal."""

from __future__ import annotations

import contextlib
import os
import termios
from collections.abc import Iterator

from textual.app import App, ComposeResult

from halfpi.face.terminal_input import Composer, typed_ahead


@contextlib.contextmanager
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal in its ordinary (cooked) mode: (the keyboard's end, the program's)."""
    keyboard, program = os.openpty()
    try:
        yield keyboard, program
    finally:
        os.close(keyboard)
        os.close(program)


def test_lines_typed_before_the_face_started_are_read_with_their_enter() -> None:
    with terminal() as (keyboard, program):
        assert typed_ahead(program) == ""  # nothing typed: no wait
        os.write(keyboard, b"hello\r")  # Enter; the terminal made it a line feed
        os.write(keyboard, b"a second\rand half a li")
        assert typed_ahead(program) == "hello\na second\n"
        # A line not ended yet stays where it is: it reaches the face as keys.
        attrs = termios.tcgetattr(program)
        attrs[3] &= ~termios.ICANON
        termios.tcsetattr(program, termios.TCSANOW, attrs)
        assert os.read(program, 100) == b"and half a li"


class Host(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def compose(self) -> ComposeResult:
        yield Composer(id="input", placeholder="Type a message; Enter sends")

    def on_composer_submitted(self, event: Composer.Submitted) -> None:
        self.sent.append(event.value)
        event.composer.value = ""


async def test_enter_sends_and_ctrl_j_starts_a_new_line() -> None:
    host = Host()
    async with host.run_test() as pilot:
        box = host.query_one(Composer)
        await pilot.press("a", "b", "ctrl+j", "c", "ctrl+j", "ctrl+j", "d")
        assert box.value == "ab\nc\n\nd"
        assert box.size.height > 3  # it grows with its lines
        await pilot.press("enter")
        assert host.sent == ["ab\nc\n\nd"]
        assert box.value == ""
        box.insert_text_at_cursor("x")
        assert box.value == "x"
