"""A real PostgreSQL for tests: a throw-away server started on first use.

``initdb``, ``pg_ctl`` and ``postgres`` must be on PATH; they refuse to run
as root, so as root they run as the ``postgres`` user (``runuser``). The
server listens on a free 127.0.0.1 port with its data in a temporary folder,
and is stopped (``pg_ctl stop -m immediate``) and removed when the test run
ends. ``HALFPI_PG_URL`` names a server to use instead (its user must be
allowed to create databases). Every test gets a fresh, empty database of its
own (:func:`fresh_database`).

Where the binaries or asyncpg are missing the PostgreSQL tests are skipped,
unless ``HALFPI_PG=required`` (``.ci/run`` sets it), where they fail saying
what is missing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support import programs

REQUIRED = os.environ.get("HALFPI_PG") == "required"
BINARIES = ("initdb", "pg_ctl", "postgres")
T = TypeVar("T")


def missing() -> str | None:
    """Why no PostgreSQL can run here, or None."""
    if importlib.util.find_spec("asyncpg") is None:
        return "asyncpg is not installed (pip install -e '.[dev]')"
    if os.environ.get("HALFPI_PG_URL"):
        return None
    absent = [b for b in BINARIES if programs.which(b) is None]
    if absent:
        return f"PostgreSQL's {', '.join(absent)} not on PATH (apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root needs runuser to start PostgreSQL as the postgres user"
    return None


def require_postgres() -> None:
    why = missing()
    if why is not None and "PATH" in why:  # no PostgreSQL: the run's summary names it
        programs.skip_missing("initdb", why)
    if why is not None:
        if REQUIRED:
            pytest.fail(f"HALFPI_PG=required but {why}")
        pytest.skip(why)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end on a loop of its own, in a thread: callable
    from synchronous code whether or not an event loop is running there."""
    result: list[T] = []
    failure: list[BaseException] = []

    def main() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


@dataclass
class PostgresServer:
    """A running server: ``url`` reaches its maintenance database as a user
    allowed to create databases."""

    url: str
    folder: Path | None = None  # the throw-away server's data (None: HALFPI_PG_URL)
    pg_ctl_as: tuple[str, ...] = ()

    def database_url(self, name: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))

    def stop(self) -> None:
        if self.folder is None:
            return
        subprocess.run(
            [*self.pg_ctl_as, "pg_ctl", "stop", "-D", str(self.folder / "data"), "-m", "immediate"],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None


_lock = threading.Lock()
_server: PostgresServer | None = None
_names = itertools.count(1)


def server() -> PostgresServer:
    """The test run's PostgreSQL, started on first use (skips or fails as
    :func:`require_postgres` says when none can run)."""
    global _server
    require_postgres()
    with _lock:
        if _server is None:
            _server = _start()
            atexit.register(_server.stop)
        return _server


def fresh_database() -> str:
    """The URL of a new, empty database on the test run's server."""
    pg = server()
    name = f"halfpi_t{os.getpid()}_{next(_names)}"

    async def create() -> None:
        import asyncpg

        conn = await asyncpg.connect(pg.url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    run_sync(create())
    return pg.database_url(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start() -> PostgresServer:
    given = os.environ.get("HALFPI_PG_URL")
    if given:
        pg = PostgresServer(given)
        _wait_until_it_answers(pg, deadline=time.monotonic() + 30)
        return pg
    return start_server()


def start_server(*, durable: bool = False) -> PostgresServer:
    """A new throw-away server of the caller's own (stop it with ``stop()``).
    ``durable``: PostgreSQL's own defaults (``fsync``, ``full_page_writes``,
    ``synchronous_commit`` on), as the benchmarks measure it; otherwise, as
    for the tests, no crash safety."""
    folder = Path(tempfile.mkdtemp(prefix="halfpi-pg-"))
    as_user: tuple[str, ...] = ()
    if os.geteuid() == 0:
        as_user = ("runuser", "-u", "postgres", "--")
        shutil.chown(folder, "postgres", "postgres")
    data, port = folder / "data", _free_port()
    _run([*as_user, "initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
    if not durable:  # a throw-away server: no crash safety needed, and the machine is shared
        options += " -c fsync=off -c full_page_writes=off"
    pg = PostgresServer(f"postgresql://postgres@127.0.0.1:{port}/postgres", folder, as_user)
    _run([*as_user, "pg_ctl", "start", "-D", str(data), "-l", str(folder / "log"), "-o", options])
    try:
        _wait_until_it_answers(pg, deadline=time.monotonic() + 60)
    except BaseException:
        pg.stop()
        raise
    return pg


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout}")


def _wait_until_it_answers(pg: PostgresServer, *, deadline: float) -> None:
    """Poll a connection until the server answers, or fail at the deadline."""

    async def poll() -> None:
        import asyncpg

        while True:
            try:
                conn = await asyncpg.connect(pg.url, timeout=5)
            except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not answer at {pg.url}: {exc}") from exc
                await asyncio.sleep(0.05)  # polling a condition with a deadline
                continue
            await conn.close()
            return

    run_sync(poll())


_held = itertools.count(1)


@contextlib.asynccontextmanager
async def hold_postgres_writer(store: Any) -> AsyncIterator[None]:
    """While inside, the Store's writer is busy with a batch of its own (an
    append that waits on a table lock this helper holds): everything written
    meanwhile waits in its queue and is taken as the next batch."""
    import asyncpg

    from halfpi.store.base import StoredEvent, WriteTx

    locker = await asyncpg.connect(store.url)
    held: Any = None
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # reads still pass
        held = store.write(WriteTx(events=[StoredEvent("held", next(_held), "held", b"{}", 0.0)]))
        deadline = time.monotonic() + 30
        while not await locker.fetchval(
            "SELECT count(*) FROM pg_locks WHERE relation = 'events'::regclass AND NOT granted"
        ):
            assert time.monotonic() < deadline, "the writer never reached the held table"
            await asyncio.sleep(0.01)  # polling a condition with a deadline
        yield
    finally:
        await locker.close()  # ends the transaction: the lock is released
        if held is not None:
            assert (await held).committed


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    """The test run's PostgreSQL (started once, stopped when the run ends)."""
    return server()


@pytest.fixture
def pg_url() -> str:
    """The URL of a fresh, empty database of this test's own."""
    return fresh_database()
