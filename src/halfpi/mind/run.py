"""Running a Mind as a process: wiring, signals and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config
from halfpi.gateway.native import FaceServer
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.service import Mind
from halfpi.store.sqlite import SQLiteStore

log = logging.getLogger("halfpi.mind")


def build_mind(config: Config) -> Mind:
    return Mind(
        config,
        SQLiteStore(config.db_path),
        MemoryJournal(config.journal),
        ScriptedAgent(config.scripted_delta_ms),
    )


async def serve(config: Config) -> None:
    """Serve until SIGINT/SIGTERM, then drain: stop accepting, tell Faces
    (close 1012), let in-flight chats commit as ``interrupted`` within the
    grace period, close the store."""
    config.home.mkdir(parents=True, exist_ok=True)
    mind = build_mind(config)
    await mind.start()
    server = FaceServer(mind)
    await server.start()
    if config.local_hand:
        mind.start_local_hand(f"ws://127.0.0.1:{server.port}/v1/hand")
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
    server.stop_accepting()
    await mind.drain()
    await server.wait_closed(2.0)
    log.info("stopped")
