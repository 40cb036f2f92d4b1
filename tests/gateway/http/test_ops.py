"""``/healthz`` and ``/readyz`` on both servers, without a token
(docs/operations.md, "Health and metrics")."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from halfpi.gateway.asgi import AsgiGateway
from halfpi.gateway.http import ops
from tests.support.http_door import base_url
from tests.support.mind import local_mind


@pytest.mark.parametrize("server", ["native", "asgi"])
async def test_health_and_readiness_answer_without_a_token_on_both_servers(
    tmp_path: Path, server: str
) -> None:
    async with local_mind(tmp_path / "home", server=server) as lmind, \
            httpx.AsyncClient(base_url=base_url(lmind.url)) as client:
        health = await client.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok\n")
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready", "checks": {"store": "ok", "journal": "ok"}}


async def test_readiness_is_503_naming_the_store_when_it_takes_no_write(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", server="native") as lmind, \
            httpx.AsyncClient(base_url=base_url(lmind.url)) as client:
        await lmind.mind.store.close()  # the writer is gone: writes are refused
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["store"] == "unreachable (StoreError)"
        assert (await client.get("/healthz")).status_code == 200  # still up


async def test_a_mind_not_serving_yet_is_up_but_not_ready() -> None:
    gateway = AsgiGateway()  # a mounted app before its lifespan started the Mind
    transport = httpx.ASGITransport(app=gateway)
    async with httpx.AsyncClient(transport=transport, base_url="http://mind") as client:
        assert (await client.get(ops.HEALTHZ)).status_code == 200
        ready = await client.get(ops.READYZ)
        assert ready.status_code == 503
        assert ready.json()["status"] == "unavailable"
