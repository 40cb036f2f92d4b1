"""SSE end to end (DESIGN §9, docs/protocol.md §17): a real ``halfpi mind``,
read with httpx + httpx-sse as any HTTP client would, through the fault
proxy where the network must fail."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.client import FaceClient
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy
from tests.support.sse import Reading, chat_completed, read_sse
from tests.support.stream import assert_contiguous, delta_text, positioned

WORDS = 300


def http_url(ws_url: str) -> str:
    return ws_url.replace("ws://", "http://").split("/v1/", 1)[0]


def bearer(token: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **more}


@pytest.mark.e2e
async def test_a_cut_mid_reply_resumes_through_last_event_id_with_no_duplicate_or_gap(
    paced_mind: MindProcess,
) -> None:
    face = await FaceClient.connect(paced_mind.url, paced_mind.token)
    cid = await face.create_conversation()
    proxy = await FaultProxy(paced_mind.port).start()
    try:
        base = f"http://127.0.0.1:{proxy.port}"
        params = {"conversations": cid}
        cut_after = asyncio.Event()
        subscribed = asyncio.Event()

        def count(reading: Reading) -> None:
            subscribed.set()
            if len(reading.events) >= 40:
                cut_after.set()

        first_task = asyncio.create_task(read_sse(
            f"{base}/v1/events", headers=bearer(paced_mind.token), params=params,
            on_event=count, timeout=30))
        await asyncio.wait_for(subscribed.wait(), 10)
        request_id = await face.command("face.chat", conversation_id=cid,
                                        content=f"/repeat {WORDS} word")
        await asyncio.wait_for(cut_after.wait(), 20)
        proxy.cut_all()  # the network goes, mid-reply
        first = await first_task
        assert first.status == 200
        assert first.error is not None, "the stream was not cut"
        assert first.last_id is not None
        second = await read_sse(
            f"{base}/v1/events", headers=bearer(paced_mind.token, **{"Last-Event-ID":
                                                                     first.last_id}),
            params=params, stop=chat_completed(request_id), timeout=30)
        assert second.status == 200
        assert second.frames()[0]["payload"]["replay"] == "exact"
        seen = positioned(first.frames(), cid) + positioned(second.frames(), cid)
        assert_contiguous(seen, seen[0]["payload"]["seq"], seen[-1]["payload"]["seq"])
        text = " ".join(["word"] * WORDS)
        assert delta_text(seen, request_id) == text
        assert seen[-1]["payload"]["data"]["content"] == text
    finally:
        await proxy.stop()
        await face.close()


@pytest.mark.e2e
async def test_I4_kill_9_and_restart_answer_the_resumed_stream_with_a_reset(
    paced_mind: MindProcess,
) -> None:
    face = await FaceClient.connect(paced_mind.url, paced_mind.token)
    cid = await face.create_conversation()
    base = http_url(paced_mind.url)
    subscribed, streaming = asyncio.Event(), asyncio.Event()

    def seen(reading: Reading) -> None:
        subscribed.set()
        if len(reading.events) >= 20:
            streaming.set()

    reading_task = asyncio.create_task(read_sse(
        f"{base}/v1/events", headers=bearer(paced_mind.token), params={"conversations": cid},
        on_event=seen, timeout=30))
    await asyncio.wait_for(subscribed.wait(), 10)
    request_id = await face.command("face.chat", conversation_id=cid, content="/repeat 2000 w")
    await asyncio.wait_for(streaming.wait(), 10)
    paced_mind.kill()
    first = await reading_task
    assert first.last_id is not None and first.error is not None
    paced_mind.start()
    second = await read_sse(
        f"{base}/v1/events", headers=bearer(paced_mind.token, **{"Last-Event-ID": first.last_id}),
        params={"conversations": cid},
        stop=lambda r: any(f["type"] == "face.reset" for f in r.frames()), timeout=20)
    assert second.status == 200
    reset = next(f for f in second.frames() if f["type"] == "face.reset")
    assert reset["payload"]["reason"] == "epoch_changed"
    snapshot = reset["payload"]["snapshot"]
    # The interrupted reply is in the snapshot, as far as it was saved (I11: not re-run).
    reply = [m for m in snapshot["messages"]
             if m["role"] == "assistant" and m["request_id"] == request_id]
    assert [m["status"] for m in reply] == ["interrupted"]
    # The id after the reset resumes exactly.
    third = await read_sse(
        f"{base}/v1/events", headers=bearer(paced_mind.token, **{"Last-Event-ID":
                                                                 second.last_id or ""}),
        params={"conversations": cid},
        stop=lambda r: any(f["type"] == "face.accepted" for f in r.frames()), timeout=20)
    assert third.frames()[0]["payload"]["replay"] == "exact"


@pytest.mark.e2e
async def test_a_replayed_ticket_is_refused_and_never_logged(paced_mind: MindProcess) -> None:
    face = await FaceClient.connect(paced_mind.url, paced_mind.token)
    cid = await face.create_conversation()
    base = http_url(paced_mind.url)
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{base}/v1/stream-tickets", headers=bearer(paced_mind.token),
                                   json={"conversations": [cid]})
    assert answer.status_code == 200, answer.text
    ticket = answer.json()["ticket"]
    assert answer.json()["expires_in"] == 60
    params = {"conversations": cid, "ticket": ticket}
    first = await read_sse(f"{base}/v1/events", params=params,
                           stop=lambda r: any(f["type"] == "face.snapshot" for f in r.frames()))
    assert first.status == 200
    replayed = await read_sse(f"{base}/v1/events", params=params)
    assert replayed.status == 401
    assert json.loads(replayed.body)["error"]["code"] == "unauthorized"
    await face.close()
    paced_mind.terminate()
    log = (paced_mind.home / "mind.log").read_text()
    assert ticket not in log
    assert paced_mind.token not in log
