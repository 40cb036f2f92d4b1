"""Bounds the pure core enforces, as value objects (DESIGN §5, §11).

They live here, not in :mod:`halfpi.config`, because the core's own rules
take them (the outbound queue policy, the request registry's pruning) and
the core imports nothing above it; the configuration holds one of each.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Per-connection outbound queue bounds (DESIGN §11, I7)."""

    reliable_messages: int = 256
    reliable_bytes: int = 8 * MiB
    transient_messages: int = 128
    transient_bytes: int = 512 * KiB


@dataclass(frozen=True, slots=True)
class RequestRetention:
    """Request registry retention (DESIGN §5)."""

    min_seconds: float = 600.0
    max_per_principal: int = 256
    tombstone_seconds: float = 86_400.0
