"""Reconnect backoff (DESIGN §11): 0.25 s doubling, cap 30 s, full jitter."""

from __future__ import annotations

import itertools
import random

import pytest

from halfpi.core.backoff import backoff

CEILINGS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


class FixedRandom(random.Random):
    """Always draws ``value``: pins the jitter to a known point."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_without_jitter_the_sequence_is_exact() -> None:
    assert list(itertools.islice(backoff(jitter=False), len(CEILINGS))) == CEILINGS


def test_cap_holds_forever() -> None:
    delays = list(itertools.islice(backoff(jitter=False), 100))
    assert max(delays) == 30.0
    assert delays[-50:] == [30.0] * 50


def test_custom_parameters() -> None:
    got = list(itertools.islice(backoff(1.0, 3.0, 10.0, jitter=False), 5))
    assert got == [1.0, 3.0, 9.0, 10.0, 10.0]


def test_full_jitter_draws_uniformly_below_the_ceiling() -> None:
    seeded = random.Random(1234)
    mirror = random.Random(1234)
    delays = list(itertools.islice(backoff(rng=seeded), len(CEILINGS)))
    assert delays == [mirror.random() * c for c in CEILINGS]
    for d, ceiling in zip(delays, CEILINGS, strict=True):
        assert 0.0 <= d <= ceiling


@pytest.mark.parametrize("value", [0.0, 0.5, 0.999999])
def test_jitter_scales_the_ceiling(value: float) -> None:
    delays = list(itertools.islice(backoff(rng=FixedRandom(value)), len(CEILINGS)))
    assert delays == pytest.approx([value * c for c in CEILINGS])


def test_same_seed_gives_the_same_delays() -> None:
    a = list(itertools.islice(backoff(rng=random.Random(9)), 20))
    b = list(itertools.islice(backoff(rng=random.Random(9)), 20))
    c = list(itertools.islice(backoff(rng=random.Random(10)), 20))
    assert a == b
    assert a != c


def test_delays_stay_within_bounds_for_many_seeds() -> None:
    for seed in range(50):
        delays = itertools.islice(backoff(rng=random.Random(seed)), 30)
        for n, d in enumerate(delays):
            assert 0.0 <= d <= min(30.0, 0.25 * 2**n)


def test_default_rng_also_stays_within_bounds() -> None:
    for n, d in enumerate(itertools.islice(backoff(), 30)):
        assert 0.0 <= d <= min(30.0, 0.25 * 2**n)
