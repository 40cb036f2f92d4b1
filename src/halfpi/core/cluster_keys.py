"""The names of everything halfpi keeps in Redis (cluster mode, DESIGN §10).

One place for them, so the journal, the leases and the node bus agree. Each
per-conversation name carries the conversation id in braces (a Redis
Cluster hash tag: all of a conversation's keys live in one slot).
"""

from __future__ import annotations

PREFIX = "halfpi:"


def stream_key(conversation_id: str) -> str:
    """The conversation's journal: a stream, one entry per seq."""
    return f"{PREFIX}j:{{{conversation_id}}}"


def marker_key(conversation_id: str) -> str:
    """A hash naming the epoch the stream is continuous for (floor, settled)."""
    return f"{PREFIX}m:{{{conversation_id}}}"


def lease_key(conversation_id: str) -> str:
    """``NODE|FENCE`` with a time to live: who owns the conversation."""
    return f"{PREFIX}lease:{{{conversation_id}}}"


def fence_key(conversation_id: str) -> str:
    """The conversation's fencing token, raised by every take-over."""
    return f"{PREFIX}fence:{{{conversation_id}}}"


def fanout_channel(conversation_id: str) -> str:
    """Where the owner publishes the entries it appends (pub/sub)."""
    return f"{PREFIX}f:{{{conversation_id}}}"


def node_channel(node_id: str) -> str:
    """Where a node hears forwarded commands and their answers (pub/sub)."""
    return f"{PREFIX}n:{node_id}"


NEWS_CHANNEL = f"{PREFIX}news"  # session-level news every node passes on
FANOUT_PATTERN = f"{PREFIX}f:*"
