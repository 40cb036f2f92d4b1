"""Shared pieces of the cluster-mode benchmarks (``pg_append.py``,
``cluster_fanout.py``): the tests' throw-away PostgreSQL and redis-server
(``tests/support/postgres.py``, ``tests/support/redis.py``), the CPU of
every PostgreSQL process, and ``halfpi mind`` nodes sharing both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _bench import PYTHON, ROOT, Server, cpu_seconds

sys.path.insert(0, str(ROOT))
from tests.support import postgres as pg_support  # the tests' throw-away servers
from tests.support import redis as redis_support

PostgresServer = pg_support.PostgresServer
RedisServer = redis_support.RedisServer


def stop_cleanly_on_sigterm() -> None:
    """SIGTERM (a ``timeout``, a CI job stopped) unwinds like Ctrl-C, so the
    ``finally`` blocks stop the servers and nodes this benchmark started."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def missing() -> str | None:
    """Why the cluster benchmarks cannot run here, or None."""
    for binary in ("initdb", "pg_ctl", "postgres", "redis-server"):
        if shutil.which(binary) is None:
            return f"{binary} is not on PATH (apt-get install postgresql redis-server)"
    return pg_support.missing()


def start_postgres(*, durable: bool = True) -> PostgresServer:
    """A throw-away PostgreSQL; ``durable``: with PostgreSQL's defaults
    (fsync, synchronous_commit on). Stop it with ``.stop()``."""
    return pg_support.start_server(durable=durable)


def start_redis() -> RedisServer:
    """A throw-away redis-server (no persistence). Stop it with :func:`stop_redis`."""
    server = RedisServer(redis_support.free_port(), tempfile.mkdtemp(prefix="halfpi-redis-"))
    server.start()
    return server


def stop_redis(server: RedisServer) -> None:
    server.kill()
    shutil.rmtree(server.folder, ignore_errors=True)


async def create_database(pg: PostgresServer, name: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(pg.url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return pg.database_url(name)


class PgCpu:
    """CPU of every process of one PostgreSQL server (the postmaster and its
    children: backends, WAL writer, checkpointer), read from /proc."""

    def __init__(self, pg: PostgresServer) -> None:
        self.postmaster = 0
        if pg.folder is not None:
            pid_file = pg.folder / "data" / "postmaster.pid"
            self.postmaster = int(pid_file.read_text().split()[0])

    def pids(self) -> list[int]:
        if not self.postmaster:
            return []
        found = [self.postmaster]
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == self.postmaster:
                found.append(int(entry))
        return found

    def snapshot(self) -> dict[int, float]:
        out = {}
        for pid in self.pids():
            try:
                out[pid] = cpu_seconds(pid)
            except OSError:
                continue
        return out

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        """CPU seconds between two snapshots (a process started meanwhile
        counts whole, one gone counts nothing)."""
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def face_add(store_url: str, label: str, home: Path) -> str:
    """``halfpi face add --store URL LABEL``: an operator credential every
    node knows (credentials live in PostgreSQL); its token."""
    home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [PYTHON, "-m", "halfpi.cli", "face", "add", "--home", str(home), "--store", store_url,
         label],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"halfpi face add failed: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def mind_flags() -> str:
    """``halfpi mind --help``: which flags this halfpi has."""
    return subprocess.run([PYTHON, "-m", "halfpi.cli", "mind", "--help"], capture_output=True,
                          text=True, check=False, cwd=ROOT).stdout


class ClusterNode(Server):
    """One ``halfpi mind`` node of a cluster: its own home and port, the
    shared PostgreSQL Store and Redis, its node id; the scripted agent at
    ``delta_ms`` between deltas."""

    def __init__(self, home: Path, *, node_id: str, store_url: str, redis_url: str,
                 token: str, delta_ms: float, lease_ms: int | None = None) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HALFPI_HOME=str(home), HALFPI_SCRIPTED_DELTA_MS=str(delta_ms),
                   PYTHONUNBUFFERED="1")
        argv = [PYTHON, "-m", "halfpi.cli", "mind", "--home", str(home), "--port", "0",
                "--store", store_url, "--redis", redis_url, "--node-id", node_id,
                "--log-level", "warning", "--no-local-hand",  # no tools run here
                "--max-connections-per-principal", "0"]  # 100 Faces share one token
        if lease_ms is not None:
            argv += ["--lease-ms", str(lease_ms)]
        super().__init__(argv, env, home / "mind.log")
        self.node_id = node_id
        self.token = token


def describe(node: ClusterNode) -> dict[str, Any]:
    return {"node": node.node_id, "pid": node.pid, "url": node.url}
