"""Faces and Hands that found their Mind through ``--home`` follow it to a new port.

``halfpi mind --port 0`` listens where nobody could guess and writes the
address into ``HOME/mind.json``. A Face started with ``--home`` (no
``--url``) reads that file again before every redial, so a Mind that was
killed and started again on another port is found there — by the headless
face and by the terminal face (whose ctrl+r dials at once, at the new
address). Real processes, real ports.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_terminal import Tmux, is_live, ready, status_line
from tests.e2e.test_tool_policy import listed_hand
from tests.support import programs
from tests.support.cli import hand_add
from tests.support.client import FaceClient
from tests.support.hand import HandProcess
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e


def start_again_elsewhere(mind: MindProcess) -> str:
    """``kill -9`` the Mind, then start it on a new port (``--port 0``); the
    old address file stays behind, naming a dead process."""
    old = mind.url
    mind.kill()
    mind.port = 0
    mind.start()
    assert mind.url != old
    return old


class Lines:
    """The headless face's stdout, one JSON message at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.seen: list[dict[str, Any]] = []

    async def until(self, type_: str, timeout: float = 30.0, **match: Any) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            assert self.proc.stdout is not None
            while True:
                line = await self.proc.stdout.readline()
                assert line, "the headless face ended"
                message = json.loads(line)
                self.seen.append(message)
                payload: dict[str, Any] = message["payload"]
                if message["type"] == type_ and all(payload.get(k) == v for k, v in match.items()):
                    return payload

        try:
            return await asyncio.wait_for(read(), timeout)
        except TimeoutError:
            raise AssertionError(f"no {type_} {match} in time; seen: {self.seen}") from None


async def test_the_headless_face_finds_a_restarted_port_0_mind_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("HALFPI_URL", None)
    face = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfpi.cli", "face", "--mode", "headless", "--home", str(home),
        "--new-conversation", "demo",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )
    try:
        out = Lines(face)
        await out.until("face.status", state="live", url=mind.url)
        old = start_again_elsewhere(mind)
        back = await out.until("face.status", state="live", timeout=30)
        assert back["url"] == mind.url != old
        assert face.stdin is not None
        face.stdin.write(b'{"type":"face.chat","payload":{"content":"found you"}}\n')
        await face.stdin.drain()
        result = await out.until("face.result", content="found you")
        assert result["status"] == "succeeded"
        face.stdin.close()
        assert await asyncio.wait_for(face.wait(), 30) == 0
    finally:
        if face.returncode is None:
            face.kill()
            await face.wait()
        mind.kill()


async def test_the_terminal_face_finds_a_restarted_port_0_mind_again(tmp_path: Path) -> None:
    programs.require("tmux")  # CI requires it (HALFPI_TMUX); the run's summary names it
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    tmux = Tmux("halfpi-address")
    try:
        tmux.start(f"env -u COLUMNS -u LINES -u HALFPI_URL HALFPI_HOME={home} "
                   f"TERM=xterm-256color {sys.executable} -m halfpi.cli face --home {home}")
        await tmux.wait_for(lambda s: ready(s) and mind.url in status_line(s))
        old = start_again_elsewhere(mind)
        await tmux.wait_for(lambda s: is_live(s) and mind.url in status_line(s), timeout=30)

        # Again, with ctrl+r while the face waits out its backoff: it dials
        # the address the file names now, not the dead one.
        old = start_again_elsewhere(mind)
        await tmux.wait_for(lambda s: "^r Retry now" in s or is_live(s), timeout=30)
        tmux.keys("C-r")
        screen = await tmux.wait_for(
            lambda s: is_live(s) and mind.url in status_line(s), timeout=30
        )
        assert old not in status_line(screen)
        tmux.type("still here")
        tmux.keys("Enter")
        await tmux.wait_for(lambda s: s.count("still here") >= 2)
    finally:
        tmux.kill()
        mind.kill()


async def test_a_hand_started_with_home_finds_a_restarted_port_0_mind_again(
    tmp_path: Path,
) -> None:
    """``halfpi hand --home`` (no ``--mind``) reads HOME/mind.json again
    before every redial, like a Face."""
    home = tmp_path / "home"
    home.mkdir()
    token = (await hand_add(home, "laptop")).token
    mind = MindProcess(home, extra_args=("--no-local-hand",)).start()
    hand = HandProcess(None, token, "laptop", tmp_path / "hand.log", ("--home", str(home)))
    face = await FaceClient.connect(mind.url, mind.token)
    try:
        await listed_hand(face, "laptop")
        await face.close()
        start_again_elsewhere(mind)
        face = await FaceClient.connect(mind.url, mind.token)
        await listed_hand(face, "laptop", timeout=30)
        assert hand.alive(), hand.log()
    finally:
        await face.close()
        hand.kill()
        mind.kill()
