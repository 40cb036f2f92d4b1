"""Per-connection outbound queue policy (DESIGN §4, §11, I7), with no I/O.

Messages are shared, pre-encoded :class:`Message` objects: an event is
encoded once and handed to every subscriber; only the per-connection
``event_seq`` is spliced in when a frame is written. The queue holds what
the transport could not take yet. Under pressure it

1. coalesces chat deltas of the same reply (lossless: the merged delta
   carries ``first_seq`` of the first and ``seq``/``cursor`` of the last),
2. drops droppable progress (a placeholder keeps its ``event_seq`` so the
   Face sees exactly where; the next progress of that call says ``gap``),
3. and if reliable messages still do not fit, asks to evict the connection
   (close 4008) after telling it, per conversation, the cursor of the last
   message actually written to it.

``event_seq`` is +1 for every message the queue emits or drops, in emission
order, starting at 1 on every connection.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import msgspec

from halfpi.core.limits import QueueLimits

RELIABLE = 0
DELTA = 1  # transient, coalescable
PROGRESS = 2  # transient, droppable

_encode = msgspec.json.encode


def frame_prefix(type_: str) -> bytes:
    return b'{"type":"' + type_.encode() + b'","payload":{"event_seq":'


_PREFIXES: dict[str, bytes] = {}


# What a retained message really holds, so that the journal's byte bounds
# bound memory (DESIGN §4.2): see Message.__post_init__.
_BYTES = sys.getsizeof(b"")  # a bytes object's header
_INT = 32  # an int past the small-int cache (seq, size), as allocated
# Per entry, a journal keeps three list slots, a float time stamp and an
# age record: its share of the memory, counted with the message.
ENTRY = 3 * 8 + 32 + 8
# A delta's body without its variable parts: '{"conversation_id":"","seq":,…}'.
_DELTA_JSON = 72
_STRUCT = 0  # the struct itself: measured once the class exists (below)
_INTS = 2 * _INT  # seq and size
_FIXED = _STRUCT + _INTS + ENTRY  # what every message counts (set again below)
_getsizeof = sys.getsizeof


def exact(body: bytes) -> bytes:
    """``body`` in a bytes object of its own size. msgspec returns its output
    buffer with up to 50 % spare capacity, which a retained message would
    keep alive unseen by every byte bound; a copy costs less than that."""
    return memoryview(body).tobytes()


def allocated(n: int) -> int:
    """Bytes an object of ``n`` bytes occupies: CPython's small-object
    allocator rounds to 16; larger objects carry a malloc header."""
    return (n + 15) & ~15 if n <= 512 else (n + 8 + 15) & ~15


class Message(msgspec.Struct, gc=False):
    """One Mind → Face message, shared by every connection it is sent to.

    ``body`` is the payload JSON without ``event_seq``; it is encoded lazily
    for coalesced deltas. Treat as immutable once queued anywhere.

    A msgspec struct with ``gc=False``: the journal keeps hundreds of
    thousands of these, and they hold no cycles, so the cyclic collector
    must not walk them (it made full collections cost ~80 ms).

    ``size`` is the memory the message keeps alive once it has been framed
    (the struct, its body and the cached frame tail — two copies of the
    payload —, its cursor, its text, its int fields, its summary variant)
    plus a journal entry's own share, each object rounded the way the
    allocator rounds it. Names shared by many messages (type, prefix,
    conversation and request ids) are not counted. A delta's body, encoded
    lazily, is estimated from its parts. Fixed at construction (and when
    the summary is attached, before the message is shared), so queue and
    journal accounting always balance.
    """

    type: str
    body: bytes | None
    kind: int = RELIABLE
    conversation_id: str | None = None
    seq: int = 0
    cursor: str | None = None
    request_id: str | None = None
    text: str | None = None
    first_seq: int = 0
    # Progress is dropped per stream (tool call); deltas merge per reply.
    stream: str | None = None
    # Derived in __post_init__:
    prefix: bytes = b""
    size: int = 0
    # What a summary-mode viewer gets instead (I9); None: the same message.
    summary: Message | None = None
    tail: bytes | None = None

    def __post_init__(self) -> None:
        # Runs for every message, a delta each time: allocated() and
        # exact() are inlined (the same arithmetic, fewer calls).
        type_ = self.type
        prefix = _PREFIXES.get(type_)
        if prefix is None:
            prefix = _PREFIXES[type_] = frame_prefix(type_)
        self.prefix = prefix
        if not self.first_seq:
            self.first_seq = self.seq
        body = self.body
        text = self.text
        cursor = self.cursor
        if body is not None:
            body = self.body = memoryview(body).tobytes()  # exact(body)
            payload = len(body)
        else:  # a delta, encoded on first use
            chars = 0 if text is None else len(text)
            payload = (
                _DELTA_JSON
                + len(self.conversation_id or "")
                + len(cursor or "")
                + len(self.request_id or "")
                + 20
                + (chars if text is None or text.isascii() else 4 * chars)
            )
        n = _BYTES + payload  # the body; the frame tail is one byte more
        size = (
            _FIXED
            + ((n + 15) & ~15 if n <= 512 else (n + 23) & ~15)  # body
            + ((n + 16) & ~15 if n < 512 else (n + 24) & ~15)  # frame tail
        )
        if cursor is not None:
            n = _getsizeof(cursor)
            size += (n + 15) & ~15 if n <= 512 else (n + 23) & ~15
        if text is not None:
            n = _getsizeof(text)
            size += (n + 15) & ~15 if n <= 512 else (n + 23) & ~15
        self.size = size

    def with_summary(self, summary: Message) -> None:
        """Attach what summary viewers get instead (I9); before sharing."""
        self.summary = summary
        self.size += summary.size

    def for_mode(self, detail_mode: str) -> Message | None:
        """This message as a viewer in ``detail_mode`` may see it (DESIGN §6):
        summary viewers get the downgraded variant and never see progress."""
        if detail_mode == "transparent":
            return self
        if self.kind == PROGRESS:
            return None
        return self.summary or self

    def encoded_body(self) -> bytes:
        if self.body is None:
            self.body = exact(delta_body(self))
        return self.body

    def frame(self, event_seq: int) -> bytes:
        """The frame for one connection: the shared bytes with its ``event_seq``
        spliced in (one formatting operation; the tail is computed once)."""
        tail = self.tail
        if tail is None:
            body = self.encoded_body()
            tail = self.tail = b"," + body[1:] + b"}" if len(body) > 2 else b"}}"
        return b"%b%d%b" % (self.prefix, event_seq, tail)


_STRUCT = allocated(sys.getsizeof(Message("", b"")))
_FIXED = _STRUCT + _INTS + ENTRY


def splice(prefix: bytes, event_seq: int, body: bytes) -> bytes:
    """The frame of a payload ``body`` (JSON without ``event_seq``) for one
    connection, made at once: what :meth:`Message.frame` makes, without
    caching a tail (for a message framed only once, such as a replayed one)."""
    if len(body) > 2:  # the body after its "{" (a slice: cheaper than a view when small)
        return b"%b%d,%b}" % (prefix, event_seq, body[1:])
    return b"%b%d}}" % (prefix, event_seq)


def message(type_: str, payload: dict[str, Any] | msgspec.Struct) -> Message:
    """A reliable message with no conversation position (accepted, result, error…)."""
    return Message(type_, _encode(payload))


class _DeltaBody(msgspec.Struct, omit_defaults=True):
    """A delta's payload without ``event_seq``: what the dict of these keys
    encodes to, in this order (a struct encodes faster than a dict);
    ``first_seq`` only on a coalesced delta."""

    conversation_id: str | None
    seq: int
    cursor: str | None
    request_id: str | None
    text: str | None
    first_seq: int = 0


def delta_body(m: Message) -> bytes:
    first_seq = m.first_seq if m.first_seq != m.seq else 0
    return _encode(_DeltaBody(m.conversation_id, m.seq, m.cursor, m.request_id, m.text, first_seq))


def merge_deltas(older: Message, newer: Message) -> Message:
    merged = Message(
        "face.chat.delta",
        None,
        kind=DELTA,
        conversation_id=older.conversation_id,
        seq=newer.seq,
        cursor=newer.cursor,
        request_id=older.request_id,
        text=(older.text or "") + (newer.text or ""),
        first_seq=older.first_seq,
    )
    return merged


class _Dropped:
    """Placeholder for a dropped message: consumes an ``event_seq``, writes nothing."""

    __slots__ = ()


DROPPED = _Dropped()


class OutboundQueue:
    """The bounded queue of one connection. Single-threaded; no clock needed."""

    __slots__ = (
        "_gaps",
        "_items",
        "_last_by_conversation",
        "coalesced",
        "event_seq",
        "evicted",
        "limits",
        "reliable_bytes",
        "reliable_count",
        "shed",
        "transient_bytes",
        "transient_count",
        "written_cursors",
    )

    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        self._items: deque[Message | _Dropped] = deque()
        self.reliable_count = 0
        self.reliable_bytes = 0
        self.transient_count = 0
        self.transient_bytes = 0
        self.event_seq = 0
        # For /metrics (mind/metrics.py): deltas merged, progress dropped,
        # evictions; counted only where that work is done, never per message.
        self.coalesced = self.shed = self.evicted = 0
        # conversation_id → cursor of the last message written (for face.evicted).
        self.written_cursors: dict[str, str] = {}
        # conversation_id → last queued message of it (coalescing may only
        # merge into the tail of a conversation, never reorder within one).
        self._last_by_conversation: dict[str, Message] = {}
        # streams whose progress was dropped: their next progress says gap.
        self._gaps: set[str] = set()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, m: Message, *, pressured: bool) -> bool:
        """Queue ``m``. Returns False if the connection must be evicted (I7)."""
        conv = m.conversation_id
        # Pressure: the transport is backed up, or this delta would not fit
        # the transient bound (a burst released at once by a commit). Either
        # way merging is lossless; evicting a healthy Face would not be.
        if m.kind == DELTA and conv is not None and (pressured or self._transient_full(m)):
            tail = self._last_by_conversation.get(conv)
            if tail is not None and tail.kind == DELTA and tail.request_id == m.request_id:
                if self._replace_tail(tail, merge_deltas(tail, m)):
                    self.coalesced += 1
                    return self._fits()
        self._items.append(m)
        if conv is not None:
            self._last_by_conversation[conv] = m
        self._account(m, +1)
        if m.kind != RELIABLE and (pressured or self._transient_over()):
            self._shed_progress()
        return self._fits()

    def _transient_full(self, m: Message) -> bool:
        limits = self.limits
        return (
            self.transient_count >= limits.transient_messages
            or self.transient_bytes + m.size > limits.transient_bytes
        )

    def _replace_tail(self, old: Message, new: Message) -> bool:
        # The tail of a conversation is usually the last item overall; search
        # backwards, bounded by the queue length (which is itself bounded).
        items = self._items
        for index in range(len(items) - 1, -1, -1):
            if items[index] is old:
                items[index] = new
                self._account(old, -1)
                self._account(new, +1)
                assert new.conversation_id is not None
                self._last_by_conversation[new.conversation_id] = new
                return True
        return False

    def _account(self, m: Message, sign: int) -> None:
        size = m.size  # fixed at construction, so accounting always balances
        if m.kind == RELIABLE:
            self.reliable_count += sign
            self.reliable_bytes += sign * size
        else:
            self.transient_count += sign
            self.transient_bytes += sign * size

    def _transient_over(self) -> bool:
        return (
            self.transient_count > self.limits.transient_messages
            or self.transient_bytes > self.limits.transient_bytes
        )

    def _shed_progress(self) -> None:
        """Drop the oldest progress messages until the transient bounds hold."""
        items = self._items
        index = 0
        while self._transient_over() and index < len(items):
            item = items[index]
            if isinstance(item, Message) and item.kind == PROGRESS:
                items[index] = DROPPED
                self.shed += 1
                self._account(item, -1)
                if item.stream is not None:
                    self._gaps.add(item.stream)
            index += 1

    def _fits(self) -> bool:
        limits = self.limits
        # A single message larger than a byte bound still fits an otherwise
        # empty queue: it can be written, so evicting for it helps no one.
        return (
            self.reliable_count <= limits.reliable_messages
            and (self.reliable_bytes <= limits.reliable_bytes or len(self._items) <= 1)
            and (not self._transient_over() or len(self._items) <= 1)
        )

    def take(self, budget: int) -> list[bytes]:
        """Pop up to ``budget`` bytes of frames (at least one), assigning ``event_seq``."""
        out: list[bytes] = []
        items = self._items
        spent = 0
        while items and spent < budget:
            item = items.popleft()
            self.event_seq += 1
            if isinstance(item, _Dropped):
                continue
            frame = self._emit(item)
            spent += len(frame)
            out.append(frame)
        if not items:
            self._last_by_conversation.clear()
        return out

    def _emit(self, m: Message) -> bytes:
        self._account(m, -1)
        conv = m.conversation_id
        if conv is not None:
            if self._last_by_conversation.get(conv) is m:
                del self._last_by_conversation[conv]
            if m.cursor is not None:
                self.written_cursors[conv] = m.cursor
        if m.kind == PROGRESS and m.stream in self._gaps:
            self._gaps.discard(m.stream)
            return _with_gap(m).frame(self.event_seq)
        return m.frame(self.event_seq)

    def emit_now(self, m: Message) -> bytes:
        """Frame ``m`` for immediate writing, bypassing the queue (which must be
        empty, so nothing is overtaken): the idle connection's fast path."""
        self.event_seq += 1
        conv = m.conversation_id
        if conv is not None and m.cursor is not None:
            self.written_cursors[conv] = m.cursor
        return m.frame(self.event_seq)

    def emit_body(self, prefix: bytes, body: bytes) -> bytes:
        """:meth:`emit_now` for a message that exists only as its frame prefix
        and payload body (a replayed journal entry: no :class:`Message` is
        made of it); the caller records the cursor it reached (:meth:`wrote`)."""
        self.event_seq += 1
        return splice(prefix, self.event_seq, body)

    def wrote(self, conversation_id: str, cursor: str) -> None:
        """The last message written of ``conversation_id`` had ``cursor``."""
        self.written_cursors[conversation_id] = cursor

    def evict(self) -> dict[str, str]:
        """Discard everything queued; return the cursors to resume from."""
        self.evicted += 1
        self._items.clear()
        self._last_by_conversation.clear()
        self.reliable_count = self.reliable_bytes = 0
        self.transient_count = self.transient_bytes = 0
        return dict(self.written_cursors)


def _with_gap(m: Message) -> Message:
    body = msgspec.json.decode(m.encoded_body())
    body["gap"] = True
    return Message(
        m.type,
        _encode(body),
        kind=m.kind,
        conversation_id=m.conversation_id,
        seq=m.seq,
        cursor=m.cursor,
        stream=m.stream,
    )
