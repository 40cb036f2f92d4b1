"""Secrets never leave through a tool (DESIGN §8): the scanner, with no I/O.

The shapes of halfpi's own credentials (Face and Hand tokens, stream
tickets, sign-in links) and the exact values of configured secrets are
redacted from tool output, also when a chunk boundary cuts them in two;
text that merely looks a little like them is left alone.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from halfpi.core.redact import (
    HALFPI_TOKEN,
    SIGN_IN_LINK,
    STREAM_TICKET,
    Redactor,
    StreamRedactor,
    count_markers,
    credential_in,
    marker,
    window_page,
)


def face_token() -> str:
    return "hpf_" + secrets.token_urlsafe(32)  # as mind/auth.py makes them


def hand_token() -> str:
    return "hph_" + secrets.token_urlsafe(32)


def ticket() -> str:
    return "hps_" + secrets.token_urlsafe(24)  # as mind/tickets.py makes them


def link() -> str:
    return "http://127.0.0.1:15707/#link=" + secrets.token_urlsafe(16)  # mind/links.py


SHAPES = Redactor()


def test_each_credential_shape_is_redacted_and_counted() -> None:
    face, hand, tick, url = face_token(), hand_token(), ticket(), link()
    text = f"face {face}\nHALFPI_HAND_TOKEN={hand}\0?ticket={tick}&x=1\nopen {url} now\n"
    out, counts = SHAPES.redact(text)
    for secret in (face, hand, tick, url.partition("#")[2]):
        assert secret not in out
    assert out == (f"face {marker(HALFPI_TOKEN)}\nHALFPI_HAND_TOKEN={marker(HALFPI_TOKEN)}\0"
                   f"?ticket={marker(STREAM_TICKET)}&x=1\n"
                   f"open http://127.0.0.1:15707/{marker(SIGN_IN_LINK)} now\n")
    assert counts == {HALFPI_TOKEN: 2, STREAM_TICKET: 1, SIGN_IN_LINK: 1}
    assert count_markers(out) == counts


def test_text_that_only_resembles_a_credential_is_left_alone() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    plain = "\n".join([
        digest, "sha256:" + digest, str(uuid.uuid4()), "a" * 200, secrets.token_urlsafe(32),
        "TOKEN_PREFIX = {'face': 'hpf_', 'hand': 'hph_'}",
        "hph_ alone, hpf_short, hps_abc",
        "def test_hph_token_is_refused_by_its_policy_check(): pass",  # snake case
        "hpf_abcdefghijklmnopqrstuvwxyz_abcdefghijk",  # one case only: not random
        "see #linkage and #link=short and http://x/#link=CODE",
        "git 4f2b8c1d9e0a7b6c5d4e3f2a1b0c9d8e7f6a5b4c",
    ])
    assert SHAPES.redact(plain) == (plain, {})
    assert credential_in(plain.encode()) is None


def test_a_file_that_holds_a_token_is_known_by_its_content() -> None:
    assert credential_in((hand_token() + "\n").encode()) == HALFPI_TOKEN
    assert credential_in(b"export X=1\nHALFPI_TOKEN=" + face_token().encode()) == HALFPI_TOKEN
    assert credential_in(b"\xff\xfe binary \x00" + hand_token().encode() + b"\x00") == HALFPI_TOKEN


def test_exact_values_of_configured_secrets_are_redacted_longest_first() -> None:
    key = "sk-proj-" + secrets.token_urlsafe(30)
    redactor = Redactor({key: "provider API key", key[:20]: "metrics token"}, shapes=False)
    out, counts = redactor.redact(f"OPENAI_API_KEY={key}\0X={key[:20]}\n")
    assert out == ("OPENAI_API_KEY=[redacted: provider API key]\0"
                   "X=[redacted: metrics token]\n")
    assert counts == {"provider API key": 1, "metrics token": 1}


def test_values_too_short_to_be_secrets_are_not_searched() -> None:
    redactor = Redactor({"x": "a", "": "b", "1234567": "c"}, shapes=False)
    assert redactor.redact("x 1234567") == ("x 1234567", {})


def _streamed(redactor: Redactor, parts: list[str], limit: int = 4096) -> tuple[str, list[str]]:
    stream = StreamRedactor(redactor, limit=limit)
    pieces = [stream.feed(part) for part in parts]
    pieces += stream.flush()
    return "".join(pieces), [p for p in pieces if p]


def test_a_secret_cut_by_a_chunk_boundary_is_still_redacted_at_every_cut() -> None:
    key = "sk-" + secrets.token_urlsafe(40)
    redactor = Redactor({key: "provider API key"})
    token = hand_token()
    text = f"before {token} middle {key} after"
    whole, _ = redactor.redact(text)
    for cut in range(len(text) + 1):
        out, _ = _streamed(redactor, [text[:cut], text[cut:]])
        assert out == whole, cut
        assert token[4:30] not in out and key[3:30] not in out


def test_a_secret_spread_over_many_small_chunks_is_redacted() -> None:
    token = face_token()
    text = ("x" * 4090) + " " + token + " " + ("y" * 5000)
    parts = [text[i:i + 3] for i in range(0, len(text), 3)]
    out, _ = _streamed(SHAPES, parts)
    assert token not in out and out == SHAPES.redact(text)[0]


def test_a_stream_counts_what_it_redacted() -> None:
    stream = StreamRedactor(SHAPES)
    token = hand_token()
    stream.feed("a " + token[:10])
    stream.feed(token[10:] + " b " + ticket() + " c")
    stream.flush()
    assert stream.counts == {HALFPI_TOKEN: 1, STREAM_TICKET: 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab_-Z9 \n#linkhpfs=é€", max_size=300), max_size=12),
       st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_streaming_equals_redacting_the_whole_and_keeps_every_piece_bounded(
    noise: list[str], cuts: list[int],
) -> None:
    token, key = hand_token(), "k3y-" + secrets.token_hex(12)
    redactor = Redactor({key: "secret"})
    text = "".join(f"{n}{token if i % 2 else key}" for i, n in enumerate(noise))
    parts, at = [], 0
    for cut in cuts:
        parts.append(text[at:at + cut])
        at += cut
    parts.append(text[at:])
    out, pieces = _streamed(redactor, parts, limit=64)
    assert out == redactor.redact(text)[0]
    assert token not in out and key not in out
    assert all(len(p.encode()) <= 64 for p in pieces)


def test_a_stream_holds_back_no_more_than_a_credential_could_need() -> None:
    stream = StreamRedactor(SHAPES)
    assert stream.feed("plain text that cannot start a token ") == (
        "plain text that cannot start a token ")
    assert stream.feed("ends with hp") == "ends with "  # "hp" may begin "hph_…"
    assert stream.feed("x") == "hpx"
    assert stream.flush() == []


def test_a_marker_is_never_longer_than_what_it_replaces() -> None:
    """So a redacted output never outgrows the bounds the Mind enforces."""
    shortest = ["hph_" + "aB" * 11, "hps_" + "aB" * 11, "#link=" + "a" * 18]
    for text in shortest:
        out, counts = SHAPES.redact(text)
        assert counts and len(out) <= len(text), (text, out)


def test_a_value_repeated_many_times_is_redacted_every_time() -> None:
    """One pass over the text, however often a command prints the value."""
    key = "sk-" + secrets.token_urlsafe(40)
    out, counts = Redactor({key: "provider API key"}).redact((key + "\n") * 20_000)
    assert counts == {"provider API key": 20_000}
    assert out == "[redacted: provider API key]\n" * 20_000


def test_a_chance_match_in_a_long_blob_costs_the_blob_no_more_than_a_credential() -> None:
    """URL-safe base64 holds ``hpf_``, ``hph_`` or ``hps_`` by chance about once in four
    MiB: a match takes no more than the credential it resembles (a token's
    43 characters, a ticket's 32, a link code's 22), never the rest of the
    blob."""
    blob = secrets.token_urlsafe(3000)
    for prefix, body in (("hpf_", 43), ("hph_", 43), ("hps_", 32), ("#link=", 22)):
        text = blob[:1000] + prefix + blob[1000:]
        out, counts = SHAPES.redact(text)
        assert sum(counts.values()) == 1, counts
        assert out.endswith(blob[1000 + body:]), (prefix, len(out), len(text))
        streamed, _ = _streamed(SHAPES, [text[i:i + 700] for i in range(0, len(text), 700)],
                                limit=4096)
        assert streamed == out


def test_an_end_that_cuts_a_secret_takes_out_a_piece_worth_having() -> None:
    """Where halfpi (or a reader's ``max_bytes``) cut an output, its end may
    be inside a secret: half of it or more is taken out and counted; less,
    and the ordinary text that happens to end like it, stays."""
    key = "sk-proj-" + secrets.token_urlsafe(40)
    redactor = Redactor({key: "provider API key"})
    for size in (len(key) - 1, (len(key) + 1) // 2):
        assert redactor.redact_end("KEY=" + key[:size]) == ("KEY=", {"provider API key": 1})
    short = "keys look like " + key[:12]
    assert redactor.redact_end(short) == (short, {})
    whole = f"KEY={key}\n{key[:-1]}"
    assert redactor.redact_end(whole) == ("KEY=[redacted: provider API key]\n",
                                          {"provider API key": 2})
    stream = StreamRedactor(redactor)
    assert stream.feed("KEY=" + key[:-3]) == "KEY="
    assert stream.flush() == [] and stream.counts == {"provider API key": 1}


def test_a_log_window_that_ends_inside_a_secret_shows_no_piece_of_it() -> None:
    """The last page of a log that ended (or a Hand's window shorter than
    asked) may stop inside a secret: like any end, the piece is taken out,
    and the page still reaches the end so the reader is done."""
    key = "k3y-" + secrets.token_hex(16)
    redactor = Redactor({key: "secret"})
    text = "pre " + key[:-2]
    shown, end, counts = window_page(redactor, text, 0, 4096, more=False)
    assert (shown, end, counts) == ("pre [redacted: secret]", len(text), {"secret": 1})
    shown, end, counts = window_page(redactor, text, 6, 4096, more=False)
    assert key[6:-2] not in shown and end == len(text)
