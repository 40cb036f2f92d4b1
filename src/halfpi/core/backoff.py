"""Reconnect backoff as a pure generator (DESIGN §11: 0.25 s * 2^n, cap 30 s, full jitter).

The random source is an argument so tests are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def backoff(
    initial: float = 0.25,
    factor: float = 2.0,
    cap: float = 30.0,
    *,
    jitter: bool = True,
    rng: random.Random | None = None,
) -> Iterator[float]:
    """Yield successive delays; with full jitter each is uniform in [0, ceiling]."""
    draw = (rng or random.Random()).random
    ceiling = initial
    while True:
        yield draw() * ceiling if jitter else ceiling
        ceiling = min(cap, ceiling * factor)
