"""Checks on what a Face received: positions, coverage and reply text.

A positioned message (``face.event`` or ``face.chat.delta``) covers the seqs
``first_seq..seq`` (``first_seq`` is present only on a coalesced delta).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

Frame = dict[str, Any]
POSITIONED = ("face.event", "face.chat.delta")
TERMINAL_EVENTS = ("chat.completed", "chat.failed", "chat.cancelled", "chat.interrupted")


def positioned(frames: Iterable[Frame], conversation_id: str | None = None) -> list[Frame]:
    return [
        f for f in frames
        if f["type"] in POSITIONED
        and (conversation_id is None or f["payload"]["conversation_id"] == conversation_id)
    ]


def span(frame: Frame) -> tuple[int, int]:
    payload = frame["payload"]
    return int(payload.get("first_seq", payload["seq"])), int(payload["seq"])


def covered_seqs(frames: Iterable[Frame]) -> list[int]:
    """Every seq the frames account for, in arrival order (duplicates kept)."""
    seqs: list[int] = []
    for frame in frames:
        first, last = span(frame)
        seqs.extend(range(first, last + 1))
    return seqs


def assert_contiguous(frames: list[Frame], first: int, last: int) -> None:
    """The frames cover exactly ``first..last``, in order, each seq once."""
    seqs = covered_seqs(frames)
    assert seqs, "no positioned frames"
    dupes = sorted(s for s, n in Counter(seqs).items() if n > 1)
    assert not dupes, f"duplicate seqs: {dupes[:10]}"
    assert seqs == list(range(first, last + 1)), (
        f"expected seqs {first}..{last} contiguous; got {len(seqs)} seqs from {seqs[0]} to "
        f"{seqs[-1]}, first gap after "
        f"{next((a for a, b in pairwise(seqs) if b != a + 1), None)}"
    )


def delta_text(frames: Iterable[Frame], request_id: str) -> str:
    return "".join(
        f["payload"]["text"] for f in frames
        if f["type"] == "face.chat.delta" and f["payload"]["request_id"] == request_id
    )


def is_terminal_event(frame: Frame, request_id: str | None = None) -> bool:
    return (
        frame["type"] == "face.event"
        and frame["payload"]["type"] in TERMINAL_EVENTS
        and (request_id is None or frame["payload"]["data"].get("request_id") == request_id)
    )


def is_event(frame: Frame, type_: str, request_id: str | None = None) -> bool:
    return (
        frame["type"] == "face.event"
        and frame["payload"]["type"] == type_
        and (request_id is None or frame["payload"]["data"].get("request_id") == request_id)
    )


def last_seq(frames: Iterable[Frame]) -> int:
    return max((span(f)[1] for f in frames), default=0)
