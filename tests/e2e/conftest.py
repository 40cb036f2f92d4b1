"""The end-to-end suite runs against both servers (``halfpi mind --server``).

``server_kind`` is ``native`` (halfpi's own WebSocket server) or ``asgi``
(the Starlette application under uvicorn). The ``lmind`` and ``mind_proc``
fixtures take it, so every test that uses them runs once per server; a test
that starts its own Mind asks for ``server_kind`` and passes it on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.mind import LocalMind, MindProcess, local_mind

SERVER_KINDS = ("native", "asgi")


@pytest.fixture(params=SERVER_KINDS)
def server_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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
