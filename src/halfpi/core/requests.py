"""The request registry's decisions (DESIGN §5, I5), with no I/O.

``(principal_id, request_id)`` admits at most once. Given what the Store
holds for that key — a record, a tombstone, or nothing — :func:`decide`
says whether a command is new, a replay of the same payload, or a conflict.
:func:`prunable` says which terminal records retention lets go (they leave a
tombstone behind so a late retry still never executes twice).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from halfpi.core.limits import RequestRetention
from halfpi.core.states import REQUEST

_encoder = msgspec.json.Encoder(order="sorted")


def payload_digest(type_: str, payload: Any) -> str:
    """sha256 of the canonical JSON ``{type, payload}`` (sorted keys, no spaces).

    ``payload`` is the decoded command struct (or plain data): two frames that
    differ only in whitespace, key order or an explicit default hash the same.
    """
    canonical = _encoder.encode({"type": type_, "payload": msgspec.to_builtins(payload)})
    return hashlib.sha256(canonical).hexdigest()


@dataclass(slots=True)
class RequestRecord:
    """One admitted command. ``result`` is the terminal ``face.result`` payload."""

    principal_id: str
    request_id: str
    type: str
    digest: str
    status: str
    created_at: float
    conversation_id: str | None = None
    run_id: str | None = None
    accepted: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    finished_at: float | None = None

    @property
    def terminal(self) -> bool:
        return self.result is not None

    def finish(self, result: dict[str, Any], now: float) -> None:
        """The record's outcome: ``accepted`` → ``result["status"]`` by the
        ``REQUEST`` table (once; anything else raises ``IllegalTransition``)."""
        self.status = REQUEST.check(self.status, str(result["status"]))
        self.result = result
        self.finished_at = now


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What remains of a pruned record: enough to answer a late retry."""

    principal_id: str
    request_id: str
    digest: str
    result: dict[str, Any]
    expires_at: float


class Decision(enum.Enum):
    NEW = "new"
    REPLAY = "replay"
    CONFLICT = "conflict"


def decide(existing: RequestRecord | Tombstone | None, digest: str) -> Decision:
    if existing is None:
        return Decision.NEW
    return Decision.REPLAY if existing.digest == digest else Decision.CONFLICT


@dataclass(frozen=True, slots=True)
class Finished:
    """A terminal record as retention sees it."""

    request_id: str
    finished_at: float


def prunable(finished: Iterable[Finished], now: float, retention: RequestRetention) -> list[str]:
    """Request ids of one principal's terminal records that retention releases.

    A terminal record is kept at least ``min_seconds``; past that, only the
    newest ``max_per_principal`` terminal records are kept. Accepted
    (non-terminal) records are never passed here and never pruned.
    """
    ordered = sorted(finished, key=lambda f: f.finished_at, reverse=True)
    keep_newest = retention.max_per_principal
    return [
        f.request_id
        for index, f in enumerate(ordered)
        if index >= keep_newest and now - f.finished_at >= retention.min_seconds
    ]


def replay_frames(record: RequestRecord | Tombstone) -> list[tuple[str, Mapping[str, Any]]]:
    """What a replay answers: the stored terminal result, or the original accepted."""
    if isinstance(record, Tombstone):
        return [("face.result", record.result)]
    if record.result is not None:
        return [("face.result", record.result)]
    return [("face.accepted", record.accepted)]
