"""What a person types into the terminal face: the message box, and the
lines typed before the face took the terminal.

**Multi-line messages.** Enter sends; ctrl+j starts a new line (a message
may hold several lines, a code block). ctrl+j because it is the one
"other Enter" every terminal can send: shift+enter and alt+enter reach a
program as a plain Enter in most terminals.

**Typed ahead.** Until the face switches the terminal to raw mode, the
terminal is in its ordinary (cooked) mode: it keeps what is typed as lines
and turns Enter into a line feed — which the face would later read as
ctrl+j (a new line) instead of Enter, so a message typed and sent while the
face was starting was never sent. :func:`typed_ahead` reads those complete
lines first (a line not ended yet stays in the terminal and arrives as keys),
and the face sends them as typed.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class Composer(TextArea):
    """The message box: Enter sends (:class:`Composer.Submitted`), ctrl+j
    starts a new line; it grows with its text up to ``MAX_LINES``."""

    MAX_LINES = 8
    # Handled in on_key, in the box's own queue: a binding would run ahead
    # of the letters typed just before (app-level bindings jump the queue).
    # This one is here for the footer.
    BINDINGS = [Binding("ctrl+j", "newline", "New line")]
    DEFAULT_CSS = f"""
    Composer {{ height: auto; max-height: {MAX_LINES + 2}; }}
    """

    @dataclass
    class Submitted(Message):
        composer: Composer
        value: str

    def __init__(self, *, id: str, placeholder: str) -> None:
        super().__init__(id=id, placeholder=placeholder, soft_wrap=True, tab_behavior="focus",
                         highlight_cursor_line=False)

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def insert_text_at_cursor(self, text: str) -> None:
        self.insert(text)

    def on_key(self, event: events.Key) -> None:
        if event.key in ("enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            if event.key == "enter":
                self.action_submit()
            else:
                self.action_newline()

    def action_submit(self) -> None:
        self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        self.insert("\n")


def typed_ahead(fd: int) -> str:
    """The complete lines typed on terminal ``fd`` and not read yet, each
    ending in ``\\n`` (its Enter); "" when there are none. Never waits."""
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")
