"""The background tasks' outbox as both backends store it (DESIGN §8,
docs/hands.md): the ``tasks`` table's columns, the SQL lists of states drawn
from the outbox's state table (``core.states.OUTBOX``), and the mapping
between rows and :class:`~halfpi.store.base.TaskRow`.

The database itself guards every change of state: a CHECK admits only the
table's states, and a trigger refuses a move the table does not allow and
any other state once the task is terminal (I10). The lists are drawn from
the table here, sorted, so the schema text is the same on every run; a
change of the table is a change of the schema (a new schema version).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from halfpi.core.states import OUTBOX
from halfpi.store.base import TaskRow, TaskUpdate

__all__ = [
    "ALLOWED_MOVES",
    "DEAD",
    "FIELDS",
    "MOVE_REFUSAL",
    "OPEN_STATES",
    "STATES",
    "TERMINAL_STATES",
    "UPDATED_FIELDS",
    "row_params",
    "set_clause",
    "task_from_row",
    "update_params",
]

_encode = msgspec.json.encode
_decode = msgspec.json.decode


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in sorted(values))


# SQL lists, e.g. "'queued', 'running'".
STATES = _sql_list(list(OUTBOX.states))
TERMINAL_STATES = _sql_list([s for s in OUTBOX.states if OUTBOX.is_terminal(s)])
OPEN_STATES = _sql_list([s for s in OUTBOX.states if not OUTBOX.is_terminal(s)])
# Every move the table allows, as 'from>to'.
ALLOWED_MOVES = _sql_list(
    [f"{source}>{target}" for source, targets in OUTBOX.transitions.items() for target in targets]
)

# The state of a task no Hand ever acknowledged and the outbox gave up on:
# refused, like a move the table does not allow, once a Hand has the task
# (``delivered_at`` set) — from then on the Hand is the authority.
DEAD = "dead"
assert DEAD in OUTBOX.states and OUTBOX.is_terminal(DEAD)

# The refusal of a move the table does not allow (not an outcome: a bug).
MOVE_REFUSAL = "halfpi: a task cannot make this move (core.states.OUTBOX)"

# The columns, in TaskRow's order.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TaskRow))

_JSON = frozenset({"args", "answer"})
_BOOL = frozenset({"approved", "log_truncated"})

# TaskUpdate's fields, each with how it changes its column:
#   "outcome": set while the task is open, frozen once it is terminal
#   "first":   the first value given stays
#   "last":    the last value given replaces it
UPDATED_FIELDS: tuple[tuple[str, str], ...] = (
    ("state", "last"),  # the trigger guards it
    ("attempts", "outcome"),
    ("next_attempt_at", "outcome"),
    ("delivered_at", "first"),
    ("hand_task_id", "first"),
    ("answer", "last"),
    ("started_at", "outcome"),
    ("ended_at", "outcome"),
    ("exit_code", "outcome"),
    ("error", "outcome"),
    ("log_bytes", "outcome"),
    ("log_truncated", "outcome"),
)
assert {f.name for f in dataclasses.fields(TaskUpdate)} == {
    "task_id",
    "at",
    *(name for name, _ in UPDATED_FIELDS),
}


def set_clause(mark: Callable[[str], str]) -> str:
    """The SET list of the update, ``mark(name)`` giving each parameter's
    placeholder (``updated_at`` takes ``mark("at")``). Every expression
    reads the row as it was, so "terminal" means terminal before this update."""
    terminal = f"state IN ({TERMINAL_STATES})"
    parts = []
    for name, kept in UPDATED_FIELDS:
        given = mark(name)
        if kept == "outcome":
            parts.append(
                f"{name} = CASE WHEN {terminal} THEN {name} ELSE COALESCE({given}, {name}) END"
            )
        elif kept == "first":
            parts.append(f"{name} = COALESCE({name}, {given})")
        else:
            parts.append(f"{name} = COALESCE({given}, {name})")
    parts.append(f"updated_at = {mark('at')}")
    return ", ".join(parts)


def row_params(task: TaskRow) -> tuple[Any, ...]:
    """The row's values in :data:`FIELDS` order, JSON encoded where it is JSON."""
    values = []
    for name in FIELDS:
        value = getattr(task, name)
        if name in _JSON:
            value = None if value is None else _encode(value).decode()
        values.append(value)
    return tuple(values)


def update_params(update: TaskUpdate) -> dict[str, Any]:
    """The update's values by name (``task_id``, ``at`` and each field)."""
    values: dict[str, Any] = {"task_id": update.task_id, "at": update.at}
    for name, _ in UPDATED_FIELDS:
        value = getattr(update, name)
        if name in _JSON:
            value = None if value is None else _encode(value).decode()
        values[name] = value
    return values


def task_from_row(row: Sequence[Any]) -> TaskRow:
    values: dict[str, Any] = {}
    for name, value in zip(FIELDS, row, strict=True):
        if value is not None and name in _JSON:
            value = _decode(value)
        elif value is not None and name in _BOOL:
            value = bool(value)
        values[name] = value
    return TaskRow(**values)
