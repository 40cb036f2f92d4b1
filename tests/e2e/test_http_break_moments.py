"""Every moment the connection can break, over HTTP commands and an SSE
stream instead of a WebSocket, against a real ``halfpi mind`` on both servers.

The client talks through the fault proxy and loses the connection (1) before
its request has reached the Mind, (2) after sending it but before the answer
arrives, (3) while the chat runs (the command's ``?wait=`` and the SSE
stream cut mid-reply), (4) after the chat ended but before its result
reaches the client, and (5) after everything finished. Each time it retries
with the same Idempotency-Key and must learn exactly what is true: one
admission per key (I5), a chat that outlives its connection (I1), a stream
resumed exactly from its last id (I4), a history the REST reads agree with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support.http_door import Door, base_url, door_client
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy, cut_on
from tests.support.sse import Reading, chat_completed, read_sse
from tests.support.stream import assert_contiguous, delta_text, positioned

pytestmark = pytest.mark.e2e

WORDS = 200


@pytest.fixture
async def proxy(paced_mind: MindProcess) -> AsyncIterator[FaultProxy]:
    proxy = await FaultProxy(paced_mind.port).start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.fixture
async def direct(paced_mind: MindProcess) -> AsyncIterator[Door]:
    async with door_client(paced_mind.url, paced_mind.token) as door:
        yield door


@pytest.fixture
async def through(paced_mind: MindProcess, proxy: FaultProxy) -> AsyncIterator[Door]:
    """A client whose every connection goes through the fault proxy."""
    async with door_client(f"http://127.0.0.1:{proxy.port}", paced_mind.token) as door:
        yield door


async def chat(door: Door, cid: str, content: str, key: str, wait: float = 30) -> httpx.Response:
    return await door.command("face.chat", {"conversation_id": cid, "content": content},
                              idempotency_key=key, wait=wait)


async def user_messages(door: Door, cid: str) -> list[str]:
    page = (await door.get(f"/v1/conversations/{cid}/messages", limit=100)).json()
    return [m["content"] for m in page["messages"] if m["role"] == "user"]


async def test_I5_cut_before_the_request_reaches_the_mind_then_one_admission(
    proxy: FaultProxy, through: Door, direct: Door,
) -> None:
    cid = await direct.create_conversation()
    proxy.cut_to_server_after = 16  # the request line, not yet the body
    with pytest.raises(httpx.TransportError):
        await chat(through, cid, "first words", "moment-1")
    assert proxy.cuts == 1
    assert await user_messages(direct, cid) == []  # nothing reached the Mind
    retried = await chat(through, cid, "first words", "moment-1")
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "succeeded"
    assert await user_messages(direct, cid) == ["first words"]


async def test_I5_cut_before_the_answer_arrives_and_the_retry_admits_once(
    proxy: FaultProxy, through: Door, direct: Door,
) -> None:
    cid = await direct.create_conversation()
    proxy.cut_when = cut_on(b"HTTP/1.1 ")  # the Mind has answered; the client never sees it
    with pytest.raises(httpx.TransportError):
        await chat(through, cid, "said once", "moment-2", wait=0)
    assert proxy.cuts == 1
    proxy.cut_when = None
    retried = await chat(through, cid, "said once", "moment-2")
    assert retried.status_code == 200, retried.text
    assert retried.json()["content"] == "said once"
    assert await user_messages(direct, cid) == ["said once"]


async def test_I1_I4_a_cut_mid_reply_ends_nothing_and_both_halves_resume_exactly(
    paced_mind: MindProcess, proxy: FaultProxy, through: Door, direct: Door,
) -> None:
    cid = await direct.create_conversation()
    base = f"http://127.0.0.1:{proxy.port}"
    headers = {"Authorization": f"Bearer {paced_mind.token}"}
    subscribed, streaming = asyncio.Event(), asyncio.Event()

    def seen(reading: Reading) -> None:
        subscribed.set()
        if sum(1 for e in reading.events if e.event == "face.chat.delta") >= 20:
            streaming.set()

    stream = asyncio.create_task(read_sse(
        f"{base}/v1/conversations/{cid}/events", headers=headers, on_event=seen, timeout=60))
    await asyncio.wait_for(subscribed.wait(), 10)
    content = f"/repeat {WORDS} word"
    waiting = asyncio.create_task(chat(through, cid, content, "moment-3"))
    await asyncio.wait_for(streaming.wait(), 20)
    proxy.cut_all()  # the stream and the waiting command lose their connections
    with pytest.raises(httpx.TransportError):
        await waiting
    first = await stream
    assert first.error is not None and first.last_id is not None

    # The chat went on without its connection (I1): the retry finds its result.
    retried = await chat(through, cid, content, "moment-3")
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "succeeded"
    text = " ".join(["word"] * WORDS)
    # The stream resumes from the last id it read: no duplicate, no gap (I4).
    second = await read_sse(f"{base}/v1/conversations/{cid}/events",
                            headers={**headers, "Last-Event-ID": first.last_id},
                            stop=chat_completed("moment-3"), timeout=30)
    assert second.status == 200
    assert second.frames()[0]["payload"]["replay"] == "exact"
    seen_frames = positioned(first.frames(), cid) + positioned(second.frames(), cid)
    assert_contiguous(seen_frames, seen_frames[0]["payload"]["seq"],
                      seen_frames[-1]["payload"]["seq"])
    assert delta_text(seen_frames, "moment-3") == text
    assert seen_frames[-1]["payload"]["data"]["content"] == text
    assert await user_messages(direct, cid) == [content]


async def test_I5_the_result_lost_on_the_way_is_answered_again_from_the_registry(
    proxy: FaultProxy, through: Door, direct: Door,
) -> None:
    cid = await direct.create_conversation()
    proxy.cut_when = cut_on(b'"status":"succeeded"')  # the chat ended; its answer is lost
    with pytest.raises(httpx.TransportError):
        await chat(through, cid, "the answer", "moment-4")
    assert proxy.cuts == 1
    proxy.cut_when = None
    retried = await chat(through, cid, "the answer", "moment-4")
    assert retried.status_code == 200
    stored = retried.json()
    assert stored["status"] == "succeeded" and stored["request_id"] == "moment-4"
    again = await chat(direct, cid, "the answer", "moment-4")
    assert again.json() == stored  # the same stored result, every time
    assert await user_messages(direct, cid) == ["the answer"]


async def test_I4_after_everything_the_reads_and_a_fresh_stream_agree_on_the_history(
    paced_mind: MindProcess, proxy: FaultProxy, through: Door, direct: Door,
) -> None:
    cid = await direct.create_conversation()
    for n in range(3):
        answer = await chat(through, cid, f"message {n}", f"moment-5-{n}")
        assert answer.status_code == 200, answer.text
    proxy.cut_all()  # everything finished; then the connection goes
    # A client that connects again (the old keep-alive connection is dead).
    async with door_client(f"http://127.0.0.1:{proxy.port}", paced_mind.token) as again:
        snapshot = (await again.get(f"/v1/conversations/{cid}")).json()
        assert await user_messages(again, cid) == ["message 0", "message 1", "message 2"]
    fresh = await read_sse(f"{base_url(paced_mind.url)}/v1/conversations/{cid}/events",
                           headers={"Authorization": f"Bearer {paced_mind.token}"},
                           stop=lambda r: any(e.event == "face.snapshot" for e in r.events),
                           timeout=10)
    streamed = next(e.payload for e in fresh.events if e.event == "face.snapshot")
    assert streamed["cursor"] == snapshot["cursor"]
    assert streamed["conversation"]["id"] == cid
