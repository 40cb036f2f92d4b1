"""Real Minds for tests: a subprocess (``halfpi mind``) or one in this loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from halfpi.agents.base import Agent
from halfpi.config import Config
from halfpi.mind.service import Mind
from halfpi.process import Server, running_mind


class MindProcess:
    """``halfpi mind`` as a child process on a free port of 127.0.0.1."""

    def __init__(self, home: Path, *, delta_ms: float | None = 0.0, port: int = 0,
                 extra_args: tuple[str, ...] = (), server: str = "native",
                 nofile: int | None = None) -> None:
        self.home = home
        self.delta_ms = delta_ms
        self.port = port
        self.extra_args = extra_args
        self.server = server  # halfpi mind --server
        self.nofile = nofile  # its RLIMIT_NOFILE, soft and hard (None: this process's)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.ready: dict[str, Any] = {}

    @property
    def token(self) -> str:
        return (self.home / "face.token").read_text().strip()

    def start(self, timeout: float = 20.0) -> MindProcess:
        env = dict(os.environ, HALFPI_HOME=str(self.home), PYTHONUNBUFFERED="1")
        env.pop("HALFPI_SCRIPTED_DELTA_MS", None)
        if self.delta_ms is not None:  # None: the Mind's own default pace
            env["HALFPI_SCRIPTED_DELTA_MS"] = str(self.delta_ms)
        with open(self.home / "mind.log", "ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "halfpi.cli", "mind", "--port", str(self.port),
                 "--log-level", "info", "--server", self.server, *self.extra_args],
                # The local Hand's root is the Mind's working directory: the
                # test's own directory, where it keeps the files it reads.
                env=env, stdout=subprocess.PIPE, stderr=log, cwd=self.home.parent,
                preexec_fn=None if self.nofile is None else self._limit_descriptors,
            )
        assert self.proc.stdout is not None

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            self.kill()
            raise RuntimeError(f"mind did not start; log: {self.log()}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"mind exited; log: {self.log()}")
        self.ready = json.loads(line)
        self.url = self.ready["url"]
        # The next start on the same home reuses the port so proxies keep working.
        self.port = int(self.ready["port"])
        return self

    def _limit_descriptors(self) -> None:
        """In the child, before exec: the Mind may open at most ``nofile`` files."""
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def log(self) -> str:
        path = self.home / "mind.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def kill(self) -> None:
        """``kill -9``: no drain, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def restart(self) -> MindProcess:
        self.kill()
        return self.start()

@dataclass
class LocalMind:
    """A Mind and its server (``config.server``) running in the test's own event loop."""

    mind: Mind
    server: Server
    url: str
    token: str
    config: Config = field(repr=False, default=None)  # type: ignore[assignment]

@contextlib.asynccontextmanager
async def local_mind(home: Path, agent: Agent | None = None,
                     **overrides: Any) -> AsyncIterator[LocalMind]:
    """The same wiring as ``halfpi mind`` (:func:`running_mind`), in this loop.
    The local Hand's root is the test's directory (the home's parent), as if
    the Mind had been started there; ``server="asgi"`` (an override of
    :class:`Config`) serves it with uvicorn."""
    config = replace(Config(home=home, port=0, scripted_delta_ms=0.0,
                            hand_roots=(str(home.parent),)), **overrides)
    async with running_mind(config, agent, close_wait_s=1.0) as (mind, server):
        token = config.face_token_path.read_text().strip()
        yield LocalMind(mind, server, f"ws://127.0.0.1:{server.port}/v1/face", token, config)


async def hand_ready(lmind: LocalMind, timeout: float = 10.0) -> None:
    """Wait until the in-process local Hand is connected and registered."""
    assert lmind.mind.local_hand is not None
    await asyncio.wait_for(lmind.mind.local_hand.connected.wait(), timeout)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not lmind.mind.hands.connected("local"):
        assert loop.time() < deadline, "the local Hand never registered"
        await asyncio.sleep(0.01)
