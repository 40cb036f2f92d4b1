"""Running a Mind as a process: wiring, signals and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol

from halfpi.agents.base import Agent
from halfpi.config import Config
from halfpi.errors import StoreError
from halfpi.mind.home import Address, CannotStart, prepare_home, remove_address, write_address
from halfpi.mind.home_lock import HomeLock
from halfpi.mind.service import Mind
from halfpi.undumpable import make_undumpable
from halfpi.wiring import make_journal, make_store

if TYPE_CHECKING:
    from halfpi.client.transport import Connector
    from halfpi.hand.node import HandNode

log = logging.getLogger("halfpi.mind")

# Imported where they are used, not here (docs/performance.md, "Start-up"):
# the local Hand (``local_hand``: not with --no-local-hand), the cluster node
# (``build_mind``), the server and the agent (by name, below).

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


# The agents by name (``--agent``), imported only when chosen: a Mind with
# the scripted agent never imports the model provider and its SDK.
AGENTS = {
    "scripted": "halfpi.agents.scripted:from_config",
    "openai": "halfpi.agents.openai:from_config",
}


def make_agent(config: Config) -> Agent:
    """The agent ``config.agent`` names. One line (CannotStart) when it
    cannot start as configured (no model, no key, a key file others read)."""
    module, _, attr = AGENTS[config.agent].partition(":")
    factory: Callable[[Config], Agent] = getattr(importlib.import_module(module), attr)
    try:
        return factory(config)
    except ValueError as exc:
        raise CannotStart(str(exc)) from None


def build_mind(config: Config, agent: Agent | None = None) -> Mind:
    journal = make_journal(config)
    mind = Mind(
        config,
        make_store(config),
        journal,
        agent or make_agent(config),
        local_hand=lambda url, connector: local_hand(config, url, connector),
    )
    if config.cluster:  # several nodes on one PostgreSQL and one Redis
        from halfpi.journal.redis import RedisJournal
        from halfpi.mind import api
        from halfpi.mind.cluster_node import ClusterNode

        assert isinstance(journal, RedisJournal)
        mind.cluster = ClusterNode(mind, journal, api.dispatch)
    return mind


def start_local_hand(mind: Mind, url: str) -> None:
    """The embedded set-up's Hand, dialling ``url`` (``…/v1/hand``): over
    ``wss://`` it trusts exactly the Mind's own certificate when the Mind
    serves TLS itself (whatever names the certificate carries)."""
    config = mind.config
    if url.startswith("wss://") and config.tls_cert is not None:
        from halfpi.client.transport import pinned_tls_context, tls_connector

        mind.start_local_hand(url, tls_connector(pinned_tls_context(config.tls_cert)))
    else:
        mind.start_local_hand(url)


def local_hand(config: Config, url: str, connector: Connector | None = None) -> HandNode:
    """The embedded set-up's Hand, dialling the Mind at ``url``. In this
    process: the Mind's home and its database (wherever ``--store`` put it)
    are this Hand's own, and never reachable by a tool."""
    from halfpi.core.policy import parse_rule
    from halfpi.hand.node import HandNode
    from halfpi.hand.policy import HandPolicy
    from halfpi.mind.redaction import configured_secrets

    rules = {tool: parse_rule(rule) for tool, rule in config.hand_approval}
    hand = HandNode(
        url,
        config.hand_token_path.read_text().strip(),
        config.local_hand_label,
        policy=HandPolicy(config.hand_roots, rules, config.private_paths),
        state_dir=config.home / "hands",
    )
    if connector is not None:
        hand.connector = connector
    hand.announce = True  # how its commands are confined, said at the start
    # In the Mind's process: its tools' output is redacted of the Mind's own
    # secrets before it reaches a task log (mind/redaction.py).
    hand.secrets = partial(configured_secrets, config)
    return hand


@contextlib.asynccontextmanager
async def running_mind(
    config: Config, agent: Agent | None = None, *, close_wait_s: float = 2.0
) -> AsyncIterator[tuple[Mind, Server]]:
    """A started Mind, its server (``config.server``) listening and (by
    default) its local Hand connected to it; on exit: stop accepting, drain
    the Mind (close Faces with 1012, end chats as ``interrupted``, close the
    store), wait a bounded time for connections to close."""
    prepare_home(config.home)
    # One Mind per home (DESIGN §12): locked before the store is opened or
    # anything is written; held until the end (released with this frame).
    home_lock = HomeLock.take(config.home)
    try:
        check_listen(config.host, config.port)  # before the Mind touches its store
        mind = build_mind(config, agent)
        try:
            await mind.start()
        except StoreError as exc:  # one line naming the database (DESIGN §12)
            raise CannotStart(str(exc)) from None
        server = server_class(config.server)(mind)
        try:
            await server.start()
        except OSError as exc:  # lost a race for the port since check_listen
            await mind.drain()
            raise CannotStart(_listen_error(config.host, config.port, exc)) from None
        if config.local_hand:
            # The local Hand dials the address the server listens on.
            start_local_hand(mind, dial_url(config, server.port, "/v1/hand"))
            await local_hand_linked(mind, LOCAL_HAND_LINK_S)
        try:
            yield mind, server
        finally:
            server.stop_accepting()
            await mind.drain()
            await server.wait_closed(close_wait_s)
    finally:
        home_lock.release()


# How long a starting Mind waits for its local Hand's link before it says
# it listens: its start-up checks (namespaces, cgroups) take some tens of
# milliseconds, and a chat sent the moment the Mind listens must not find
# "no Hand is connected".
LOCAL_HAND_LINK_S = 5.0


async def local_hand_linked(mind: Mind, within_s: float) -> None:
    """Wait, at most ``within_s``, until the local Hand is linked; past that
    the Mind serves anyway (its tools wait for the Hand) and says so once."""
    hand = mind.local_hand
    if hand is None:
        return
    try:
        await asyncio.wait_for(hand.connected.wait(), within_s)
    except TimeoutError:
        log.warning("the local Hand has not linked within %.0f s; serving without it", within_s)


def dial_url(config: Config, port: int, path: str) -> str:
    """The URL a client on this machine dials to reach the Mind (loopback
    when it listens on every address)."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(
        config.host, f"[{config.host}]" if ":" in config.host else config.host
    )
    scheme = "wss" if config.tls_cert is not None else "ws"
    return f"{scheme}://{host}:{port}{path}"


def check_listen(host: str, port: int) -> None:
    """Fail early, with one line, when ``host:port`` cannot be listened on."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, type_, proto, _, address in infos:
            with socket.socket(family, type_, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except (OSError, OverflowError) as exc:
        raise CannotStart(_listen_error(host, port, exc)) from None


def _listen_error(host: str, port: int, exc: Exception) -> str:
    where = f"cannot listen on {f'[{host}]' if ':' in host else host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: cannot resolve the host {host!r} (check --host)"
    code = exc.errno if isinstance(exc, OSError) else None
    if code == errno.EADDRINUSE:
        return (
            f"{where}: the address is already in use (another halfpi mind?); "
            "choose another --port, or --port 0 for a free one"
        )
    if code == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine (check --host)"
    if code == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges; check --port)"
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"{where}: {why}"


async def build_http_door_ahead(config: Config) -> None:
    """The native server's HTTP door, imported in a worker thread right after
    ``listening``. Imported on the loop by the first HTTP request, its
    ~0.2 to 0.4 s of imports (uvicorn, Starlette, AG-UI's models) stalled every
    Face's frames; in a thread the loop keeps serving meanwhile, and the
    first request finds the modules loaded (its own build takes ~1 ms).
    The start itself stays as fast (docs/performance.md, "Start-up")."""
    if config.server != "native":
        return  # the ASGI server has its app from the start
    from halfpi.gateway.handover import HttpHandover

    try:
        # A throwaway instance: it imports exactly what the real one needs.
        await asyncio.to_thread(HttpHandover, lambda: None)
    except Exception as exc:  # the first HTTP request builds it then, as before
        log.warning("the HTTP door was not prepared ahead (%s); the first HTTP request "
                    "prepares it", exc)


async def serve(config: Config) -> None:
    """Serve until SIGINT/SIGTERM, then drain (see :func:`running_mind`).

    While it serves, ``HOME/mind.json`` says where (DESIGN §12)."""
    make_undumpable()  # its commands cannot read its /proc entries (undumpable.py)
    async with running_mind(config) as (mind, server):
        address = Address(
            os.getpid(),
            dial_url(config, server.port, "/v1/face"),
            dial_url(config, server.port, "/v1/hand"),
            time.time(),
        )
        # The signals are the Mind's before it says it listens: a SIGTERM
        # sent the moment the line is read drains like any other.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        write_address(config.home, address)
        ready = {
            "event": "listening",
            "url": f"{'wss' if config.tls else 'ws'}://{config.host}:{server.port}/v1/face",
            # The web face and the HTTP door, on the same port.
            "web": f"{'https' if config.tls else 'http'}://{config.host}:{server.port}/",
            "port": server.port,
            "node_id": mind.node_id,
            "home": str(config.home),
        }
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        ahead = asyncio.create_task(build_http_door_ahead(config))
        try:
            await stop.wait()
        finally:
            ahead.cancel()
            remove_address(config.home, address.pid)
        log.info("draining")
    log.info("stopped")
