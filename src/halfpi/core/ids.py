"""Identifier types (DESIGN §3) and their generation.

IDs are ``<prefix>_<12 hex of milliseconds><16 hex random>``: sortable by
creation time (so a page of conversations can use an id as its ``before``
key) and unguessable. Time is passed in; the core never reads the clock.
"""

from __future__ import annotations

import os
from typing import NewType

PrincipalId = NewType("PrincipalId", str)
ConversationId = NewType("ConversationId", str)
RequestId = NewType("RequestId", str)
RunId = NewType("RunId", str)
NodeId = NewType("NodeId", str)


def new_id(prefix: str, now: float) -> str:
    millis = int(now * 1000) & 0xFFFF_FFFF_FFFF
    return f"{prefix}_{millis:012x}{os.urandom(8).hex()}"


def new_conversation_id(now: float) -> ConversationId:
    return ConversationId(new_id("c", now))


def new_run_id(now: float) -> RunId:
    return RunId(new_id("r", now))


def new_principal_id(now: float) -> PrincipalId:
    return PrincipalId(new_id("p", now))


def new_node_id(now: float) -> NodeId:
    return NodeId(new_id("n", now))


def new_epoch() -> str:
    """A fresh journal epoch: short, random, never containing a dot."""
    return os.urandom(4).hex()
