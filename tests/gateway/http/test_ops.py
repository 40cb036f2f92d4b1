"""``/healthz`` and ``/readyz`` on both servers, without a token
(docs/operations.md, "Health and metrics")."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from halfpi.gateway.asgi import AsgiGateway
from halfpi.gateway.http import ops
from tests.support.client import FaceClient
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


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) → value."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.parametrize("server", ["native", "asgi"])
async def test_metrics_count_a_chat_its_requests_and_its_connection_on_both_servers(
    tmp_path: Path, server: str
) -> None:
    async with local_mind(tmp_path / "home", server=server) as lmind, \
            httpx.AsyncClient(base_url=base_url(lmind.url)) as client:
        before = scrape((await client.get("/metrics")).text)
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        chat = await face.chat_to_end(cid, "hello there", request_id="m-1")
        assert chat["payload"]["status"] == "succeeded", chat
        await face.chat_to_end(cid, "hello there", request_id="m-1")  # a replay
        conflict = await face.chat_to_end(cid, "something else", request_id="m-1")
        assert conflict["payload"]["code"] == "request_conflict"
        answer = await client.get("/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain")
        after = scrape(answer.text)
        assert value(after, "halfpi_connections", transport="websocket", profile="operator") == 1
        assert value(after, "halfpi_subscriptions") == 1
        assert value(after, "halfpi_chats_total", status="succeeded") == 1
        assert value(after, "halfpi_chat_seconds_count") == 1
        assert value(after, "halfpi_requests_total", outcome="admitted") - value(
            before, "halfpi_requests_total", outcome="admitted") == 2  # the create and the chat
        assert value(after, "halfpi_requests_total", outcome="replayed") == 1
        assert value(after, "halfpi_requests_total", outcome="conflict") == 1
        published = value(after, "halfpi_events_published_total")
        assert published > value(before, "halfpi_events_published_total")
        assert value(after, "halfpi_messages_delivered_total") >= published
        assert value(after, "halfpi_store_commit_seconds_count") > value(
            before, "halfpi_store_commit_seconds_count")
        assert value(after, "halfpi_journal_bytes") > 0
        await face.close()


async def test_a_failed_handshake_is_counted_never_with_its_token(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", server="native") as lmind, \
            httpx.AsyncClient(base_url=base_url(lmind.url)) as client:
        face = await FaceClient.connect(lmind.url, hello=False)
        await face.send("face.hello", {"token": "wrong-token-123", "protocol": 3,
                                       "client": {"name": "test", "version": "0"}})
        await face.closed_with()
        answer = await client.get("/metrics")
        assert value(scrape(answer.text), "halfpi_handshakes_failed_total", kind="face") == 1
        assert "wrong-token-123" not in answer.text


async def test_a_reset_is_counted_by_its_reason(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", server="native") as lmind, \
            httpx.AsyncClient(base_url=base_url(lmind.url)) as client:
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        accepted = await face.subscribe(cid, since="e0ther.3")  # an epoch it never had
        assert accepted["payload"]["conversations"] == {cid: "reset"}
        answer = await client.get("/metrics")
        assert value(scrape(answer.text), "halfpi_resets_total", reason="epoch_changed") == 1
        await face.close()


async def test_metrics_with_a_token_answer_only_that_bearer(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", server="asgi", metrics_token="scrape-me") as lmind, \
            httpx.AsyncClient(base_url=base_url(lmind.url)) as client:
        assert (await client.get("/metrics")).status_code == 401
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["code"] == "unauthorized"
        face = await client.get("/metrics", headers={"Authorization": f"Bearer {lmind.token}"})
        assert face.status_code == 401  # a face token is not the scrape token
        right = await client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert right.status_code == 200
        assert "halfpi_info" in right.text
