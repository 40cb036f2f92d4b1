"""escape_controls: untrusted text reaches a terminal with nothing left to interpret."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from halfpi.face.render import escape_controls, preformatted

C0_ESCAPED = [c for c in range(0x00, 0x20) if chr(c) not in "\n\t"]
C1 = list(range(0x80, 0xA0))
DEL = 0x7F
DANGEROUS = frozenset(chr(c) for c in [*C0_ESCAPED, DEL, *C1])

_VISIBLE = re.compile(r"\\x([0-9a-f]{2})")


def _unescape(text: str) -> str:
    return _VISIBLE.sub(lambda m: chr(int(m.group(1), 16)), text)


@pytest.mark.parametrize("code", C0_ESCAPED, ids=lambda c: f"0x{c:02x}")
def test_every_c0_control_except_newline_and_tab_is_escaped(code: int) -> None:
    assert escape_controls(f"a{chr(code)}b") == f"a\\x{code:02x}b"


def test_newline_and_tab_are_kept() -> None:
    assert escape_controls("one\ttwo\nthree\n") == "one\ttwo\nthree\n"


def test_carriage_return_is_escaped() -> None:
    # A bare CR moves the cursor to the start of the line and lets a reply
    # overwrite what was printed before it.
    assert escape_controls("safe\roverwritten") == "safe\\x0doverwritten"


def test_del_is_escaped() -> None:
    assert escape_controls("x\x7fy") == "x\\x7fy"


@pytest.mark.parametrize("code", C1, ids=lambda c: f"0x{c:02x}")
def test_every_c1_control_is_escaped(code: int) -> None:
    # 0x9b is CSI: on some terminals it starts an escape sequence by itself.
    assert escape_controls(f"a{chr(code)}b") == f"a\\x{code:02x}b"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear screen, cursor home
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # set window title (OSC ... BEL)
        (
            "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",
            "\\x1b]8;;http://x\\x1b\\link\\x1b]8;;\\x1b\\",
        ),
        ("red \x1b[31mtext\x1b[0m", "red \\x1b[31mtext\\x1b[0m"),
        ("\x9b31m", "\\x9b31m"),  # 8-bit CSI
    ],
)
def test_escape_sequences_are_shown_not_interpreted(raw: str, shown: str) -> None:
    out = escape_controls(raw)
    assert out == shown
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain ASCII, punctuation !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "héllo wörld — ¿qué? «ça»",
        "你好世界 日本語のテキスト",
        "한국어 텍스트",
        "emoji 🎉👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
        "math ∑∫√∞ ≠ ≤ ≥",
        "\u00a0no-break space and \u00ad soft hyphen",  # first code points after C1
        "tabs\tand\nnewlines",
    ],
)
def test_printable_unicode_is_untouched(text: str) -> None:
    assert escape_controls(text) == text


def test_boundaries_of_the_ranges() -> None:
    assert escape_controls("\x1f\x20") == "\\x1f "
    assert escape_controls("\x7e\x7f") == "~\\x7f"
    assert escape_controls("\x9f\xa0") == "\\x9f\xa0"


@given(st.text())
def test_output_never_contains_a_control(text: str) -> None:
    out = escape_controls(text)
    assert not DANGEROUS.intersection(out)


@given(st.text(alphabet=st.characters(exclude_characters="".join(sorted(DANGEROUS)))))
def test_text_without_controls_is_unchanged(text: str) -> None:
    assert escape_controls(text) == text


@given(st.text())
def test_escaping_is_idempotent(text: str) -> None:
    once = escape_controls(text)
    assert escape_controls(once) == once


@given(st.text())
def test_nothing_is_lost(text: str) -> None:
    # Every replaced character is recoverable from its visible escape; the
    # mapping is only ambiguous when the input already contains a backslash.
    assume("\\" not in text)
    assert _unescape(escape_controls(text)) == text


@given(st.text(alphabet=st.sampled_from([*sorted(DANGEROUS), "a", "\n", "\t", "é", "🎉"])))
def test_dense_control_text_is_fully_escaped(text: str) -> None:
    out = escape_controls(text)
    assert not DANGEROUS.intersection(out)
    expected = "".join(f"\\x{ord(c):02x}" if c in DANGEROUS else c for c in text)
    assert out == expected


def test_tool_output_keeps_its_lines_and_columns_and_nothing_else() -> None:
    raw = "total 8\r\n-rw-r--r--\t1 me\n\x1b[31mred\x1b[0m\rover\n\n"
    assert preformatted(raw) == "total 8\n-rw-r--r--\t1 me\n\\x1b[31mred\\x1b[0m\\x0dover\n"
    assert preformatted("") == ""
