"""The terminal face driven in a real terminal (tmux send-keys / capture-pane).

A reply streams in place; the Mind's connection is cut mid-reply (and kept
down for a moment); the status line shows the truth at each step, and the
reply completes exactly once.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"]


class Tmux:
    def __init__(self, name: str) -> None:
        self.name = name

    def start(self, command: str, width: int = 140, height: int = 36) -> None:
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(width),
                        "-y", str(height), command], check=True)

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name],
                              capture_output=True, text=True, check=True).stdout

    async def wait_for(self, predicate, timeout: float = 20.0) -> str:  # type: ignore[no-untyped-def]
        """Wait until the screen satisfies ``predicate``; the event loop keeps
        running meanwhile (the fault proxy lives in it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if loop.time() > deadline:
                raise TimeoutError(f"screen never matched; it shows:\n{screen}")
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


async def test_terminal_face_streams_and_resumes_after_a_cut(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    proxy = await FaultProxy(mind.port).start()
    tmux = Tmux(f"halfpi-test-{os.getpid()}")
    command = (f"env HALFPI_HOME={home} TERM=xterm-256color {sys.executable} -m halfpi.cli face "
               f"--url {proxy.url}")
    try:
        tmux.start(command)
        await tmux.wait_for(lambda s: s.rstrip().endswith("live"))
        tmux.keys("C-n")
        await tmux.wait_for(lambda s: "new conversation" in s)
        tmux.keys(f"/pace 120 {' '.join(WORDS)}", "Enter")
        await tmux.wait_for(lambda s: "agent: alpha bravo" in s)
        # Cut the link and keep the Mind unreachable for a moment.
        assert proxy.server is not None
        proxy.server.close()
        proxy.cut_all()
        await tmux.wait_for(lambda s: "reconnecting (attempt" in s)
        proxy.server = await asyncio.start_server(proxy._accept, "127.0.0.1", proxy.port)
        # The reply completes: the user's line and the agent's box both end in "romeo".
        await tmux.wait_for(lambda s: s.count("romeo") >= 2 and "▌" not in s, timeout=30)
        await tmux.wait_for(lambda s: s.rstrip().splitlines()[-1].startswith(("resumed:", "live")))
        final = tmux.screen()
        # Exactly once: no duplicated reply, no duplicated text inside it.
        assert final.count("romeo") == 2, final
        assert final.count("agent") == 1, final
        assert final.count("alpha") == 2, final
    finally:
        tmux.kill()
        await proxy.stop()
        mind.kill()


async def test_terminal_face_approval_prompt_defaults_to_deny(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    tmux = Tmux(f"halfpi-approval-{os.getpid()}")
    marker = tmp_path / "ran"
    command = (f"env HALFPI_HOME={home} TERM=xterm-256color {sys.executable} -m halfpi.cli face "
               f"--url {mind.url}")
    try:
        tmux.start(command)
        await tmux.wait_for(lambda s: s.rstrip().endswith("live"))
        tmux.keys("C-n")
        await tmux.wait_for(lambda s: "new conversation" in s)
        tmux.keys(f'/tool exec_command {{"argv": ["touch", "{marker}"], "api_key": "k-42"}}',
                  "Enter")
        prompt = await tmux.wait_for(lambda s: "Deny once" in s and "Allow once" in s)
        assert '"api_key": "***"' in prompt  # masked in the prompt too
        tmux.keys("Enter")  # the focused default: deny once
        await tmux.wait_for(lambda s: "exec_command denied" in s)
        assert not marker.exists()
    finally:
        tmux.kill()
        mind.kill()
