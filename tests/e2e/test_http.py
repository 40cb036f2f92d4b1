"""The HTTP door against a real ``halfpi mind`` (DESIGN §9, docs/protocol.md §18),
on both servers: commands with Idempotency-Key, ``?wait=``, the registry
shared with the WebSocket (I5), scopes and visibility (I8, I9), revocation,
draining, and tokens kept out of the log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support.cli import face_add, face_revoke
from tests.support.client import FaceClient
from tests.support.http_door import Door, door_client, key
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e


async def chat_once(door: Door, cid: str, content: str, idempotency_key: str,
                    wait: float = 20) -> httpx.Response:
    return await door.command("face.chat", {"conversation_id": cid, "content": content},
                              idempotency_key=idempotency_key, wait=wait)


async def user_messages(door: Door, cid: str) -> list[str]:
    page = (await door.get(f"/v1/conversations/{cid}/messages", limit=100)).json()
    return [m["content"] for m in page["messages"] if m["role"] == "user"]


async def test_I5_an_idempotent_chat_over_http_is_admitted_once(mind_proc: MindProcess) -> None:
    async with door_client(mind_proc.url, mind_proc.token) as door:
        cid = await door.create_conversation()
        first = await chat_once(door, cid, "say it once", "chat-1")
        second = await chat_once(door, cid, "say it once", "chat-1")
        assert first.status_code == second.status_code == 200
        assert first.json() == second.json()
        assert first.json()["content"] == "say it once"
        assert await user_messages(door, cid) == ["say it once"]


async def test_a_key_reused_with_another_payload_is_409(mind_proc: MindProcess) -> None:
    async with door_client(mind_proc.url, mind_proc.token) as door:
        cid = await door.create_conversation()
        assert (await chat_once(door, cid, "first", "k-dup")).status_code == 200
        clash = await chat_once(door, cid, "second", "k-dup")
        assert clash.status_code == 409
        assert clash.json()["error"]["code"] == "request_conflict"
        assert await user_messages(door, cid) == ["first"]


async def test_I5_http_then_websocket_retry_is_admitted_once(mind_proc: MindProcess) -> None:
    async with door_client(mind_proc.url, mind_proc.token) as door:
        cid = await door.create_conversation()
        posted = await chat_once(door, cid, "/sleep 0.5", "across", wait=0)
        assert posted.status_code == 202
        face = await FaceClient.connect(mind_proc.url, mind_proc.token)
        await face.send("face.chat", {"request_id": "across", "conversation_id": cid,
                                      "content": "/sleep 0.5"})
        accepted = await face.reply("across", ("face.accepted", "face.error"))
        assert accepted["type"] == "face.accepted"
        assert accepted["payload"]["run_id"] == posted.json()["run_id"]
        result = await face.reply("across")
        assert result["payload"]["status"] == "succeeded"
        # And the reverse: a WebSocket chat retried over HTTP.
        ws = await face.chat_to_end(cid, "from the socket", request_id="ws-first")
        again = await chat_once(door, cid, "from the socket", "ws-first")
        assert again.status_code == 200
        assert again.json() == {k: v for k, v in ws["payload"].items() if k != "event_seq"}
        await face.close()
        assert await user_messages(door, cid) == ["/sleep 0.5", "from the socket"]


async def test_wait_returns_the_result_and_without_it_202(mind_proc: MindProcess) -> None:
    async with door_client(mind_proc.url, mind_proc.token) as door:
        cid = await door.create_conversation()
        held = await chat_once(door, cid, "/sleep 0.3", "held", wait=20)
        assert held.status_code == 200
        assert (held.json()["status"], held.json()["content"]) == ("succeeded", "done")
        quick = await chat_once(door, cid, "/sleep 0.3", "quick", wait=0)
        assert quick.status_code == 202
        assert quick.json()["operation"] == "chat"


async def test_I8_I9_an_observer_gets_403_for_a_mutation_and_summaries_in_reads(
    mind_proc: MindProcess,
) -> None:
    watcher = await face_add(mind_proc.home, "watcher", "--profile", "observer")
    async with door_client(mind_proc.url, mind_proc.token) as door:
        cid = await door.create_conversation()
        assert (await chat_once(door, cid, "hello", key())).status_code == 200
        refused = await door.command("face.chat", {"conversation_id": cid, "content": "hi"},
                                     idempotency_key=key(), token=watcher.token)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"
        snap = await door.get(f"/v1/conversations/{cid}", token=watcher.token)
        assert snap.status_code == 200
        assert snap.json()["detail_mode"] == "summary"
        transparent = await door.get(f"/v1/conversations/{cid}", token=watcher.token,
                                     detail="transparent")
        assert transparent.status_code == 403
        listed = await door.get("/v1/conversations", token=watcher.token)
        assert cid in [c["id"] for c in listed.json()["conversations"]]


async def test_I8_a_revoked_token_is_401_at_the_next_request(mind_proc: MindProcess) -> None:
    phone = await face_add(mind_proc.home, "phone")
    async with door_client(mind_proc.url, phone.token) as door:
        assert (await door.get("/v1/conversations")).status_code == 200
        await face_revoke(mind_proc.home, "phone")
        loop = asyncio.get_running_loop()
        revoked_at = loop.time()
        # The Mind learns of the revocation by polling its store (a fraction
        # of a second); from then on every request is refused.
        while (answer := await door.get("/v1/conversations")).status_code == 200:
            assert loop.time() - revoked_at < 5, "the revoked token still works"
            await asyncio.sleep(0.05)  # polling a condition with a deadline
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthorized"
        assert (await door.command("face.ping")).status_code == 401


async def test_a_draining_mind_answers_503(mind_proc: MindProcess) -> None:
    async with door_client(mind_proc.url, mind_proc.token) as door, \
            door_client(mind_proc.url, mind_proc.token) as other:
        cid = await door.create_conversation()
        waiting = asyncio.ensure_future(chat_once(door, cid, "/sleep 30", "long", wait=30))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not (await other.get(f"/v1/conversations/{cid}")).json()["pending_chats"]:
            assert loop.time() < deadline
            await asyncio.sleep(0.02)  # polling a condition with a deadline
        # A command whose body is still on its way when the Mind starts to
        # drain: its connection is busy, so it is answered, not dropped.
        release, sent = asyncio.Event(), asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            sent.set()  # the client asks for the body once the head is written
            await release.wait()
            yield b'{"name": "late"}'

        late = asyncio.ensure_future(other.client.post(
            "/v1/commands/face.conversation.create", content=body(),
            headers={"Idempotency-Key": "late"}))
        await sent.wait()
        # A round trip on another connection: the Mind's loop has read that head.
        assert (await door.get("/v1/hands")).status_code == 200
        assert mind_proc.proc is not None
        mind_proc.proc.terminate()
        # The chat is interrupted by the drain: the held request hears it (I11).
        held = await asyncio.wait_for(waiting, 20)
        assert held.status_code == 200
        assert held.json()["status"] == "interrupted"
        release.set()
        drained = await asyncio.wait_for(late, 20)
        assert drained.status_code == 503
        assert drained.json()["error"]["code"] == "unavailable"
        assert mind_proc.proc.wait(20) == 0


async def test_tokens_never_appear_in_the_minds_log(mind_proc: MindProcess) -> None:
    wrong = "wrong-" + "x" * 40
    async with door_client(mind_proc.url, mind_proc.token) as door:
        await door.create_conversation()
        assert (await door.get("/v1/hands")).status_code == 200
        assert (await door.get("/v1/hands", token=wrong)).status_code == 401
        assert (await door.command("face.ping", token=wrong)).status_code in (401, 429)
    assert mind_proc.proc is not None
    mind_proc.proc.terminate()
    mind_proc.proc.wait(20)
    log = (mind_proc.home / "mind.log").read_text()
    assert "failed" in log  # the refused requests were logged …
    assert mind_proc.token not in log  # … without any token
    assert wrong not in log
