"""Operating a real ``halfpi mind`` process: readiness with a Redis
journal, the dashboard's metrics (docs/operations.md, "Health and metrics")."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from halfpi.mind.health import TIMEOUT_S, TTL_S
from tests.support.client import FaceClient
from tests.support.http_door import base_url
from tests.support.mind import MindProcess
from tests.support.postgres import fresh_database
from tests.support.redis import RedisServer, redis_server  # noqa: F401
from tests.support.tmpfs import fill, small_filesystem

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


async def first_answer_not(client: httpx.AsyncClient, status: int) -> httpx.Response:
    """Poll ``/readyz`` until it answers other than ``status``; within one
    probe: its answer is kept ``TTL_S`` and each part has ``TIMEOUT_S``
    (plus 2 s for a loaded machine)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TTL_S + TIMEOUT_S + 2
    while (ready := await client.get("/readyz")).status_code == status:
        assert loop.time() < deadline, f"still {status} after one probe: {ready.text}"
        await asyncio.sleep(0.05)
    return ready


async def test_readiness_follows_the_disk_of_a_real_mind_as_it_fills_and_frees(
    tmp_path: Path, server_kind: str,
) -> None:
    """docs/operations.md: "a database that refuses writes shows". A Mind
    whose home is on a 2 MiB filesystem: full and idle, the next probe says
    503; a chat's failed commit says it at once; room back, the next probe
    says 200 and chats commit again."""
    with small_filesystem(tmp_path / "disk") as disk:
        home = disk / "home"
        home.mkdir()
        mind = MindProcess(home, server=server_kind).start()
        try:
            face = await FaceClient.connect(mind.url, mind.token)
            cid = await face.create_conversation()
            async with httpx.AsyncClient(base_url=base_url(mind.url)) as client:
                assert (await client.get("/readyz")).status_code == 200
                filler = fill(disk)
                ready = await first_answer_not(client, 200)
                assert ready.status_code == 503
                # the probe's own write failed to commit, or its room was refused
                assert ready.json()["checks"]["store"] in (
                    "the last commit failed", "its disk has no room (ENOSPC)")

                filler.unlink()
                assert (await first_answer_not(client, 503)).status_code == 200
                assert (await face.chat_to_end(cid, "hello"))["type"] == "face.result"

                filler = fill(disk)
                failed = await face.chat_to_end(cid, "x" * 8000)
                assert failed["type"] == "face.error", failed
                assert "disk is full" in failed["payload"]["message"]
                at_once = await client.get("/readyz")  # no probe in between
                assert at_once.status_code == 503
                assert at_once.json()["checks"]["store"] == "the last commit failed"

                filler.unlink()
                assert (await first_answer_not(client, 503)).status_code == 200
                assert (await face.chat_to_end(cid, "hello"))["type"] == "face.result"
            await face.close()
        finally:
            mind.kill()


DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def dashboard_metrics() -> set[str]:
    """Every halfpi_* name the dashboard's queries use."""
    text = DOCS.read_text()
    block = text.split("<!-- dashboard:begin -->", 1)[1].split("<!-- dashboard:end -->", 1)[0]
    dashboard = json.loads(block.strip().removeprefix("```json").removesuffix("```"))
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    return {name for expr in exprs for name in re.findall(r"\bhalfpi_[a-z_]+", expr)}


async def scrape_after_a_chat(home: Path, *extra_args: str) -> str:
    home.mkdir()
    mind = MindProcess(home, extra_args=extra_args).start()
    try:
        face = await FaceClient.connect(mind.url, mind.token)
        cid = await face.create_conversation()
        await face.chat_to_end(cid, "hello")
        await face.close()
        async with httpx.AsyncClient(base_url=base_url(mind.url)) as client:
            return (await client.get("/metrics")).text
    finally:
        mind.terminate()


async def test_every_metric_of_the_dashboard_is_in_a_scrape_of_a_real_mind(
    tmp_path: Path, redis_server: RedisServer,  # noqa: F811
) -> None:
    # The in-process journal's metrics, and a cluster node's (the Redis
    # journal's and the cluster's own): one Mind each.
    scrape = await scrape_after_a_chat(tmp_path / "home")
    scrape += await scrape_after_a_chat(
        tmp_path / "node-home", "--store", fresh_database(), "--redis", redis_server.url,
        "--node-id", "a")
    types = {line.split()[2]: line.split()[3] for line in scrape.splitlines()
             if line.startswith("# TYPE ")}
    used = dashboard_metrics()
    assert len(used) >= 20, used
    for name in sorted(used):
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        assert name in types or types.get(family) == "histogram", f"{name} is not scraped"
    written = [line for line in scrape.splitlines()
               if line.startswith("halfpi_journal_written_bytes_total ")]
    assert len(written) == 1 and float(written[0].split()[1]) > 0, written
