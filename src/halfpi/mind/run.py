"""Running a Mind as a process: wiring, signals and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator

from halfpi.agents.base import Agent
from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config
from halfpi.gateway.native import FaceServer
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.home_lock import HomeLock
from halfpi.mind.service import Mind
from halfpi.store.sqlite import SQLiteStore

log = logging.getLogger("halfpi.mind")


def build_mind(config: Config, agent: Agent | None = None) -> Mind:
    return Mind(
        config,
        SQLiteStore(config.db_path),
        MemoryJournal(config.journal),
        agent or ScriptedAgent(config.scripted_delta_ms),
    )


@contextlib.asynccontextmanager
async def running_mind(
    config: Config, agent: Agent | None = None, *, close_wait_s: float = 2.0
) -> AsyncIterator[tuple[Mind, FaceServer]]:
    """A started Mind, its server listening and (by default) its local Hand
    connected to it; on exit: stop accepting, drain the Mind (close Faces
    with 1012, end chats as ``interrupted``, close the store), wait a bounded
    time for connections to close."""
    config.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    # One Mind per home (DESIGN §12): locked before the store is opened or
    # anything is written; held until the end (released with this frame).
    home_lock = HomeLock.take(config.home)
    mind = build_mind(config, agent)
    await mind.start()
    server = FaceServer(mind)
    await server.start()
    if config.local_hand:
        # The local Hand dials the address the server listens on (loopback
        # when it listens on every address).
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(
            config.host, f"[{config.host}]" if ":" in config.host else config.host
        )
        mind.start_local_hand(f"ws://{host}:{server.port}/v1/hand")
    try:
        yield mind, server
    finally:
        server.stop_accepting()
        await mind.drain()
        await server.wait_closed(close_wait_s)
        home_lock.release()


async def serve(config: Config) -> None:
    """Serve until SIGINT/SIGTERM, then drain (see :func:`running_mind`)."""
    async with running_mind(config) as (mind, server):
        ready = {
            "event": "listening",
            "url": f"ws://{config.host}:{server.port}/v1/face",
            "port": server.port,
            "node_id": mind.node_id,
            "home": str(config.home),
        }
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("draining")
    log.info("stopped")
