"""The Mind API of the Hand link (DESIGN §9): what a Hand's messages mean.

The Hand transport (``gateway/hand_session.py``) only decodes frames,
authenticates the Hand (``hand.hello``) and keeps its connection alive;
then it calls :func:`welcome` once and :func:`handle` for every message.
What the Hand is told and where its messages go is decided here, so that
any other door for Hands (a cluster node, a test link) reuses it — the
Faces' :mod:`halfpi.mind.api` is the same idea for the other link.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from halfpi.core.hand_wire import (
    HandChecked,
    HandHello,
    HandMessage,
    HandPing,
    HandPong,
    HandProgress,
    HandResult,
    HandStarted,
    HandTaskLogPage,
    HandTaskReceipt,
    HandTaskRefused,
    HandTaskUpdate,
    HandWelcome,
)
from halfpi.mind.hands import HandLink

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

# What the Mind speaks of besides runs: a Hand re-announces its background
# tasks after every (re)connect to a Mind that lists ``tasks`` (docs/hands.md).
FEATURES = ("tasks",)

Handler = Callable[["Mind", HandLink, Any], None]


def welcome(mind: Mind, link: HandLink, hello: HandHello, principal_id: str) -> HandWelcome:
    """Bind an authenticated Hand (:class:`~halfpi.mind.hands.HandInUse`
    while another live link holds it) and say all it is told: its runs
    adopted or to abandon, the paths it must protect like its own — the
    Mind's home and credentials (DESIGN §8) — and the features."""
    runs = mind.hands.connect(link, hello, principal_id)
    protect = [str(p.resolve()) for p in mind.config.private_paths]
    return msgspec.structs.replace(runs, protect=protect, features=list(FEATURES))


def handle(mind: Mind, link: HandLink, message: HandMessage) -> None:
    """Route one message of an authenticated Hand: a run's to the Hand
    registry (with the link it came by: its generation is checked there),
    a background task's to the task outbox (by the Hand's label)."""
    handler = HANDLERS.get(type(message))
    if handler is not None:  # a second hand.hello: the link is already bound
        handler(mind, link, message)


def _result(mind: Mind, link: HandLink, message: HandResult) -> None:
    mind.hands.on_result(link, message)


def _progress(mind: Mind, link: HandLink, message: HandProgress) -> None:
    mind.hands.on_progress(link, message)


def _started(mind: Mind, link: HandLink, message: HandStarted) -> None:
    mind.hands.on_started(link, message)


def _checked(mind: Mind, link: HandLink, message: HandChecked) -> None:
    mind.hands.on_checked(link, message)


def _task_update(mind: Mind, link: HandLink, message: HandTaskUpdate) -> None:
    mind.tasks.on_update(link.hand_id or "", message)


def _task_receipt(mind: Mind, link: HandLink, message: HandTaskReceipt) -> None:
    mind.tasks.on_receipt(link.hand_id or "", message)


def _task_refused(mind: Mind, link: HandLink, message: HandTaskRefused) -> None:
    mind.tasks.on_refused(link.hand_id or "", message)


def _task_log_page(mind: Mind, link: HandLink, message: HandTaskLogPage) -> None:
    mind.tasks.on_log_page(link.hand_id or "", message)


def _ping(mind: Mind, link: HandLink, message: HandPing) -> None:
    link.send(HandPong())


HANDLERS: dict[type[HandMessage], Handler] = {
    HandResult: _result,
    HandProgress: _progress,
    HandStarted: _started,
    HandChecked: _checked,
    HandTaskUpdate: _task_update,
    HandTaskReceipt: _task_receipt,
    HandTaskRefused: _task_refused,
    HandTaskLogPage: _task_log_page,
    HandPing: _ping,
}
