"""The maintenance round's credential poll (``Credentials.poll``, I8): it
reads the credentials version at most once per ``POLL_S`` — an idle Mind
hops to the Store's thread twice a second, not four times — and a
revocation still closes connections within a second. Reads that must see
the Store as it is (``refresh``) are never skipped. Injected time, a
Store that counts its reads."""

from __future__ import annotations

from halfpi.config import Config
from halfpi.mind.counters import MindMetrics
from halfpi.mind.credentials import POLL_S, Credentials
from halfpi.store.base import Credential

ROUND_S = 0.25  # credential_poll_s: the maintenance round's period


class Store:
    def __init__(self) -> None:
        self.version = 1
        self.version_reads = 0
        self.rows = [Credential("p_1", "laptop", "face", "operator", frozenset(), "h", 0.0)]

    async def credentials_version(self) -> int:
        self.version_reads += 1
        return self.version

    async def credentials(self) -> list[Credential]:
        return list(self.rows)

    def revoke(self, now: float) -> None:
        self.rows = [Credential("p_1", "laptop", "face", "operator", frozenset(), "h", 0.0,
                                revoked_at=now)]
        self.version += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _never(seconds: float) -> None:
    raise AssertionError("no wait expected")


async def _no_reread() -> None:
    raise AssertionError("no shared re-read expected")


def credentials(store: Store, clock: Clock, tmp_path: object) -> Credentials:
    return Credentials(lambda: store, Config(home=tmp_path), clock,  # type: ignore[arg-type]
                       _never, MindMetrics(), _no_reread)


async def test_an_idle_mind_reads_the_version_at_most_once_per_poll_period(
    tmp_path: object,
) -> None:
    store, clock = Store(), Clock()
    creds = credentials(store, clock, tmp_path)
    await creds.refresh()  # the start
    reads = store.version_reads
    for _ in range(40):  # 10 s of rounds
        clock.now += ROUND_S
        assert await creds.poll() == set()
    per_second = (store.version_reads - reads) / 10
    assert per_second <= 1 / POLL_S
    assert POLL_S > ROUND_S  # fewer reads than rounds


async def test_I8_a_revocation_is_seen_within_a_second_wherever_it_falls(
    tmp_path: object,
) -> None:
    for offset in (0.0, 0.01, 0.1, 0.24, 0.26, 0.49, 0.5, 0.51, 0.74):
        store, clock = Store(), Clock()
        creds = credentials(store, clock, tmp_path)
        await creds.refresh()
        assert await creds.poll() == set()  # a round right after the start: skipped
        revoked_at = clock.now + offset
        seen_at = None
        round_at = clock.now
        while seen_at is None and round_at < revoked_at + 5:
            round_at += ROUND_S
            clock.now = round_at
            if store.version == 1 and clock.now >= revoked_at:
                store.revoke(revoked_at)  # committed before this round's read
            if await creds.poll():
                seen_at = clock.now
        assert seen_at is not None and seen_at - revoked_at <= POLL_S + ROUND_S < 1.0, offset


async def test_a_refresh_is_never_skipped(tmp_path: object) -> None:
    store, clock = Store(), Clock()
    creds = credentials(store, clock, tmp_path)
    await creds.refresh()
    store.revoke(clock.now)
    assert await creds.refresh() == {"p_1"}  # at once: a handshake's recheck, the start
    assert store.version_reads == 2
