"""A two-node cluster that an end-to-end test sees as one Mind (DESIGN §10).

:class:`ClusterMind` starts a throw-away PostgreSQL database and its own
``redis-server``, then ``halfpi mind`` nodes ``a`` and ``b`` (real
processes: ``--store postgresql://… --redis … --node-id``), and puts a
round-robin TCP proxy in front of them: each new connection goes to the
next node. So a Face that reconnects lands on the other node, two devices
racing an approval decide on different nodes, and a command is often
forwarded to the conversation's owner. It has what the e2e suite uses of a
:class:`~tests.support.mind.MindProcess` (``url``, ``port``, ``token``,
``home``, ``proc``, ``start``, ``kill``), so the suite's tests run against
it unchanged (``server_kind == "cluster"``, tests/e2e/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

from tests.support.cluster import Backing, node_args
from tests.support.mind import MindProcess

CLUSTER = "cluster"  # the e2e suite's name for this kind of Mind
NODES = ("a", "b")
LEASE_MS = 1500


class RoundRobin:
    """A TCP proxy on 127.0.0.1 sending each new connection to the next
    target, in its own thread (sync and async tests alike can use it)."""

    def __init__(self, targets: list[int]) -> None:
        self.targets = targets
        self.port = 0
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="round-robin proxy", daemon=True)

    def start(self) -> RoundRobin:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the round-robin proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.targets[self._next % len(self.targets)]
        self._next += 1
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


class ClusterMind:
    """Nodes ``a`` and ``b`` on one PostgreSQL and one Redis, behind one port."""

    def __init__(self, home: Path, *, delta_ms: float = 0.0,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.home = home  # node a's home (its face.token, its log)
        self.delta_ms = delta_ms
        self.extra_args = extra_args
        self.backing = Backing.start()
        self.store_url = self.backing.store_url
        self.nodes = [
            MindProcess(
                home if name == "a" else home.parent / f"{home.name}-{name}",
                delta_ms=delta_ms,
                extra_args=node_args(self.store_url, self.backing.redis.url, name, LEASE_MS,
                                     *extra_args),
            )
            for name in NODES
        ]
        self.proxy: RoundRobin | None = None
        self.url = ""
        self.port = 0
        self.ready: dict[str, Any] = {}

    @property
    def token(self) -> str:
        """The operator token node ``a`` wrote at its first start (credentials
        are in PostgreSQL: it works on every node)."""
        return self.nodes[0].token

    @property
    def proc(self) -> Any:
        return self.nodes[0].proc

    def start(self, timeout: float = 30.0) -> ClusterMind:
        for node in self.nodes:  # a first: it creates the operator credential
            node.home.mkdir(parents=True, exist_ok=True)
            node.start(timeout)
        if self.proxy is None:
            self.proxy = RoundRobin([n.port for n in self.nodes]).start()
        self.port = self.proxy.port
        first = self.nodes[0]
        self.url = first.url.replace(f":{first.port}/", f":{self.port}/")
        self.ready = dict(first.ready, port=self.port, url=self.url)
        return self

    def kill(self) -> None:
        """Every node, ``kill -9``."""
        for node in self.nodes:
            node.kill()

    def stop(self) -> None:
        self.kill()
        if self.proxy is not None:
            self.proxy.stop()
        self.backing.stop()

    def log(self) -> str:
        return "\n".join(f"--- node {n.home.name} ---\n{n.log()}" for n in self.nodes)


def started_mind(home: Path, server_kind: str, *, delta_ms: float = 0.0,
                 extra_args: tuple[str, ...] = ()) -> Any:
    """A started ``halfpi mind`` of ``server_kind`` (``native``/``asgi``: a
    MindProcess; ``cluster``: a ClusterMind); stop it with :func:`stop_mind`."""
    if server_kind == CLUSTER:
        return ClusterMind(home, delta_ms=delta_ms, extra_args=extra_args).start()
    home.mkdir(parents=True, exist_ok=True)
    return MindProcess(home, delta_ms=delta_ms, server=server_kind,
                       extra_args=extra_args).start()


def stop_mind(mind: Any) -> None:
    if isinstance(mind, ClusterMind):
        mind.stop()
    else:
        mind.kill()
