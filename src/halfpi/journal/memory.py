"""In-process journal (the embedded default).

Per conversation, a list of :class:`JournalEntry` values in seq order with
a moving start offset (O(1) append, O(1) trim, O(log n + k) reads from any
seq). Retention (DESIGN §4.2): keep the last ``events`` entries or the last
``seconds`` seconds, whichever holds more, unless the per-conversation or
per-Mind byte bound is reached first.

**Epoch.** One per journal, so one per process: a window of this journal is
continuous only within the process. :meth:`MemoryJournal.open` always names
the journal's own epoch; a conversation whose stored epoch is another one
(written by an earlier process) gets the new one stored by the Mind, and
cursors from before the restart say ``epoch_changed``. A conversation
unloaded while idle (:meth:`MemoryJournal.release`) keeps the epoch: opened
again, its window starts empty at its head, ``settled`` there (every chat
before it had ended, so the Store replays what came before exactly).

The Mind-wide bound sheds the *globally oldest* entries first, whatever
window holds them, in O(1) amortised per append: an age order across all
windows (one record per append, naming its window) is consumed from the
front. A window's own trimming (and its release) leaves stale records
behind; each window counts its stale ones (always its oldest records), so
the front skips them, and the age order is compacted once stale records
outnumber live ones. The global bound may empty an idle window (its floor
rises to its head: a cursor at the head still resumes exactly, an older
one gets ``cursor_expired``), but never drops the entry just appended.

An entry leaves memory the moment it is shed: its slot is cleared at once,
and the slot lists are compacted once half of them are dead (amortised
O(1)). :func:`entry_size` counts what a retained entry really holds, so
``total_bytes`` is the memory the journal keeps alive.
"""

from __future__ import annotations

import asyncio
import sys
from bisect import bisect_right
from collections import deque
from operator import attrgetter

from halfpi.config import JournalLimits
from halfpi.core.ids import new_epoch
from halfpi.core.outbound import allocated
from halfpi.journal.base import JournalEntry, Window

_BYTES = sys.getsizeof(b"")  # a bytes object's header
# The entry struct, its seq (an int past the small-int cache) and its time
# stamp (a float), as allocated; its slot in the window's list and its
# record in the age order. Names shared by many entries (type, request and
# tool call ids) are not counted.
_FIXED = (
    allocated(sys.getsizeof(JournalEntry(0, 0, "", b"", 0.0)))
    + allocated(sys.getsizeof(2**20))
    + allocated(sys.getsizeof(0.5))
    + 2 * 8
)

_seq = attrgetter("seq")


def entry_size(entry: JournalEntry) -> int:
    """The memory a retained entry keeps alive: the struct, its body (and
    summary body), its seq and time stamp, its share of the journal's lists."""
    summary = entry.summary
    return (
        _FIXED
        + allocated(_BYTES + len(entry.body))
        + (0 if summary is None else allocated(_BYTES + len(summary)))
    )


class _Window:
    __slots__ = ("bytes", "floor", "head", "items", "settled", "stale", "start")

    def __init__(self, head: int) -> None:
        self.floor = head
        self.head = head
        self.settled = head
        self.items: list[JournalEntry | None] = []  # None: shed, awaiting compaction
        self.start = 0
        self.bytes = 0
        # This window's records at the front of the journal's age order that
        # name entries its own trimming (or its release) already dropped.
        self.stale = 0

    def __len__(self) -> int:
        return len(self.items) - self.start

    def drop_oldest(self) -> int:
        index = self.start
        entry = self.items[index]
        assert entry is not None
        self.items[index] = None  # released now, not at the next compaction
        self.floor = entry.seq
        self.start = index + 1
        size = entry_size(entry)
        self.bytes -= size
        if self.start * 2 > len(self.items):
            # At most as many slots are copied as were shed since the last
            # compaction: amortised O(1) per drop.
            del self.items[: self.start]
            self.start = 0
        return size


class MemoryJournal:
    def __init__(self, limits: JournalLimits | None = None) -> None:
        self.limits = limits or JournalLimits()
        self.epoch = new_epoch()
        self._windows: dict[str, _Window] = {}
        self.total_bytes = 0
        # Every append, oldest first, as the window it went to (DESIGN §4.2's
        # Mind-wide bound sheds from the front).
        self._age: deque[_Window] = deque()
        self._stale = 0  # records in _age whose entry a window already dropped
        # Records of the age order that trimming looked at: a metric, and what
        # the tests bound to prove trimming is O(1) amortised per append.
        self.windows_touched = 0

    # -- the Journal Protocol ------------------------------------------------------

    async def open(self, conversation_id: str, epoch: str | None, head: int) -> str:
        """This journal's epoch, whatever ``epoch`` was: if it was this
        journal's own, the window is continuous (after a release it restarts
        empty at ``head``); if not, an earlier process held it and the Mind
        stores the new one."""
        return self.open_now(conversation_id, head)

    def append(self, conversation_id: str, entry: JournalEntry) -> asyncio.Future[None] | None:
        w = self._windows[conversation_id]
        w.items.append(entry)
        w.head = entry.seq
        size = entry_size(entry)
        w.bytes += size
        self._age.append(w)
        self.total_bytes += size
        limits = self.limits
        # Cheap test first: most appends are within every bound. Past the
        # count, only an oldest entry older than the time bound can go (a fast
        # stream holds more than ``events`` for ``seconds``: no call per append).
        if w.bytes > limits.bytes_per_conversation or (
            len(w.items) - w.start > limits.events
            and w.items[w.start].ts < entry.ts - limits.seconds  # type: ignore[union-attr]
        ):
            self._trim(w, entry.ts)
        if self.total_bytes > limits.bytes_total:
            self._trim_global(w)
        return None  # in the journal already

    async def window(self, conversation_id: str) -> Window:
        return self.window_now(conversation_id)

    async def read_after(
        self, conversation_id: str, seq: int, limit: int
    ) -> list[JournalEntry] | None:
        return self.read_after_now(conversation_id, seq, limit)

    async def release(self, conversation_id: str) -> None:
        w = self._windows.pop(conversation_id, None)
        if w is None:
            return
        # Its records in the age order all name dropped entries now.
        held = len(w)
        w.stale += held
        self._stale += held
        self.total_bytes -= w.bytes
        w.items.clear()
        w.start = w.bytes = 0
        self._maybe_compact()

    # -- the same, synchronously (an in-process journal completes at once) ------------

    def open_now(self, conversation_id: str, head: int) -> str:
        window = self._windows.get(conversation_id)
        if window is None:
            self._windows[conversation_id] = _Window(head)
        elif head > window.head:
            window.head = head  # seqs reserved by an earlier holder, never shown
        return self.epoch

    def window_now(self, conversation_id: str) -> Window:
        w = self._windows[conversation_id]
        return Window(self.epoch, w.floor, w.head, w.settled)

    def read_after_now(
        self, conversation_id: str, seq: int, limit: int
    ) -> list[JournalEntry] | None:
        w = self._windows[conversation_id]
        if seq < w.floor:
            return None
        index = bisect_right(w.items, seq, lo=w.start, key=_seq)
        return w.items[index : index + limit]  # type: ignore[return-value]  # all live past start

    def holds(self, conversation_id: str) -> bool:
        """True while the conversation's window is open (loaded, not released)."""
        return conversation_id in self._windows

    def open_windows(self) -> int:
        return len(self._windows)

    def aged_entries(self) -> int:
        """Records in the Mind-wide age order, stale ones included (bounded:
        at most about twice the entries held)."""
        return len(self._age)

    # -- retention -----------------------------------------------------------------------

    def _trim(self, w: _Window, now: float) -> None:
        limits = self.limits
        horizon = now - limits.seconds
        dropped = 0
        while len(w) > 1 and (
            w.bytes > limits.bytes_per_conversation
            or (len(w) > limits.events and w.items[w.start].ts < horizon)  # type: ignore[union-attr]
        ):
            self.total_bytes -= w.drop_oldest()
            dropped += 1
        if dropped:
            w.stale += dropped
            self._stale += dropped
            self._maybe_compact()

    def _maybe_compact(self) -> None:
        if self._stale > 64 and self._stale * 2 > len(self._age):
            self._compact_age()

    def _compact_age(self) -> None:
        """Drop every stale record: O(records), run once stale ones are the
        majority, so amortised O(1) per drop. A window's stale records are
        its oldest ones, so they are the first of its records met here."""
        fresh: deque[_Window] = deque()
        for w in self._age:
            if w.stale:
                w.stale -= 1
            else:
                fresh.append(w)
        self.windows_touched += len(self._age)
        self._age = fresh
        self._stale = 0

    def _trim_global(self, newest: _Window) -> None:
        # Over the Mind-wide bound: shed the globally oldest entries first; a
        # cursor into what is shed gets cursor_expired (I4).
        age = self._age
        bound = self.limits.bytes_total
        while self.total_bytes > bound:
            w = age[0]
            self.windows_touched += 1
            if w.stale:
                w.stale -= 1
                self._stale -= 1
                age.popleft()
                continue
            if w is newest and len(w) == 1:
                return  # only the entry just appended is left: keep it
            age.popleft()
            self.total_bytes -= w.drop_oldest()
