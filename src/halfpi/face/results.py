"""Typed values the SDK hands back: connection status and terminal results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Status:
    """What a status line shows; never claims more than the client knows."""

    # connecting | live | reconnecting | resuming | resumed | resynced | refused | closed
    state: str
    attempt: int = 0
    next_in: float | None = None
    replayed: int = 0
    detail: str = ""

    def describe(self) -> str:
        if self.state == "reconnecting":
            nxt = f", next in {self.next_in:.1f} s" if self.next_in is not None else ""
            return f"reconnecting (attempt {self.attempt}{nxt})"
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
