"""Durable Streams offsets and framing (DESIGN §9, docs/protocol.md §20).

The Durable Streams protocol (PROTOCOL.md §8) wants offsets that are
opaque, **lexicographically sortable**, unique, strictly increasing, free
of ``, & = ? /`` and never the sentinels ``-1`` / ``now``. A cursor
``<epoch>.<seq>`` is not sortable as text (``a.10`` < ``a.9``), so an
offset is the cursor with its seq zero-padded to a fixed width:
``<epoch>_<seq, 16 digits>``. Within an epoch — the lifetime of the stream
as the Mind can replay it — text order is log order. A new epoch (the
journal lost continuity) is a new stream: every offset of the old one is
expired history (410), so offsets of two epochs are never compared.

Also here: the ``Stream-Cursor`` of live responses (PROTOCOL.md §10.1:
20 s intervals from 2024-10-09, never going back, jittered forward when a
client's is not behind) and the SSE ``data`` / ``control`` events.

Pure: no I/O, no clock (wall time and jitter are arguments).
"""

from __future__ import annotations

import json

from halfpi.core.cursor import Cursor, parse_cursor
from halfpi.errors import InvalidRequest

START = "-1"  # the stream's beginning
NOW = "now"  # its tail: only what comes next
SEQ_DIGITS = 16
CURSOR_EPOCH_S = 1728432000  # 2024-10-09T00:00:00Z, PROTOCOL.md §10.1
CURSOR_INTERVAL_S = 20
_FORBIDDEN = frozenset(",&=?/")


def offset_of(cursor: Cursor) -> str:
    """The offset a reader resumes from once it has ``cursor``'s event."""
    return f"{cursor.epoch}_{cursor.seq:0{SEQ_DIGITS}d}"


def offset_of_text(cursor: str) -> str:
    epoch, _, seq = cursor.rpartition(".")
    return offset_of(Cursor(epoch, int(seq)))


def cursor_of(offset: str, *, field: str = "offset") -> Cursor:
    """The cursor an offset stands for; ``invalid_request`` for anything
    this Mind never minted (a malformed offset is 400, PROTOCOL.md §5.6).
    A cursor itself (``<epoch>.<seq>``, e.g. a snapshot's) is accepted too:
    how a reader follows on from the snapshot it re-read after a 410."""
    if "_" not in offset and "." in offset:
        try:
            return parse_cursor(offset, field=field)
        except InvalidRequest:
            pass
    epoch, sep, seq = offset.rpartition("_")
    if (
        not sep
        or not epoch
        or len(seq) != SEQ_DIGITS
        or not (seq.isascii() and seq.isdigit())
        or len(offset) > 64
        or _FORBIDDEN.intersection(offset)
        or "." in epoch
    ):
        raise InvalidRequest(f"malformed offset {offset[:64]!r}: use -1, now, a "
                             "Stream-Next-Offset or a snapshot's cursor", field=field)
    return Cursor(epoch, int(seq))


def later(a: str | None, b: str | None) -> str | None:
    """The later of two offsets of one stream (text order is log order)."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def stream_cursor(now_unix: float, client: str | None, jitter_s: int) -> str:
    """The ``Stream-Cursor`` / ``streamCursor`` of a live response: the
    current interval, or — when the client's echoed cursor is not behind
    it — strictly past the client's (by ``jitter_s``, 1..3600 s)."""
    interval = int((now_unix - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if client is not None and client.isascii() and client.isdigit() and len(client) < 20:
        theirs = int(client)
        if theirs >= interval:
            return str(theirs + max(1, -(-jitter_s // CURSOR_INTERVAL_S)))
    return str(interval)


def json_array(frames: list[bytes]) -> bytes:
    """A JSON-mode body (PROTOCOL.md §9.1.5): the frames, one message each."""
    return b"[" + b",".join(frames) + b"]"


def data_event(frames: list[bytes]) -> bytes:
    """One SSE ``data`` event: the frames as a JSON array (one line: JSON
    text never holds a raw newline)."""
    return b"event: data\ndata: " + json_array(frames) + b"\n\n"


def control_event(next_offset: str, cursor: str, up_to_date: bool) -> bytes:
    """The SSE ``control`` event after every data event (PROTOCOL.md §5.8)."""
    body: dict[str, object] = {"streamNextOffset": next_offset, "streamCursor": cursor}
    if up_to_date:
        body["upToDate"] = True
    return b"event: control\ndata: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
