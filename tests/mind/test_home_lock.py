"""One Mind owns a home (DESIGN §12): an exclusive lock, taken before the
store is opened, held for the Mind's lifetime."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halfpi.errors import HomeInUse
from halfpi.mind.home_lock import LOCK_NAME, HomeLock
from tests.support.client import FaceClient
from tests.support.mind import local_mind


def test_a_second_lock_on_one_home_is_refused_naming_the_holder(tmp_path: Path) -> None:
    held = HomeLock.take(tmp_path)
    try:
        with pytest.raises(HomeInUse) as caught:
            HomeLock.take(tmp_path)
        message = str(caught.value)
        assert "\n" not in message
        assert str(tmp_path) in message
        assert f"pid {os.getpid()}" in message
        assert socket.gethostname() in message
        assert "since " in message
    finally:
        held.release()


def test_a_released_lock_can_be_taken_again(tmp_path: Path) -> None:
    HomeLock.take(tmp_path).release()
    HomeLock.take(tmp_path).release()


def test_a_lock_file_left_by_a_dead_mind_does_not_block(tmp_path: Path) -> None:
    """Only the flock counts: a file whose holder is gone is free."""
    (tmp_path / LOCK_NAME).write_text('{"pid": 999999, "host": "elsewhere"}\n')
    held = HomeLock.take(tmp_path)
    try:
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_NAME).read_text()
    finally:
        held.release()


def test_an_unreadable_holder_is_still_refused(tmp_path: Path) -> None:
    held = HomeLock.take(tmp_path)
    try:
        (tmp_path / LOCK_NAME).write_text("garbage")
        with pytest.raises(HomeInUse, match="holder unknown"):
            HomeLock.take(tmp_path)
    finally:
        held.release()


def test_a_child_process_does_not_keep_the_lock(tmp_path: Path) -> None:
    """A tool run started by the Mind must not hold the home after the Mind
    is gone (the lock's descriptor is not inherited)."""
    held = HomeLock.take(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        close_fds=False,
    )
    try:
        held.release()
        # The child is alive, and the home is free: at once, or within the
        # instant the kernel takes to close the child's copy during its exec.
        deadline = time.monotonic() + 5.0
        while True:
            try:
                HomeLock.take(tmp_path).release()
                break
            except HomeInUse:
                assert time.monotonic() < deadline, "the child process holds the home"
                time.sleep(0.001)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


def snapshot(home: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(home.iterdir()) if p.is_file()}


async def test_a_second_mind_on_a_home_stops_before_writing_anything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with local_mind(home, local_hand=False) as first:
        face = await FaceClient.connect(first.url, first.token)
        cid = await face.create_conversation()
        before = snapshot(home)
        with pytest.raises(HomeInUse):
            async with local_mind(home, local_hand=False):
                raise AssertionError("a second Mind started on a home in use")
        assert snapshot(home) == before
        # The first Mind is untouched and keeps serving.
        result = await face.chat_to_end(cid, "still here")
        assert result["payload"]["status"] == "succeeded"
        await face.close()
    # Once the first Mind has stopped, the home is free again.
    async with local_mind(home, local_hand=False):
        pass
