"""Resume planning (DESIGN §4.2, I4): exact replay from a cursor, or a reset.

The journal covers the half-open window ``(floor, head]`` of one epoch. A
cursor inside it resumes exactly. Below the floor of a window that was
dropped while its conversation was idle and re-opened at ``settled`` (an
unloaded conversation, loaded again), the Store holds every committed event
and every chat among them had ended, its end event carrying the full
content: the committed events up to the floor replay from the Store, exactly
for committed events, then the journal. Anything else is told plainly why not.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from halfpi.core.cursor import Cursor

# The epoch of a cursor that stands for "somewhere I cannot say": never a
# real epoch (those are 8 hex digits), so it always resets as unknown. An SSE
# resume token that does not verify resumes from it (docs/protocol.md §17).
UNPLACED_EPOCH = "?"


class ResetReason(enum.StrEnum):
    EPOCH_CHANGED = "epoch_changed"
    CURSOR_EXPIRED = "cursor_expired"
    UNKNOWN_CURSOR = "unknown_cursor"


@dataclass(frozen=True, slots=True)
class Exact:
    """Replay every event with ``seq > after_seq``, then go live. With
    ``committed_until``: the committed events up to it come from the Store (the
    journal no longer holds them), then the journal's after it."""

    after_seq: int
    committed_until: int | None = None


@dataclass(frozen=True, slots=True)
class Reset:
    reason: ResetReason


def plan_resume(
    cursor: Cursor, *, epoch: str, floor: int, head: int, settled: int = 0
) -> Exact | Reset:
    """Decide how a Face holding ``cursor`` catches up.

    ``floor`` is the highest seq no longer (or never) in the journal: the
    journal holds every event in ``(floor, head]``. ``settled``: the window
    re-opened there after it was dropped with its conversation idle (0:
    never); while ``floor`` has not moved past it, the Store replays what
    lies below the floor.
    """
    if cursor.epoch == UNPLACED_EPOCH:
        return Reset(ResetReason.UNKNOWN_CURSOR)
    if cursor.epoch != epoch:
        return Reset(ResetReason.EPOCH_CHANGED)
    if cursor.seq > head:
        return Reset(ResetReason.UNKNOWN_CURSOR)
    if cursor.seq >= floor:
        return Exact(cursor.seq)
    if floor <= settled:
        return Exact(cursor.seq, committed_until=floor)
    return Reset(ResetReason.CURSOR_EXPIRED)
