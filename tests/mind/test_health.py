"""Readiness (``GET /readyz``): one cheap probe per second at most, each
part named when it fails (docs/operations.md, "Health and metrics")."""

from __future__ import annotations

import asyncio
import errno
import os
from functools import partial
from pathlib import Path

import pytest

from halfpi.errors import StoreError
from halfpi.mind.health import NoRoom, ReadinessProbe, take_room
from tests.support.clock import FakeClock
from tests.support.tmpfs import fill, small_filesystem


async def test_a_readiness_probe_is_made_once_per_second_however_many_ask() -> None:
    clock = FakeClock()
    writes = 0

    async def write() -> None:
        nonlocal writes
        writes += 1
        await asyncio.sleep(0)

    probe = ReadinessProbe(write, None, clock)
    answers = await asyncio.gather(*(probe.check() for _ in range(50)))
    assert all(a.ready for a in answers)
    assert writes == 1
    clock.now += 0.5
    await probe.check()
    assert writes == 1
    clock.now += 0.6
    await probe.check()
    assert writes == 2


async def test_a_store_that_refuses_writes_is_not_ready_and_named() -> None:
    async def write() -> None:
        raise StoreError("commit failed: disk I/O error at /secret/path")

    async def ping() -> bool:
        return True

    readiness = await ReadinessProbe(write, ping, FakeClock()).check()
    assert not readiness.ready
    assert readiness.checks == {"store": "unreachable (StoreError)", "journal": "ok"}


async def test_a_journal_that_does_not_answer_in_time_is_not_ready() -> None:
    async def write() -> None:
        return None

    async def ping() -> None:
        await asyncio.Event().wait()

    probe = ReadinessProbe(write, ping, FakeClock(), timeout_s=0.05)
    readiness = await probe.check()
    assert readiness.checks == {"store": "ok", "journal": "no answer within 0.05 s"}


async def test_a_failed_commit_is_not_ready_at_once_and_ready_after_a_probe_write_commits() -> None:
    """The Store's last commit outcome is read at every check, not once per
    probe: chats that fail to commit take the Mind out of rotation at once;
    the next probe's own write, once it commits, brings it back."""
    clock = FakeClock()
    failed = False

    async def write() -> None:
        nonlocal failed
        failed = False  # the probe's write committed

    probe = ReadinessProbe(write, None, clock, commit_failed=lambda: failed)
    assert (await probe.check()).ready
    failed = True  # a chat's commit: "database or disk is full"
    readiness = await probe.check()
    assert not readiness.ready
    assert readiness.checks["store"] == "the last commit failed"
    assert probe.probes == 1  # no new probe was needed to say so
    clock.now += 1.1
    assert (await probe.check()).ready
    assert probe.probes == 2


async def test_a_disk_with_no_room_is_not_ready_and_ready_once_room_returns(
    tmp_path: Path,
) -> None:
    with small_filesystem(tmp_path / "disk") as disk:
        clock = FakeClock()
        probe = ReadinessProbe(partial(asyncio.to_thread, take_room, disk), None, clock)
        assert (await probe.check()).ready
        filler = fill(disk)
        clock.now += 1.1
        readiness = await probe.check()
        assert readiness.checks["store"] == "its disk has no room (ENOSPC)"
        filler.unlink()
        clock.now += 1.1
        assert (await probe.check()).ready
        assert list(disk.iterdir()) == []  # the probe leaves nothing behind


@pytest.mark.parametrize("unsupported", ["EOPNOTSUPP", "missing"])
def test_room_is_taken_where_the_filesystem_cannot_preallocate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unsupported: str,
) -> None:
    """A filesystem without ``fallocate`` (``EOPNOTSUPP`` where the C library
    does not emulate it) or a system without ``posix_fallocate`` at all
    (macOS) is not a full disk: the probe writes the room instead, and a
    full disk still says ENOSPC there."""
    if unsupported == "missing":
        monkeypatch.delattr(os, "posix_fallocate")
    else:
        def refuse(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        monkeypatch.setattr(os, "posix_fallocate", refuse)
    with small_filesystem(tmp_path / "disk") as disk:
        take_room(disk)  # room: no NoRoom
        assert list(disk.iterdir()) == []
        filler = fill(disk)
        with pytest.raises(NoRoom) as refused:
            take_room(disk)
        assert refused.value.why == "ENOSPC"
        filler.unlink()
        assert list(disk.iterdir()) == []
