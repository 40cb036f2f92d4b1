"""The end-to-end suite runs against both servers (``halfpi mind --server``).

``server_kind`` is ``native`` (halfpi's own WebSocket server) or ``asgi``
(the Starlette application under uvicorn). The ``lmind`` and ``mind_proc``
fixtures take it, so every test that uses them runs once per server; a test
that starts its own Mind asks for ``server_kind`` and passes it on. A test
of the Mind's own logic that is long and says nothing more about the
transport may keep to some servers: ``@pytest.mark.servers("native")``.

``cluster`` is a third kind a test (or a module) asks for by name,
``@pytest.mark.servers("native", "asgi", "cluster")``: two ``halfpi mind``
nodes on one PostgreSQL and one Redis behind a round-robin proxy
(tests/support/cluster_mind.py), which the test sees as one Mind — every
new connection lands on the other node (DESIGN §10).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.cluster_mind import CLUSTER, started_mind, stop_mind
from tests.support.log_secrets import (  # noqa: F401  (autouse)
    logs_hold_no_secret,
    session_logs_hold_no_secret,
)
from tests.support.mind import LocalMind, MindProcess, local_mind

SERVER_KINDS = ("native", "asgi")
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "servers(*kinds): run only against these servers")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "server_kind" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("servers")
        metafunc.parametrize("server_kind", marker.args if marker else SERVER_KINDS)


@pytest.fixture
async def lmind(tmp_path: Path, server_kind: str) -> AsyncIterator[LocalMind]:
    """A Mind in this process (for a ``cluster`` test: the cluster, which
    has the ``url`` and ``token`` such tests use)."""
    if server_kind == CLUSTER:
        cluster = started_mind(tmp_path / "home", CLUSTER)
        try:
            yield cluster
        finally:
            stop_mind(cluster)
        return
    async with local_mind(tmp_path / "home", server=server_kind) as m:
        yield m


@pytest.fixture
def mind_proc(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    proc = started_mind(tmp_path / "home", server_kind)
    try:
        yield proc
    finally:
        stop_mind(proc)


@pytest.fixture
def paced_mind(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    """A ``halfpi mind`` whose scripted agent streams a word every 5 ms (a
    reply long enough to be cut in the middle), logging at debug level (so
    a test can show what is never logged)."""
    mind = started_mind(tmp_path / "home", server_kind, delta_ms=5.0,
                        extra_args=("--log-level", "debug"))
    try:
        yield mind
    finally:
        stop_mind(mind)


@pytest.fixture
def fast_mind(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    """A ``halfpi mind`` streaming a word every 2 ms: a pace a reader in
    this process keeps up with, and one that reads nothing falls behind."""
    mind = started_mind(tmp_path / "home", server_kind, delta_ms=2.0)
    try:
        yield mind
    finally:
        stop_mind(mind)
