"""Predicates over the frames a raw Face client has seen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Frame = dict[str, Any]


def event(type_: str, **data: Any) -> Callable[[Frame], bool]:
    """A predicate: a ``face.event`` of ``type_`` whose data holds ``data``."""

    def match(frame: Frame) -> bool:
        if frame["type"] != "face.event" or frame["payload"]["type"] != type_:
            return False
        got = frame["payload"]["data"]
        return all(got.get(k) == v for k, v in data.items())

    return match


def events_of(frames: list[Frame], type_: str, **data: Any) -> list[Frame]:
    match = event(type_, **data)
    return [f for f in frames if match(f)]
