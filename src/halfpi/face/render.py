"""Making untrusted text safe for a terminal.

Model replies and tool output may contain control characters — an ESC that
starts a terminal escape sequence can repaint the screen, move the cursor,
set the window title or worse. Before any such text reaches a terminal,
every C0 control (except newline and tab), DEL and every C1 control is
replaced by a visible escape (``\\x1b``), so what the person sees is exactly
what was sent, and nothing is interpreted.
"""

from __future__ import annotations

import re

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def escape_controls(text: str) -> str:
    """Replace terminal control characters with visible ``\\xNN`` escapes."""
    return _CONTROLS.sub(_visible, text)


def preformatted(text: str) -> str:
    """A tool's output for a terminal, as printed: its lines and columns
    (newlines, tabs) kept, Windows line ends read as line ends, every other
    control escaped, the final newline dropped (it would draw an empty line)."""
    return escape_controls(text.replace("\r\n", "\n")).removesuffix("\n")
