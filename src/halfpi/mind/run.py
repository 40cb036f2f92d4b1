"""Running a Mind as a process: wiring, signals and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from halfpi.agents.base import Agent
from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config
from halfpi.face.transport import pinned_tls_context, tls_connector
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.service import Mind
from halfpi.store.sqlite import SQLiteStore

log = logging.getLogger("halfpi.mind")

# The servers that carry /v1/face and /v1/hand (``--server``), side by side
# with one interface and imported by name, so that a Mind served natively
# never imports Starlette or uvicorn.
SERVERS = {
    "native": "halfpi.gateway.native:FaceServer",
    "asgi": "halfpi.gateway.asgi_server:AsgiServer",
}


class Server(Protocol):
    """What the wiring needs from a server: see ``gateway/native.py`` and
    ``gateway/asgi_server.py``."""

    @property
    def port(self) -> int: ...

    async def start(self) -> None: ...

    def stop_accepting(self) -> None: ...

    async def wait_closed(self, timeout: float) -> None: ...


def server_class(name: str) -> Callable[[Mind], Server]:
    module, _, attr = SERVERS[name].partition(":")
    factory: Callable[[Mind], Server] = getattr(importlib.import_module(module), attr)
    return factory


def build_mind(config: Config, agent: Agent | None = None) -> Mind:
    return Mind(
        config,
        SQLiteStore(config.db_path),
        MemoryJournal(config.journal),
        agent or ScriptedAgent(config.scripted_delta_ms),
    )


def start_local_hand(mind: Mind, url: str) -> None:
    """The embedded set-up's Hand, dialling ``url`` (``…/v1/hand``): over
    ``wss://`` it trusts exactly the Mind's own certificate when the Mind
    serves TLS itself (whatever names the certificate carries)."""
    config = mind.config
    if url.startswith("wss://") and config.tls_cert is not None:
        mind.start_local_hand(url, tls_connector(pinned_tls_context(config.tls_cert)))
    else:
        mind.start_local_hand(url)


@contextlib.asynccontextmanager
async def running_mind(
    config: Config, agent: Agent | None = None, *, close_wait_s: float = 2.0
) -> AsyncIterator[tuple[Mind, Server]]:
    """A started Mind, its server (``config.server``) listening and (by
    default) its local Hand connected to it; on exit: stop accepting, drain
    the Mind (close Faces with 1012, end chats as ``interrupted``, close the
    store), wait a bounded time for connections to close."""
    config.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    mind = build_mind(config, agent)
    await mind.start()
    server = server_class(config.server)(mind)
    await server.start()
    if config.local_hand:
        # The local Hand dials the address the server listens on (loopback
        # when it listens on every address).
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(
            config.host, f"[{config.host}]" if ":" in config.host else config.host
        )
        scheme = "wss" if config.tls else "ws"
        start_local_hand(mind, f"{scheme}://{host}:{server.port}/v1/hand")
    try:
        yield mind, server
    finally:
        server.stop_accepting()
        await mind.drain()
        await server.wait_closed(close_wait_s)


async def serve(config: Config) -> None:
    """Serve until SIGINT/SIGTERM, then drain (see :func:`running_mind`)."""
    async with running_mind(config) as (mind, server):
        ready = {
            "event": "listening",
            "url": f"{'wss' if config.tls else 'ws'}://{config.host}:{server.port}/v1/face",
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
