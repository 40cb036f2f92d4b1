"""The Mind's messages as the SDK reads them: the Mind's own structs
(``core/events.py``), decoded by the tolerant reader they define.

A frame is parsed once into its ``type`` and its plain ``payload`` (kept:
``on_message`` and the headless face show a message exactly as it came);
the session-level messages the SDK acts on are then read as structs —
``face.welcome``, ``face.accepted``, ``face.result``, ``face.error``,
``face.snapshot``, ``face.reset`` and the live lists' news. A conversation's
``face.event`` / ``face.chat.delta`` is the view's to read
(:meth:`~halfpi.face.view.ConversationView.apply`).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from halfpi.core.events import Accepted, Error, Outbound, Reset, Result, Snapshot, Welcome
from halfpi.face.lists import NEWS

Payload = dict[str, Any]

SESSION: dict[str, type[Outbound]] = {
    "face.accepted": Accepted,
    "face.result": Result,
    "face.error": Error,
    "face.snapshot": Snapshot,
    "face.reset": Reset,
    **NEWS,
}

# What a face.error that leaves something out is read as (a tolerant reader).
ERROR_DEFAULTS: Payload = {"code": "internal_error", "message": "", "retryable": False}


class Welcomed(Welcome, frozen=True, kw_only=True):
    """``face.welcome`` with the ``event_seq`` its connection numbered it with:
    where the count of that connection's messages starts (DESIGN §4.2)."""

    event_seq: int = 1


class Malformed(ValueError):
    """A frame that is not what its type says: the Mind's bug, logged and skipped."""


def frame_of(text: str | bytes) -> tuple[str, Payload]:
    """A frame's ``type`` and plain ``payload`` (``{}`` when it has none)."""
    try:
        frame = json.loads(text)
    except ValueError:
        raise Malformed("not JSON") from None
    if not isinstance(frame, dict):
        raise Malformed("not a JSON object")
    payload = frame.get("payload")
    return str(frame.get("type", "")), payload if isinstance(payload, dict) else {}


def read(type_: str, payload: Payload) -> Any:
    """The struct of a session-level message (:data:`SESSION`)."""
    kind = SESSION[type_]
    body = {**ERROR_DEFAULTS, **payload} if kind is Error else payload
    try:
        return msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        raise Malformed(f"{type_}: {exc}") from None


def error_of(payload: Payload) -> Error:
    error: Error = read("face.error", payload)
    return error


def welcome_of(payload: Payload) -> Welcomed:
    try:
        return msgspec.convert(payload, Welcomed)
    except msgspec.ValidationError as exc:
        raise Malformed(f"face.welcome: {exc}") from None
