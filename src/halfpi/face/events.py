"""What :class:`~halfpi.face.protocol.FaceProtocol` tells its driver.

Frozen values, drained in order with ``events_received()`` (websockets'
``events_received()``, h11's events): the driver turns them into futures
(:class:`Accepted`, :class:`Answered`, :class:`Failed`) and callbacks
(:class:`Updated` → ``on_update``, :class:`Received` → ``on_message``,
:class:`StatusChanged` → ``on_status``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halfpi.core import events as messages
from halfpi.face.errors import FaceError
from halfpi.face.results import Result, Status

# What a command ends with: a face.result, a snapshot (face.conversation.snapshot)
# or, for a subscribe, its acceptance.
Answer = Result | messages.Snapshot | messages.Accepted


@dataclass(frozen=True, slots=True)
class Accepted:
    """A caller's command was accepted (its first ``face.accepted``)."""

    request_id: str
    accepted: messages.Accepted


@dataclass(frozen=True, slots=True)
class Answered:
    """A caller's command ended: a :class:`Result`, a snapshot or an
    acceptance (a subscribe's)."""

    request_id: str
    value: Answer


@dataclass(frozen=True, slots=True)
class Failed:
    """A caller's command failed: refused by the Mind, outcome unknown…"""

    request_id: str
    error: FaceError


@dataclass(frozen=True, slots=True)
class Updated:
    """A view or a live list changed (``on_update(kind, conversation_id)``)."""

    kind: str
    conversation_id: str


@dataclass(frozen=True, slots=True)
class Received:
    """A message that is news for the caller (``on_message``): not a
    duplicate event, not a second acceptance, not the client's own read.
    ``payload`` is the message as it came, every field kept: the headless
    face prints it as its JSON line."""

    type: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StatusChanged:
    status: Status


Event = Accepted | Answered | Failed | Updated | Received | StatusChanged
