"""Resume planning (DESIGN §4.2, I4): exact replay from a cursor, or a reset.

The journal covers the half-open window ``(floor, head]`` of one epoch. A
cursor inside it resumes exactly; anything else is told plainly why not.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from halfpi.core.cursor import Cursor


class ResetReason(enum.StrEnum):
    EPOCH_CHANGED = "epoch_changed"
    CURSOR_EXPIRED = "cursor_expired"
    UNKNOWN_CURSOR = "unknown_cursor"


@dataclass(frozen=True, slots=True)
class Exact:
    """Replay every event with ``seq > after_seq``, then go live."""

    after_seq: int


@dataclass(frozen=True, slots=True)
class Reset:
    reason: ResetReason


def plan_resume(cursor: Cursor, *, epoch: str, floor: int, head: int) -> Exact | Reset:
    """Decide how a Face holding ``cursor`` catches up.

    ``floor`` is the highest seq no longer (or never) in the journal: the
    journal holds every event in ``(floor, head]``.
    """
    if cursor.epoch != epoch:
        return Reset(ResetReason.EPOCH_CHANGED)
    if cursor.seq > head:
        return Reset(ResetReason.UNKNOWN_CURSOR)
    if cursor.seq < floor:
        return Reset(ResetReason.CURSOR_EXPIRED)
    return Exact(cursor.seq)
