"""The Journal Protocol: what exact resume needs from a hot window of events."""

from __future__ import annotations

from typing import Protocol

from halfpi.core.outbound import Message


class Journal(Protocol):
    def open(self, conversation_id: str, head: int) -> str:
        """Start (or continue) the window of a conversation whose last seq is
        ``head``; returns the epoch its cursors carry."""
        ...

    def append(self, message: Message, now: float) -> None: ...

    def window(self, conversation_id: str) -> tuple[str, int, int]:
        """``(epoch, floor, head)``: the journal holds every event in ``(floor, head]``."""
        ...

    def read_after(self, conversation_id: str, seq: int, limit: int) -> list[Message] | None:
        """Up to ``limit`` events with seq > ``seq``; None if ``seq`` fell below the floor."""
        ...
