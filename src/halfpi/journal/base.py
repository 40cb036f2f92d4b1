"""The Journal seam: what exact resume needs from a hot window of events (DESIGN §4.2, I4).

A journal keeps, per conversation, the recent events — transient ones
included — as **serialised entries** (:class:`JournalEntry`): the bytes
every Face is sent, not the Mind's in-process objects, so that an entry can
be written to a Redis stream as it is (cluster mode, DESIGN §10) and a
replay can be served by any node. The Mind rebuilds shared
:class:`~halfpi.core.outbound.Message` values from entries when it replays
(:func:`message_of`).

The epoch (DESIGN §3) is the Store's: each conversation's is stored there.
The journal only says, when a conversation is opened, whether it still
holds continuity for that epoch — an in-process journal after a restart
does not, a Redis journal that kept its stream does — and names the epoch
to use; when that differs from the stored one the Mind writes it before any
cursor of it is shown.

Appends are called synchronously, in ``seq`` order, from the actor's
publication step (no extra hop on the hot path, I3); each returns None when
the entry is in the journal already (in-process) or a future that resolves
once it is (and every entry appended before it for that conversation). A
reader that must not miss an entry awaits it (``ConversationActor.journaled``).
Reads are coroutines.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import msgspec

from halfpi.core.outbound import Message, frame_prefix, splice


class JournalEntry(msgspec.Struct, frozen=True, gc=False):
    """One published message of a conversation, serialised.

    ``body`` is the payload JSON without ``event_seq`` (each connection
    splices its own), exactly as it was sent live; ``summary`` the body a
    summary-mode viewer gets where that differs (I9). ``kind`` is the
    queue class (``RELIABLE``, ``DELTA``, ``PROGRESS``), ``type`` the
    message type (``face.event``, ``face.chat.delta``…); ``request_id``
    (a delta's reply) and ``stream`` (a tool call's progress) are what a
    queue needs to coalesce and to mark gaps. ``ts``: when it was
    published, by the Mind's clock (time-based retention).

    ``gc=False``: it holds no cycles, and a journal keeps many of them."""

    seq: int
    kind: int
    type: str
    body: bytes
    ts: float
    summary: bytes | None = None
    request_id: str | None = None
    stream: str | None = None


def entry_of(message: Message, ts: float) -> JournalEntry:
    """The entry of a published message (its body shared, not copied)."""
    summary = message.summary
    return JournalEntry(
        message.seq,
        message.kind,
        message.type,
        message.encoded_body(),
        ts,
        None if summary is None else summary.encoded_body(),
        message.request_id,
        message.stream,
    )


_PREFIXES: dict[str, bytes] = {}


def prefix_of(type_: str) -> bytes:
    """The frame prefix of a message type (computed once per type)."""
    return _PREFIXES.get(type_) or _PREFIXES.setdefault(type_, frame_prefix(type_))


class Replayed(Message, gc=False):
    """A message rebuilt from a journal entry for one replay: written at once
    (a connection's flush pulls it when its transport takes writes), never
    queued or kept. So it is made cheaply — its body is the entry's, not
    copied, and its frame is formatted from the body directly, not cached —
    and its ``size`` is an estimate (it never enters a queue's accounting).
    A replay makes one per event it sends; a live message costs this once
    for all its subscribers."""

    def __post_init__(self) -> None:
        self.prefix = prefix_of(self.type)
        self.first_seq = self.seq
        self.size = 256 + 2 * len(self.body or b"")

    def frame(self, event_seq: int) -> bytes:
        body = self.body
        assert body is not None
        return splice(self.prefix, event_seq, body)


def message_of(conversation_id: str, epoch: str, entry: JournalEntry) -> Message:
    """The message an entry was made from, rebuilt to be sent again: it
    frames exactly as the one sent live (its summary variant too)."""
    seq = entry.seq
    cursor = f"{epoch}.{seq}"  # core.cursor.encode_cursor, inlined: once per replayed event
    message = Replayed(
        entry.type,
        entry.body,
        kind=entry.kind,
        conversation_id=conversation_id,
        seq=seq,
        cursor=cursor,
        request_id=entry.request_id,
        stream=entry.stream,
    )
    if entry.summary is not None:
        message.with_summary(
            Replayed(
                entry.type,
                entry.summary,
                kind=entry.kind,
                conversation_id=conversation_id,
                seq=seq,
                cursor=cursor,
                request_id=entry.request_id,
                stream=entry.stream,
            )
        )
    return message


@dataclass(frozen=True, slots=True)
class Window:
    """What the journal holds of one conversation: every entry in
    ``(floor, head]``, of ``epoch``.

    ``settled``: the window was dropped (an idle conversation unloaded) at
    this seq and re-opened there, so every event at or below it is committed
    in the Store and every chat among them had ended — their end events
    carry the full content. So a cursor of this epoch below ``floor`` is
    replayed from the Store up to ``floor``, exactly for committed events, as
    long as ``floor <= settled`` (nothing was trimmed since the window
    re-opened). 0 when the journal promises nothing of the kind."""

    epoch: str
    floor: int
    head: int
    settled: int = 0


class Journal(Protocol):
    async def open(self, conversation_id: str, epoch: str | None, head: int) -> str:
        """Start (or continue) the conversation's window; its last seq is
        ``head``, its stored epoch ``epoch`` (None: it never had one).
        Returns ``epoch`` when the journal still holds continuity for it,
        else a new epoch — which the Mind stores before showing any cursor."""
        ...

    def append(self, conversation_id: str, entry: JournalEntry) -> asyncio.Future[None] | None:
        """Add the next entry (called in seq order, from the publication
        step). None: it is in the journal already; else a future that
        resolves once it (and every earlier one of that conversation) is."""
        ...

    async def window(self, conversation_id: str) -> Window:
        """The conversation's window now (it must be open)."""
        ...

    async def read_after(
        self, conversation_id: str, seq: int, limit: int
    ) -> list[JournalEntry] | None:
        """Up to ``limit`` entries with seq > ``seq``, in order; None if
        ``seq`` fell below the floor (what followed it is gone)."""
        ...

    async def release(self, conversation_id: str) -> None:
        """The conversation was unloaded while idle (no chat, nothing
        pending, everything published in the Store): drop its window. Its
        epoch stays; opened again, the window starts empty at the head it
        is opened at, ``settled`` there."""
        ...
