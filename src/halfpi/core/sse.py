"""The SSE codec (DESIGN §9, docs/protocol.md §17): resume tokens and events.

An SSE stream carries the frames a WebSocket carries, one per event:
``event:`` is the frame's type, ``data:`` the frame itself (the same JSON,
on one line: JSON text never holds a raw newline) and ``id:`` a **resume
token**: the cursor of every conversation of the stream, as far as this
event. A browser's EventSource sends the last one back (``Last-Event-ID``)
when it reconnects, so a stream resumes exactly where its reader stopped,
whichever event that was.

A token is opaque and compact: the cursors in the stream's own conversation
order (so conversation ids are not repeated), then ``~`` and a sealed part
in base64url — the version, an optional *grant* (who may reconnect with it
without a header, until when, in which detail mode: see
``docs/protocol.md`` §17.4) and a keyed BLAKE2b tag that binds it to the
principal, the stream's conversations and the grant (the cursors are
positions, not secrets: see :class:`Sealer`). A token that does not verify
(another principal's, other conversations, malformed, altered, made with
another key) does not open: the stream is then answered with a reset,
in-band, never an HTTP error.

Pure: no I/O, no clock (an expiry is a number the caller compares).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from halfpi.core.cursor import parse_cursor
from halfpi.errors import InvalidRequest

VERSION = "2"
SEAL = "~"  # between the cursors (plain) and the sealed part (base64url)
TAG_BYTES = 12  # 96 bits: a grant is a capability, forging one must not pay
MAX_TOKEN = 4096  # characters: a stream names at most 100 conversations
# Frame types that move a conversation's position: their cursor is where the
# reader stands once it has seen them.
POSITIONED = frozenset(
    {
        "face.event",
        "face.chat.delta",
        "face.chat.tool.progress",
        "face.run.progress",
        "face.snapshot",
        "face.reset",
    }
)
_TYPE_AT = len(b'{"type":"')


@dataclass(frozen=True, slots=True)
class Grant:
    """Who may reconnect with a token and no credential of their own: the
    principal a stream ticket was issued to, until ``expires_at`` (the
    Mind's clock, whole seconds), in ``detail_mode`` (docs/protocol.md §17.4)."""

    principal_id: str
    expires_at: int
    detail_mode: str


@dataclass(frozen=True, slots=True)
class Opened:
    cursors: dict[str, str]
    grant: Grant | None


def _tag(key: bytes, principal_id: str, conversations: tuple[str, ...], grant: str) -> bytes:
    scope = principal_id.encode() + b"\n" + ",".join(conversations).encode() + b"\n"
    mac = hashlib.blake2b(scope + grant.encode(), key=key[:64], digest_size=TAG_BYTES)
    return mac.digest()


def _grant_text(grant: Grant | None) -> str:
    return "" if grant is None else f"{grant.principal_id},{grant.expires_at},{grant.detail_mode}"


class Sealer:
    """Seals the tokens of one stream. The tag binds what must not be
    forged — the principal, the conversations, the grant — and is made
    (and encoded) once per grant; the cursors ride beside it in plain text,
    unsigned: they are positions, not secrets, and an altered one only
    moves where the stream resumes within what its principal may read
    anyway (the Mind plans it as any cursor). So an event's token costs a
    join, not a hash or an encoding."""

    __slots__ = ("_key", "_principal_id", "_sealed", "conversations")

    def __init__(self, key: bytes, principal_id: str, conversations: tuple[str, ...]) -> None:
        self._key = key
        self._principal_id = principal_id
        self.conversations = conversations
        self._sealed: dict[str, str] = {}

    def suffix(self, grant: Grant | None) -> str:
        """What follows the cursors in every token of ``grant``: ``~`` and
        the sealed part."""
        grant_text = _grant_text(grant)
        sealed = self._sealed.get(grant_text)
        if sealed is None:
            self._sealed.clear()  # one grant at a time
            tag = _tag(self._key, self._principal_id, self.conversations, grant_text)
            head = VERSION if not grant_text else VERSION + "|" + grant_text
            sealed = self._sealed[grant_text] = (
                SEAL + base64.urlsafe_b64encode(head.encode() + tag).rstrip(b"=").decode()
            )
        return sealed

    def seal(self, cursors: Mapping[str, str], grant: Grant | None) -> str:
        sealed = self.suffix(grant)
        conversations = self.conversations
        if len(conversations) == 1:
            return cursors.get(conversations[0], "") + sealed
        get = cursors.get
        return ",".join([get(c, "") for c in conversations]) + sealed


def seal_token(
    key: bytes,
    principal_id: str,
    conversations: tuple[str, ...],
    cursors: Mapping[str, str],
    grant: Grant | None,
) -> str:
    """The resume token of a stream of ``principal_id`` over
    ``conversations`` (its order), standing at ``cursors``."""
    return Sealer(key, principal_id, conversations).seal(cursors, grant)


def open_token(
    key: bytes, token: str, conversations: tuple[str, ...], principal_id: str | None
) -> Opened | None:
    """The cursors (and grant) of ``token`` for a stream of ``principal_id``
    over ``conversations``; with ``principal_id`` None, the token's grant
    names the principal (a token without one then does not open). None for
    anything that does not verify."""
    if not token or len(token) > MAX_TOKEN or not token.isascii():
        return None
    cursor_text, seal, sealed = token.rpartition(SEAL)
    if not seal:
        return None
    try:
        raw = base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) <= TAG_BYTES:
        return None
    head, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
    try:
        parts = head.decode().split("|")
    except UnicodeDecodeError:
        return None
    if parts[0] != VERSION or len(parts) not in (1, 2):
        return None
    grant = None
    if len(parts) == 2:
        fields = parts[1].split(",")
        if len(fields) != 3 or not (fields[1].isascii() and fields[1].isdigit()):
            return None
        grant = Grant(fields[0], int(fields[1]), fields[2])
    owner = principal_id if principal_id is not None else (grant and grant.principal_id)
    expected = _tag(key, owner, conversations, parts[1] if grant else "") if owner else b""
    if not owner or not hmac.compare_digest(tag, expected):
        return None
    texts = cursor_text.split(",")
    if len(texts) != len(conversations):
        return None
    cursors: dict[str, str] = {}
    for cid, text in zip(conversations, texts, strict=True):
        if not text:
            continue
        try:
            parse_cursor(text)
        except InvalidRequest:
            return None
        cursors[cid] = text
    return Opened(cursors, grant)


# -- frames and events -------------------------------------------------------------------


class _Conversation(msgspec.Struct):
    id: str


class _Snapshot(msgspec.Struct):
    cursor: str | None = None
    conversation: _Conversation | None = None


class _Position(msgspec.Struct):
    conversation_id: str | None = None
    cursor: str | None = None
    conversation: _Conversation | None = None
    snapshot: _Snapshot | None = None


class _Frame(msgspec.Struct):
    payload: _Position


_decode_position = msgspec.json.Decoder(_Frame).decode


def type_of(frame: bytes) -> str:
    """The type of a frame as the Mind encodes them (``{"type":"T",…``)."""
    return frame[_TYPE_AT : frame.index(b'"', _TYPE_AT)].decode()


_CID = b'"conversation_id":"'
_CURSOR = b'"cursor":"'
_SNAPSHOTS = frozenset({"face.snapshot", "face.reset"})


def position_of(frame: bytes, type_: str | None = None) -> tuple[str, str] | None:
    """``(conversation_id, cursor)`` a reader stands at once it has seen
    ``frame``: an event's own cursor, a snapshot's (alone or in a reset);
    None for a frame that moves no conversation."""
    type_ = type_ or type_of(frame)
    if type_ not in POSITIONED:
        return None
    if type_ not in _SNAPSHOTS:
        # Events, deltas and progress begin with conversation_id, seq, cursor
        # (ids and cursors need no escaping): read them where they are.
        start = frame.find(_CID)
        if start > 0:
            start += len(_CID)
            end = frame.index(b'"', start)
            at = frame.find(_CURSOR, end, end + 48)
            if at > 0:
                at += len(_CURSOR)
                return frame[start:end].decode(), frame[at : frame.index(b'"', at)].decode()
    p = _decode_position(frame).payload
    if p.snapshot is not None:
        cid, cursor = p.conversation_id, p.snapshot.cursor
    elif p.conversation is not None:
        cid, cursor = p.conversation.id, p.cursor
    else:
        cid, cursor = p.conversation_id, p.cursor
    if cid is None or cursor is None:
        return None
    return cid, cursor


def event_bytes(frame: bytes, type_: str, token: str) -> bytes:
    """One SSE event: the frame's type, the frame as data, the resume token."""
    return b"event: %b\ndata: %b\nid: %b\n\n" % (type_.encode(), frame, token.encode())


def retry_bytes(retry_ms: int) -> bytes:
    """The stream's first block: how long EventSource waits to reconnect."""
    return b"retry: %d\n\n" % retry_ms


PING = b": ping\n\n"


def ping_bytes(token: str | None = None, heartbeat_s: float | None = None) -> bytes:
    """A comment every heartbeat (proxies and readers see the stream alive);
    with ``token``, an ``id:`` alone, which moves a browser's Last-Event-ID
    without an event (a grant renewed while nothing happened). With
    ``heartbeat_s`` (a stream opened with ``?heartbeat=event``) the ping is
    also an event, ``face.heartbeat``, which a page's script can see (an
    EventSource hides comments) and so tell a silent stream from a dead one."""
    ping = PING if token is None else b": ping\nid: %b\n\n" % token.encode()
    if heartbeat_s is None:
        return ping
    frame = b'{"type":"face.heartbeat","payload":{"interval_s":%d}}' % round(heartbeat_s)
    return ping + b"event: face.heartbeat\ndata: " + frame + b"\n\n"
