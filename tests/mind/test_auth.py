"""Unknown tokens re-read the credential table, at most once per interval;
a known one is checked against the credentials version at its hello."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from halfpi.gateway.session import FaceSession
from halfpi.mind.auth import SharedReread, make_credential
from halfpi.mind.credentials import RECHECK_FRESH_S, RECHECK_TIMEOUT_S
from tests.support.rig import Peer, Wire, fake_time_mind
from tests.support.wait import until


class Clock:
    """Time that moves only when the re-read sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class HangingRead:
    """A credentials read that hangs until ``release`` is set."""

    def __init__(self) -> None:
        self.reads = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> None:
        self.reads += 1
        self.started.set()
        await self.release.wait()


async def test_many_unknown_tokens_at_once_share_one_read() -> None:
    clock = Clock()
    reads: list[float] = []

    async def refresh() -> None:
        reads.append(clock.now)
        await asyncio.sleep(0)

    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    await asyncio.gather(*(gate.wait() for _ in range(50)))
    assert reads == [100.0]


async def test_reads_are_at_least_an_interval_apart() -> None:
    clock = Clock()
    reads: list[float] = []

    async def refresh() -> None:
        reads.append(clock.now)

    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    for _ in range(5):
        await gate.wait()
    assert reads == pytest.approx([100.0, 100.1, 100.2, 100.3, 100.4])
    assert len(clock.slept) == 4


async def test_a_waiter_arriving_during_a_read_waits_for_the_next_one() -> None:
    # The read in progress may have missed a credential created a moment
    # before this token came: only a read started afterwards can tell.
    clock = Clock()
    refresh = HangingRead()
    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    first = asyncio.create_task(gate.wait())
    await refresh.started.wait()
    late = asyncio.create_task(gate.wait())
    await asyncio.sleep(0)
    assert refresh.reads == 1
    refresh.release.set()
    await asyncio.gather(first, late)
    assert refresh.reads == 2


async def test_a_failing_read_lets_the_waiters_go_on() -> None:
    clock = Clock()

    async def refresh() -> None:
        raise OSError("the store is gone")

    gate = SharedReread(refresh, clock, 0.1, clock.sleep)
    await asyncio.wait_for(gate.wait(), 5)


async def test_a_store_that_stops_answering_holds_one_read_and_one_waiting() -> None:
    """Handshakes keep coming while the Store hangs: one read runs, the
    next one waits for it (shared by every newcomer), none piles up."""
    clock = Clock()
    refresh = HangingRead()
    reread = SharedReread(refresh, clock, 0.0, clock.sleep)
    waiting = [asyncio.ensure_future(reread.wait())]
    await refresh.started.wait()
    for _ in range(5):  # waves of handshakes while the read hangs
        waiting += [asyncio.ensure_future(reread.wait()) for _ in range(10)]
        await asyncio.sleep(0)  # a turn of the loop between waves
    assert refresh.reads == 1
    refresh.release.set()
    await asyncio.gather(*waiting)
    assert refresh.reads == 2  # the one that hung, then the one every newcomer shared


async def test_I8_a_token_revoked_by_another_process_is_refused_at_its_next_hello(
    tmp_path: Path,
) -> None:
    """Revoked in the Store by someone else (the CLI, another node) and not
    yet seen by the Mind's poll (its clock stands still here): the next hello
    reads the credentials version and is refused; a live token still works."""
    async with fake_time_mind(tmp_path / "home") as rig:
        now = rig.mind.wall()
        credential, token = make_credential("face", "phone", "operator", frozenset(), now)
        await rig.mind.store.add_credential(credential)
        first = Peer(FaceSession(rig.mind, wire := Wire()), wire)
        first.send("face.hello", hello(token))
        await rig.expect(first, lambda f: f["type"] == "face.welcome")

        assert await rig.mind.store.revoke_credential("face", "phone", now)
        # The view the first hello read is fresh for RECHECK_FRESH_S: past
        # that (and still before the next poll), the next hello reads again.
        rig.advance(RECHECK_FRESH_S + 0.01)
        again = Peer(FaceSession(rig.mind, wire := Wire()), wire)
        again.send("face.hello", hello(token))
        refused = await rig.expect(again, lambda f: f["type"] in ("face.welcome", "face.error"))
        assert refused["type"] == "face.error", refused
        assert refused["payload"]["code"] == "unauthorized"
        assert wire.closed_with == 4001
        assert first.wire.closed_with == 4003  # the live one learned it on the way
        rig.advance(0.25)  # this address's wait after a failure is over: …
        await rig.face()  # … the operator's token still works


async def test_hellos_of_known_tokens_read_the_credentials_version_once_per_fresh_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every HTTP request is a handshake: a stream of them costs one read of
    the credentials version per RECHECK_FRESH_S, not one each."""
    async with fake_time_mind(tmp_path / "home") as rig:
        reads = []
        version = rig.mind.store.credentials_version

        async def counted() -> int:
            reads.append(rig.mind.now())
            return await version()

        monkeypatch.setattr(rig.mind.store, "credentials_version", counted)
        rig.advance(RECHECK_FRESH_S + 0.01)  # what the start read is stale now
        for _ in range(20):
            await rig.face()
        assert len(reads) == 1
        rig.advance(RECHECK_FRESH_S + 0.01)
        await rig.face()
        assert len(reads) == 2


async def test_a_handshake_waits_for_a_hung_credentials_read_at_most_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Store that stopped answering: a known token is welcomed on the view
    read last, an unknown one refused, each once RECHECK_TIMEOUT_S of the
    Mind's clock has passed — no handshake waits for ever."""
    async with fake_time_mind(tmp_path / "home") as rig:
        reads: list[asyncio.Event] = []  # each read's release: none comes by itself
        version = rig.mind.store.credentials_version

        async def hung() -> int:
            release = asyncio.Event()
            reads.append(release)
            await release.wait()
            return await version()

        monkeypatch.setattr(rig.mind.store, "credentials_version", hung)
        answered = ("face.welcome", "face.error")
        rig.advance(RECHECK_FRESH_S + 0.01)  # the start's read is stale: a hello reads
        known = Peer(FaceSession(rig.mind, wire := Wire()), wire)
        known.send("face.hello", hello(rig.face_token))
        await until(lambda: len(reads) == 1)
        assert not known.seen(lambda f: f["type"] in answered)
        rig.advance(RECHECK_TIMEOUT_S)
        await rig.expect(known, lambda f: f["type"] == "face.welcome")

        reads[0].set()  # that read ends; the next one hangs as well
        stranger = Peer(FaceSession(rig.mind, wire := Wire()), wire)
        stranger.send("face.hello", hello("hpf_" + "0" * 43))
        await until(lambda: len(reads) == 2)
        assert not stranger.seen(lambda f: f["type"] in answered)
        rig.advance(RECHECK_TIMEOUT_S)
        refused = await rig.expect(stranger, lambda f: f["type"] in answered)
        assert refused["payload"]["code"] == "unauthorized"
        reads[1].set()


def hello(token: str) -> dict[str, Any]:
    return {"token": token, "client": {"name": "t", "version": "1"}, "protocol": 3}
