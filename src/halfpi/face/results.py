"""Typed values the SDK hands back: connection status and terminal results."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from halfpi.core import events
from halfpi.face.errors import FaceError

log = logging.getLogger("halfpi.face")

T = TypeVar("T")

# A command's type → the struct of its ``face.result`` ``data`` (docs/protocol.md §5).
RESULT_DATA: dict[str, type[events.Outbound]] = {
    "face.chat": events.ChatOutcome,
    "face.conversation.create": events.Created,
    "face.conversation.rename": events.Renamed,
    "face.conversation.list": events.ConversationPage,
    "face.conversation.messages": events.MessagePage,
    "face.chat.cancel": events.CancelOutcome,
    "face.run.cancel": events.CancelOutcome,
    "face.task.cancel": events.CancelOutcome,
    "face.approval.resolve": events.ApprovalOutcome,
    "face.approval.list": events.ApprovalPage,
    "face.task.list": events.TaskPage,
    "face.task.get": events.TaskView,
    "face.task.log": events.TaskLogPage,
    "face.hand.list": events.HandPage,
    "face.unsubscribe": events.Empty,
}


@dataclass(frozen=True, slots=True)
class Status:
    """What a status line shows; never claims more than the client knows.

    ``url`` is the Mind this is about (the one connected to, or the one whose
    attempt failed last); ``detail`` says why (the last failure while
    reconnecting, the refusal when refused); ``next_at`` is when the next
    attempt starts, on the client's monotonic clock, so a UI can count down
    (``remaining(now)``) instead of showing a number that never moves.
    """

    # connecting | live | reconnecting | resuming | resumed | resynced | refused | closed
    state: str
    attempt: int = 0
    next_in: float | None = None
    replayed: int = 0
    detail: str = ""
    url: str = ""
    next_at: float | None = None

    def remaining(self, now: float) -> float | None:
        """Seconds until the next attempt, as of ``now`` (never negative)."""
        if self.next_at is None:
            return self.next_in
        return max(0.0, self.next_at - now)

    def describe(self, now: float | None = None) -> str:
        if self.state == "reconnecting":
            left = self.next_in if now is None else self.remaining(now)
            nxt = f", next in {left:.1f} s" if left is not None else ""
            text = f"reconnecting (attempt {self.attempt}{nxt})"
            where = f" to {self.url}" if self.url else ""
            why = f": {self.detail}" if self.detail else ""
            return text + (f" — last try{where} failed{why}" if where or why else "")
        if self.state == "resuming":
            return "connected, catching up"
        if self.state == "resumed":
            return f"resumed: {self.replayed} events replayed"
        if self.state == "resynced":
            return "resynced from snapshot"
        if self.state == "refused":
            return f"refused: {self.detail}"
        return self.state


@dataclass(frozen=True, slots=True)
class Result:
    """A terminal ``face.result``. ``data`` is the command's typed outcome
    (:data:`RESULT_DATA`: a :class:`~halfpi.core.events.ChatOutcome` for a
    chat, a :class:`~halfpi.core.events.ConversationPage` for a list read …),
    :class:`~halfpi.core.events.Interrupted` when the Mind stopped while it
    ran, or None when the Mind sent none. ``reconciled``: learnt by reading
    the conversation after a reconnect, not from the Mind's answer (I6)."""

    request_id: str
    status: str
    content: str | None = None
    error_code: str | None = None
    data: Any = None
    reconciled: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def outcome(self, kind: type[T]) -> T:
        """``data`` as ``kind`` (``result.outcome(ChatOutcome).run_id``), or
        the :class:`~halfpi.face.errors.FaceError` saying it is not."""
        if not isinstance(self.data, kind):
            code = f" ({self.error_code})" if self.error_code else ""
            raise FaceError(f"{self.request_id} ended {self.status}{code} without {kind.__name__}")
        return self.data

    @classmethod
    def from_wire(cls, type_: str, result: events.Result) -> Result:
        """The result of a command of type ``type_``."""
        return cls(
            result.request_id,
            result.status,
            events.present(result.content),
            events.present(result.error_code),
            data_of(type_, result),
        )


def data_of(type_: str, result: events.Result) -> Any:
    """``result.data`` as the struct its command's type says; the tolerant
    reader takes what it can, and says what it could not."""
    raw = events.present(result.data)
    if raw is None:
        return None
    kinds = [RESULT_DATA[type_]] if type_ in RESULT_DATA else []
    if result.status == "interrupted":
        kinds.append(events.Interrupted)
    for kind in kinds:
        try:
            return msgspec.convert(raw, kind)
        except msgspec.ValidationError:
            continue
    log.warning("%s: result data not understood: %s", type_, sorted(raw) if isinstance(raw, dict)
                else type(raw).__name__)
    return None
