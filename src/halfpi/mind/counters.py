"""What the Mind counts itself, in plain ints where the work already happens
(the metrics of ``GET /metrics`` read them when scraped: ``mind/metrics.py``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from halfpi.core.metrics import CHAT_BUCKETS, Histogram

if TYPE_CHECKING:
    from halfpi.core.outbound import OutboundQueue


@dataclass(slots=True)
class MindMetrics:
    """What the Mind counts itself (the rest is read where it is kept)."""

    # Messages published by conversation actors (each one once, whatever
    # the number of subscribers): events and transient updates alike.
    published: int = 0
    chats: Counter[str] = field(default_factory=Counter)  # by terminal status
    chat_seconds: Histogram = field(default_factory=lambda: Histogram(CHAT_BUCKETS))
    # Tokens the model reported for ended replies: "prompt", "completion".
    tokens: Counter[str] = field(default_factory=Counter)
    # Replies that ended with an error code (provider_error, …), by code.
    chat_errors: Counter[str] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)  # by transport
    resets: Counter[str] = field(default_factory=Counter)  # face.reset sent, by reason
    handshakes_failed: Counter[str] = field(default_factory=Counter)  # by kind
    handshakes_throttled: int = 0
    # Totals of connections that closed (live ones are read from their queues).
    closed_delivered: int = 0
    closed_coalesced: int = 0
    closed_shed: int = 0

    def connection_closed(self, queue: OutboundQueue, transport: str) -> None:
        """What a closed connection's queue counted (``transport``: its label)."""
        self.closed_delivered += queue.event_seq
        self.closed_coalesced += queue.coalesced
        self.closed_shed += queue.shed
        if queue.evicted:
            self.evictions[transport] += 1

    def chat_ended(
        self, status: str, seconds: float, error_code: str | None, usage: dict[str, Any] | None
    ) -> None:
        self.chats[status] += 1
        self.chat_seconds.observe(max(0.0, seconds))
        if error_code:
            self.chat_errors[error_code] += 1
        if usage:
            self.tokens["prompt"] += int(usage.get("prompt_tokens") or 0)
            self.tokens["completion"] += int(usage.get("completion_tokens") or 0)


@dataclass(frozen=True, slots=True)
class ClusterCounts:
    """A cluster node's part in ``GET /metrics`` (``ClusterNode.counts``)."""

    leases_held: int
    replicas: int
    forwards: dict[str, int]  # by outcome: answered, unavailable
    takeovers: int
    step_downs: int
    malformed: int  # messages on the cluster's channels that were not a node's
