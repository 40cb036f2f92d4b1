"""A cluster of real ``halfpi mind`` nodes on one PostgreSQL and one Redis (DESIGN §10).

:func:`running_cluster` starts a throw-away PostgreSQL database
(:mod:`tests.support.postgres`) and a ``redis-server`` of the test's own
(:mod:`tests.support.redis`), creates one Face credential in PostgreSQL
with the real CLI (``halfpi face add --store postgresql://…``), then starts
N ``halfpi mind`` processes, each with its own ``--home``, a free port of
127.0.0.1, ``--store``, ``--redis``, ``--node-id`` and ``--lease-ms``. A node
is ready when it has printed its JSON line (it listens); nothing waits by
sleeping. A test can ``kill -9`` a node, pause it (SIGSTOP) and let it run
on (SIGCONT), start it again on the same port, and restart Redis (stopped,
then started on the same port without its data).

Everything is stopped when the block ends, passed or failed: every node is
killed (a paused one too), Redis is stopped, and each node's log is kept in
its home (``HOME/mind.log``, shown by :meth:`Cluster.logs`). Without
PostgreSQL or ``redis-server`` the tests skip, unless ``HALFPI_PG=required``
or ``HALFPI_REDIS=required``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cli import AddedFace, face_add
from tests.support.client import FaceClient, connect_new_credential
from tests.support.mind import MindProcess
from tests.support.postgres import fresh_database
from tests.support.redis import RedisServer, free_port, require_redis_server

LEASE_MS = 1000  # short, so that a take-over after a kill comes quickly
START_TIMEOUT_S = 30.0  # a loaded machine starts a Python process slowly


def node_args(store_url: str, redis_url: str, name: str, lease_ms: int,
              *extra: str) -> tuple[str, ...]:
    """What makes ``halfpi mind`` node ``name`` of a cluster."""
    return ("--store", store_url, "--redis", redis_url, "--node-id", name,
            "--lease-ms", str(lease_ms), *extra)


@dataclass
class Backing:
    """A cluster's shared parts: a throw-away PostgreSQL database and a
    ``redis-server`` of its own (skips, or fails when required, without
    either)."""

    store_url: str
    redis: RedisServer

    @classmethod
    def start(cls) -> Backing:
        require_redis_server()
        store_url = fresh_database()  # skips without PostgreSQL
        redis = RedisServer(free_port(), tempfile.mkdtemp(prefix="halfpi-redis-"))
        redis.start()
        return cls(store_url, redis)

    def stop(self) -> None:
        self.redis.kill()
        shutil.rmtree(self.redis.folder, ignore_errors=True)


class Node:
    """One ``halfpi mind`` of the cluster."""

    def __init__(self, name: str, home: Path, args: tuple[str, ...], delta_ms: float) -> None:
        self.name = name
        self.proc = MindProcess(home, delta_ms=delta_ms, extra_args=args)
        self.paused = False

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.proc is not None and self.proc.proc.poll() is None

    async def start(self) -> Node:
        """Start (or start again, on the same port) and wait until it listens."""
        await asyncio.to_thread(self.proc.start, START_TIMEOUT_S)
        self.paused = False
        return self

    def kill(self) -> None:
        """``kill -9``: no drain, no goodbye (a paused node too)."""
        self.proc.kill()
        self.paused = False

    async def restart(self) -> Node:
        self.kill()
        return await self.start()

    def pause(self) -> None:
        """SIGSTOP: the process stays, frozen, its sockets open."""
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT: it runs on from where it was frozen."""
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def log(self) -> str:
        return self.proc.log()


@dataclass
class Cluster:
    root: Path
    store_url: str
    redis: RedisServer
    credential: AddedFace
    lease_ms: int
    delta_ms: float
    local_hand: bool = True
    nodes: dict[str, Node] = field(default_factory=dict)
    faces: list[FaceClient] = field(default_factory=list)

    @property
    def token(self) -> str:
        return self.credential.token

    def node_args(self, name: str) -> tuple[str, ...]:
        extra = () if self.local_hand else ("--no-local-hand",)
        return node_args(self.store_url, self.redis.url, name, self.lease_ms, *extra)

    async def add(self, *names: str) -> list[Node]:
        """Start nodes (at once) and wait until every one listens."""
        fresh = []
        for name in names:
            home = self.root / name
            home.mkdir()
            node = Node(name, home, self.node_args(name), self.delta_ms)
            self.nodes[name] = node
            fresh.append(node)
        await asyncio.gather(*(node.start() for node in fresh))
        return fresh

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    async def face(self, node: str | Node) -> FaceClient:
        """A Face (the test's credential) connected to a node; closed at the end."""
        target = node if isinstance(node, Node) else self.nodes[node]
        client = await connect_new_credential(target.url, self.token, timeout=10)
        self.faces.append(client)
        return client

    async def restart_redis(self) -> None:
        """Stop redis-server and start it again on the same port: its data is gone."""
        self.redis.kill()
        await asyncio.to_thread(self.redis.start)

    async def sql(self, query: str, *args: Any) -> list[Any]:
        """Rows of a query on the cluster's PostgreSQL database."""
        import asyncpg

        conn = await asyncpg.connect(self.store_url, timeout=10)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    async def events(self, conversation_id: str) -> list[tuple[int, str]]:
        """The durable events of a conversation, ``(seq, type)`` in seq order."""
        rows = await self.sql(
            "SELECT seq, type FROM events WHERE conversation_id = $1 ORDER BY seq",
            conversation_id,
        )
        return [(int(r["seq"]), str(r["type"])) for r in rows]

    async def lease_holder(self, conversation_id: str) -> tuple[str, int] | None:
        """``(node, fence)`` of the conversation's lease in Redis, or None."""
        from redis.asyncio import Redis

        from halfpi.cluster.lease import Leases

        client = Redis.from_url(self.redis.url)
        try:
            lease = await Leases(client, "observer").holder(conversation_id)
        finally:
            await client.aclose()
        return None if lease is None else (lease.node_id, lease.fence)

    def logs(self) -> str:
        return "\n".join(
            f"--- node {name} ({'alive' if node.alive else 'dead'}) ---\n{node.log()}"
            for name, node in self.nodes.items()
        )

    async def stop(self) -> None:
        for client in self.faces:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 2)
        for node in self.nodes.values():
            node.kill()
        self.redis.kill()


@contextlib.asynccontextmanager
async def running_cluster(
    root: Path, names: tuple[str, ...] = ("a", "b", "c"), *,
    lease_ms: int = LEASE_MS, delta_ms: float = 5.0, local_hand: bool = True,
) -> AsyncIterator[Cluster]:
    """A cluster of ``names`` nodes, stopped (all of it) when the block ends;
    then the nodes' logs are printed (pytest shows them when a test failed)."""
    backing = await asyncio.to_thread(Backing.start)
    cluster: Cluster | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cli").mkdir()
        credential = await face_add(root / "cli", "cluster-face", "--store", backing.store_url)
        cluster = Cluster(root, backing.store_url, backing.redis, credential, lease_ms,
                          delta_ms, local_hand)
        if names:
            await cluster.add(*names)
        yield cluster
    finally:
        if cluster is not None:
            await cluster.stop()
            print(cluster.logs())  # pytest shows it when the test failed
        backing.stop()
