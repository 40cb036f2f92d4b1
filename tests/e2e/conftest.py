"""The end-to-end suite runs against both servers (``halfpi mind --server``).

``server_kind`` is ``native`` (halfpi's own WebSocket server) or ``asgi``
(the Starlette application under uvicorn). The ``lmind`` and ``mind_proc``
fixtures take it, so every test that uses them runs once per server; a test
that starts its own Mind asks for ``server_kind`` and passes it on. A test
of the Mind's own logic that is long and says nothing more about the
transport may keep to some servers: ``@pytest.mark.servers("native")``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

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
    async with local_mind(tmp_path / "home", server=server_kind) as m:
        yield m


@pytest.fixture
def mind_proc(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    proc = MindProcess(tmp_path / "home", server=server_kind)
    (tmp_path / "home").mkdir()
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def paced_mind(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    """A ``halfpi mind`` whose scripted agent streams a word every 5 ms (a
    reply long enough to be cut in the middle), logging at debug level (so
    a test can show what is never logged)."""
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, delta_ms=5.0, server=server_kind,
                       extra_args=("--log-level", "debug")).start()
    try:
        yield mind
    finally:
        mind.kill()


@pytest.fixture
def fast_mind(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    """A ``halfpi mind`` streaming a word every 2 ms: a pace a reader in
    this process keeps up with, and one that reads nothing falls behind."""
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, delta_ms=2.0, server=server_kind).start()
    try:
        yield mind
    finally:
        mind.kill()
