"""In-process journal (the embedded default).

Per conversation, a list of shared :class:`Message` objects in seq order
with a moving start offset (O(1) append, O(1) trim, O(k) reads from any
seq). Retention (DESIGN §4.2): keep the last ``events`` events or the last
``seconds`` seconds, whichever holds more, unless the per-conversation or
per-Mind byte bound is reached first. The epoch is new for every process:
when the Mind restarts the window is gone, and cursors from before say so.

The Mind-wide bound sheds the *globally oldest* events first, whatever
window holds them, in O(1) amortised per append: an age order across all
windows (one record per append, naming its window) is consumed from the
front. A window's own trimming leaves stale records behind; each window
counts its stale ones (always its oldest records), so the front skips them,
and the age order is compacted once stale records outnumber live ones. The
global bound may empty an idle window (its floor rises to its head: a
cursor at the head still resumes exactly, an older one gets
``cursor_expired``), but never drops the event just appended.

An entry leaves memory the moment it is shed: its slot is cleared at once,
and the slot lists are compacted once half of them are dead (amortised
O(1)). ``Message.size`` counts what a retained message really holds, so
``total_bytes`` is the memory the journal keeps alive.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

from halfpi.config import JournalLimits
from halfpi.core.ids import new_epoch
from halfpi.core.outbound import Message


class _Window:
    __slots__ = ("bytes", "epoch", "floor", "head", "items", "seqs", "stale", "start", "times")

    def __init__(self, epoch: str, head: int) -> None:
        self.epoch = epoch
        self.floor = head
        self.head = head
        self.items: list[Message | None] = []  # None: shed, awaiting compaction
        self.seqs: list[int] = []
        self.times: list[float] = []
        self.start = 0
        self.bytes = 0
        # This window's records at the front of the journal's age order that
        # name entries its own trimming already dropped.
        self.stale = 0

    def __len__(self) -> int:
        return len(self.items) - self.start

    def drop_oldest(self) -> int:
        index = self.start
        message = self.items[index]
        assert message is not None
        self.items[index] = None  # released now, not at the next compaction
        self.floor = self.seqs[index]
        self.start = index + 1
        self.bytes -= message.size
        if self.start * 2 > len(self.items):
            # At most as many slots are copied as were shed since the last
            # compaction: amortised O(1) per drop.
            del self.items[: self.start]
            del self.seqs[: self.start]
            del self.times[: self.start]
            self.start = 0
        return message.size


class MemoryJournal:
    def __init__(self, limits: JournalLimits | None = None) -> None:
        self.limits = limits or JournalLimits()
        self._windows: dict[str, _Window] = {}
        self.total_bytes = 0
        # Every append, oldest first, as the window it went to (DESIGN §4.2's
        # Mind-wide bound sheds from the front).
        self._age: deque[_Window] = deque()
        self._stale = 0  # records in _age whose entry a window already dropped
        # Records of the age order that trimming looked at: a metric, and what
        # the tests bound to prove trimming is O(1) amortised per append.
        self.windows_touched = 0

    def open(self, conversation_id: str, head: int) -> str:
        window = self._windows.get(conversation_id)
        if window is None:
            window = self._windows[conversation_id] = _Window(new_epoch(), head)
        return window.epoch

    def window(self, conversation_id: str) -> tuple[str, int, int]:
        w = self._windows[conversation_id]
        return w.epoch, w.floor, w.head

    def aged_entries(self) -> int:
        """Records in the Mind-wide age order, stale ones included (bounded:
        at most about twice the entries held)."""
        return len(self._age)

    def append(self, message: Message, now: float) -> None:
        assert message.conversation_id is not None
        w = self._windows[message.conversation_id]
        w.items.append(message)
        w.seqs.append(message.seq)
        w.times.append(now)
        w.head = message.seq
        w.bytes += message.size
        self._age.append(w)
        self.total_bytes += message.size
        limits = self.limits
        # Cheap test first: most appends are within every bound.
        if w.bytes > limits.bytes_per_conversation or len(w.items) - w.start > limits.events:
            self._trim(w, now)
        if self.total_bytes > limits.bytes_total:
            self._trim_global(w)

    def _trim(self, w: _Window, now: float) -> None:
        limits = self.limits
        horizon = now - limits.seconds
        dropped = 0
        while len(w) > 1 and (
            w.bytes > limits.bytes_per_conversation
            or (len(w) > limits.events and w.times[w.start] < horizon)
        ):
            self.total_bytes -= w.drop_oldest()
            dropped += 1
        if dropped:
            w.stale += dropped
            self._stale += dropped
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
        # Over the Mind-wide bound: shed the globally oldest events first; a
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
                return  # only the event just appended is left: keep it
            age.popleft()
            self.total_bytes -= w.drop_oldest()

    def read_after(self, conversation_id: str, seq: int, limit: int) -> list[Message] | None:
        w = self._windows[conversation_id]
        if seq < w.floor:
            return None
        index = bisect_right(w.seqs, seq, lo=w.start)
        return w.items[index : index + limit]  # type: ignore[return-value]  # all live past start
