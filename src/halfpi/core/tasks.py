"""Background tasks' rules (DESIGN §8), pure: no I/O, time and randomness passed in.

A task is admitted by the Mind through a durable outbox row with a
``delivery_id`` and delivered to a Hand, which records the id durably and
owns the task's state from then on:

- **Delivery** (:func:`judge_delivery`): a delivery id the Hand has never
  seen makes a task; the same id with the same payload is a redelivery,
  answered with the original receipt (``deduplicated``); the same id with
  another payload is ``delivery_conflict`` — never a second task.
- **Redelivery** (:func:`redelivery_delay`): an attempt the Hand did not
  acknowledge is tried again after 2 s * 2^n, capped at 30 s, ±25 % jitter;
  after 3 attempts the outbox row is ``dead`` (shown to Faces).
- **State**: :data:`halfpi.core.states.TASK` — ``queued → running →
  succeeded|failed|cancelled|timed_out|lost``, the first terminal state
  wins; a Hand that restarts marks what it had not finished ``lost``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from halfpi.core.states import TASK, TASK_TERMINAL

REDELIVERY_BASE_S = 2.0
REDELIVERY_CAP_S = 30.0
REDELIVERY_JITTER = 0.25  # ± this share of the delay
DELIVERY_ATTEMPTS = 3
# What a Hand keeps of a task's output, in its log file; beyond it the log
# says it was truncated and the task runs on.
LOG_BYTES = 8 * 1024 * 1024

_canonical = msgspec.json.Encoder(order="sorted")

Judgement = Literal["new", "duplicate", "conflict"]


def task_digest(tool: str, args: Any, timeout_s: float | None) -> str:
    """sha256 of what a delivery asks for (canonical JSON: key order and
    spacing do not matter), so a redelivery is told from a conflict."""
    value = {"tool": tool, "args": msgspec.to_builtins(args), "timeout_s": timeout_s}
    return "sha256:" + hashlib.sha256(_canonical.encode(value)).hexdigest()


def judge_delivery(known_digest: str | None, digest: str) -> Judgement:
    """What a Hand does with a delivery: ``known_digest`` is the digest the
    Hand recorded for this delivery id (None: never seen)."""
    if known_digest is None:
        return "new"
    return "duplicate" if known_digest == digest else "conflict"


def redelivery_delay(failed_attempts: int, draw: float) -> float | None:
    """Seconds to wait before the next attempt after ``failed_attempts``
    (≥ 1) attempts went unacknowledged; None once they are all spent (the
    row is then ``dead``). ``draw`` is uniform in [0, 1): the jitter."""
    if failed_attempts < 1:
        raise ValueError("a redelivery follows at least one attempt")
    if failed_attempts >= DELIVERY_ATTEMPTS:
        return None
    return answer_wait(failed_attempts, draw)


def answer_wait(attempts: int, draw: float) -> float:
    """How long the dispatcher waits for a receipt after its ``attempts``-th
    attempt (≥ 1) before the next — or, after the last, before the row is
    ``dead``: 2 s * 2^(n-1), capped at 30 s, ±25 % (``draw`` in [0, 1))."""
    if attempts < 1:
        raise ValueError("a wait follows at least one attempt")
    base: float = min(REDELIVERY_CAP_S, REDELIVERY_BASE_S * 2.0 ** (attempts - 1))
    return base * (1 + REDELIVERY_JITTER * (2 * draw - 1))


def is_terminal(state: str) -> bool:
    return state in TASK_TERMINAL


def settle(current: str, target: str) -> bool:
    """True when ``target`` applies to a task in ``current`` (the first
    terminal state wins; an illegal move raises)."""
    return TASK.first_terminal_wins(current, target)


@dataclass(frozen=True, slots=True)
class Receipt:
    """A Hand's answer to a delivery: the task it made (or had made)."""

    delivery_id: str
    task_id: str
    state: str
    deduplicated: bool
    received_at: float
