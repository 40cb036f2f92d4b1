"""Typed values the SDK hands back: connection status and terminal results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    """A terminal ``face.result``."""

    request_id: str
    status: str
    content: str | None = None
    error_code: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    @classmethod
    def from_wire(cls, p: dict[str, Any]) -> Result:
        return cls(
            p["request_id"],
            p["status"],
            p.get("content"),
            p.get("error_code"),
            dict(p.get("data") or {}),
        )
