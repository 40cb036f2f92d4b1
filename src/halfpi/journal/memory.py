"""In-process journal (the embedded default).

Per conversation, a list of shared :class:`Message` objects in seq order
with a moving start offset (O(1) append, O(1) trim, O(k) reads from any
seq). Retention (DESIGN §4.2): keep the last ``events`` events or the last
``seconds`` seconds, whichever holds more, unless the per-conversation or
per-Mind byte bound is reached first. The epoch is new for every process:
when the Mind restarts the window is gone, and cursors from before say so.
"""

from __future__ import annotations

from bisect import bisect_right

from halfpi.config import JournalLimits
from halfpi.core.ids import new_epoch
from halfpi.core.outbound import Message


class _Window:
    __slots__ = ("bytes", "epoch", "floor", "head", "items", "seqs", "start", "times")

    def __init__(self, epoch: str, head: int) -> None:
        self.epoch = epoch
        self.floor = head
        self.head = head
        self.items: list[Message] = []
        self.seqs: list[int] = []
        self.times: list[float] = []
        self.start = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.items) - self.start

    def drop_oldest(self) -> int:
        index = self.start
        message = self.items[index]
        self.floor = self.seqs[index]
        self.start += 1
        self.bytes -= message.size
        if self.start > 1024 and self.start * 2 > len(self.items):
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

    def open(self, conversation_id: str, head: int) -> str:
        window = self._windows.get(conversation_id)
        if window is None:
            window = self._windows[conversation_id] = _Window(new_epoch(), head)
        return window.epoch

    def window(self, conversation_id: str) -> tuple[str, int, int]:
        w = self._windows[conversation_id]
        return w.epoch, w.floor, w.head

    def append(self, message: Message, now: float) -> None:
        assert message.conversation_id is not None
        w = self._windows[message.conversation_id]
        w.items.append(message)
        w.seqs.append(message.seq)
        w.times.append(now)
        w.head = message.seq
        w.bytes += message.size
        self.total_bytes += message.size
        limits = self.limits
        # Cheap test first: most appends are within every bound.
        if w.bytes > limits.bytes_per_conversation or len(w.items) - w.start > limits.events:
            self._trim(w, now)
        if self.total_bytes > limits.bytes_total:
            self._trim_global(now)

    def _trim(self, w: _Window, now: float) -> None:
        limits = self.limits
        horizon = now - limits.seconds
        while len(w) > 1 and (
            w.bytes > limits.bytes_per_conversation
            or (len(w) > limits.events and w.times[w.start] < horizon)
        ):
            self.total_bytes -= w.drop_oldest()

    def _trim_global(self, now: float) -> None:
        # Over the Mind-wide bound: shed the oldest events of the largest
        # windows first; a cursor into what is shed gets cursor_expired.
        for w in sorted(self._windows.values(), key=lambda w: w.bytes, reverse=True):
            while len(w) > 1 and self.total_bytes > self.limits.bytes_total:
                self.total_bytes -= w.drop_oldest()
            if self.total_bytes <= self.limits.bytes_total:
                return

    def read_after(self, conversation_id: str, seq: int, limit: int) -> list[Message] | None:
        w = self._windows[conversation_id]
        if seq < w.floor:
            return None
        index = bisect_right(w.seqs, seq, lo=w.start)
        return w.items[index : index + limit]
