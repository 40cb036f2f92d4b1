"""Operating a real ``halfpi mind`` process: readiness with a Redis
journal (docs/operations.md, "Health and metrics")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support.http_door import base_url
from tests.support.mind import MindProcess
from tests.support.redis import RedisServer, redis_server  # noqa: F401

pytestmark = pytest.mark.e2e


async def test_readiness_names_the_redis_journal_once_redis_is_gone(
    tmp_path: Path, redis_server: RedisServer,  # noqa: F811
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, extra_args=("--redis", redis_server.url)).start()
    try:
        async with httpx.AsyncClient(base_url=base_url(mind.url)) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["checks"] == {"store": "ok", "journal": "ok"}
            redis_server.kill()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while (ready := await client.get("/readyz")).status_code == 200:
                assert loop.time() < deadline, "still ready without Redis"
                await asyncio.sleep(0.1)  # the last answer is kept for 1 s
            assert ready.status_code == 503
            checks = ready.json()["checks"]
            assert checks["store"] == "ok"
            assert checks["journal"].startswith("unreachable"), checks
            assert "redis://" not in ready.text
    finally:
        mind.kill()
