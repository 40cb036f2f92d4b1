"""The Durable Streams read side on a real ``halfpi mind`` (DESIGN §9,
docs/protocol.md §20), on both servers: catch-up, long-poll and SSE over
real sockets, and what a restart does to offsets (a new epoch: the old
ones are expired history, ``-1`` still starts at the beginning)."""

from __future__ import annotations

import asyncio
import json

from tests.support.http_door import door_client, key
from tests.support.mind import MindProcess
from tests.support.stream import assert_contiguous, delta_text


async def test_catch_up_long_poll_and_sse_over_real_sockets(mind_proc: MindProcess) -> None:
    async with door_client(mind_proc.url, mind_proc.token) as door:
        cid = await door.create_conversation("read")
        first = key("chat")
        answer = await door.command("face.chat",
                                    {"conversation_id": cid, "content": "/repeat 4 a"},
                                    idempotency_key=first, wait=30)
        assert answer.status_code == 200, answer.text
        path = f"/v1/conversations/{cid}/stream"
        caught = await door.client.get(path, params={"offset": "-1"})
        assert caught.status_code == 200
        frames = caught.json()
        assert_contiguous(frames, 1, frames[-1]["payload"]["seq"])
        assert delta_text(frames, first) == "a a a a"
        tail = caught.headers["stream-next-offset"]
        assert caught.headers["stream-up-to-date"] == "true"
        # A long-poll at the tail answers with the next chat's first event.
        poll = door.client.get(path, params={"offset": tail, "live": "long-poll"})
        second = key("chat")
        sent = door.command("face.chat", {"conversation_id": cid, "content": "b"},
                            idempotency_key=second, wait=30)
        polled, done = await asyncio.gather(poll, sent)
        assert polled.status_code == 200 and done.status_code == 200
        assert polled.json()[0]["payload"]["seq"] == frames[-1]["payload"]["seq"] + 1
        # SSE from the first offset: data and control events, up to date at the end.
        async with door.client.stream("GET", path, params={"offset": tail, "live": "sse"}) as sse:
            assert sse.headers["content-type"].startswith("text/event-stream")
            text = ""
            async for chunk in sse.aiter_text():
                text += chunk
                if '"upToDate":true' in text:
                    break
        batches = [json.loads(block.split("data: ", 1)[1]) for block in text.split("\n\n")
                   if block.startswith("event: data")]
        shown = [f for batch in batches for f in batch]
        assert delta_text(shown, second) == "b"


async def test_I4_after_a_restart_old_offsets_are_gone_and_minus_1_reads_the_store(
    mind_proc: MindProcess,
) -> None:
    async with door_client(mind_proc.url, mind_proc.token) as door:
        cid = await door.create_conversation("restarted")
        request_id = key("chat")
        await door.command("face.chat", {"conversation_id": cid, "content": "/repeat 3 kept"},
                           idempotency_key=request_id, wait=30)
        before = await door.client.get(f"/v1/conversations/{cid}/stream", params={"offset": "-1"})
        offset = before.headers["stream-next-offset"]
    mind_proc.terminate()
    mind_proc.start()
    async with door_client(mind_proc.url, mind_proc.token) as door:
        path = f"/v1/conversations/{cid}/stream"
        gone = await door.client.get(path, params={"offset": offset})
        assert gone.status_code == 410
        assert gone.json()["error"]["code"] == "epoch_changed"
        # -1 still starts at the beginning: the durable events, from the Store
        # (the deltas were the old journal's; the reply's end carries its text).
        again = await door.client.get(path, params={"offset": "-1"})
        assert again.status_code == 200
        frames = again.json()
        assert {f["type"] for f in frames} == {"face.event"}
        ended = [f for f in frames if f["payload"]["type"] == "chat.completed"]
        assert ended[0]["payload"]["data"]["content"] == "kept kept kept"
        # The snapshot's cursor is an offset to follow on from.
        snapshot = (await door.get(f"/v1/conversations/{cid}")).json()
        follow = await door.client.get(path, params={"offset": snapshot["cursor"]})
        assert follow.status_code == 200 and follow.json() == []
        assert follow.headers["stream-next-offset"] == again.headers["stream-next-offset"]
