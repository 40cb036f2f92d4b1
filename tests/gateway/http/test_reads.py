"""REST reads (DESIGN §9, docs/protocol.md §18) on an in-process Mind, through
a real socket: the same pages, snapshots and visibility as the WebSocket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.support.cli import face_add
from tests.support.client import FaceClient
from tests.support.http_door import http_door, key
from tests.support.mind import hand_ready

TRUE_TOOL = '/tool exec_command {"argv": ["true"]}'


async def test_conversations_are_listed_a_page_at_a_time(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        made = [await door.create_conversation(f"c{i}") for i in range(3)]
        first = await door.get("/v1/conversations", limit=2)
        assert first.status_code == 200
        assert first.headers["cache-control"] == "no-store"
        page = first.json()
        assert page["has_more"] is True
        assert len(page["conversations"]) == 2
        rest = (await door.get("/v1/conversations", limit=2,
                               before=page["conversations"][-1]["id"])).json()
        assert rest["has_more"] is False
        seen = [c["id"] for c in page["conversations"] + rest["conversations"]]
        assert sorted(seen) == sorted(made)


async def test_a_snapshot_is_the_websockets_snapshot(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (lmind, door):
        cid = await door.create_conversation("snap")
        done = await door.command("face.chat", {"conversation_id": cid, "content": "one two"},
                                  idempotency_key=key(), wait=10)
        assert done.status_code == 200
        answer = await door.get(f"/v1/conversations/{cid}")
        assert answer.status_code == 200
        snap = answer.json()
        assert "request_id" not in snap
        face = await FaceClient.connect(lmind.url, lmind.token)
        request_id = await face.command("face.conversation.snapshot", conversation_id=cid)
        ws = (await face.reply(request_id))["payload"]
        await face.close()
        ws.pop("request_id")
        ws.pop("event_seq")
        assert snap == ws
        assert [m["content"] for m in snap["messages"]] == ["one two", "one two"]
        assert snap["detail_mode"] == "transparent"


async def test_messages_come_in_pages_before_a_seq(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        for word in ("a", "b", "c"):
            done = await door.command("face.chat", {"conversation_id": cid, "content": word},
                                      idempotency_key=key(), wait=10)
            assert done.status_code == 200
        newest = (await door.get(f"/v1/conversations/{cid}/messages", limit=2)).json()
        assert [m["content"] for m in newest["messages"]] == ["c", "c"]
        assert newest["has_more_older"] is True
        older = (await door.get(f"/v1/conversations/{cid}/messages", limit=10,
                                before=newest["messages"][0]["seq"])).json()
        assert [m["content"] for m in older["messages"]] == ["a", "a", "b", "b"]
        assert older["has_more_older"] is False


async def test_reads_refuse_bad_parameters_naming_them(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        for path, params, name in (
            ("/v1/conversations", {"limit": "many"}, "limit"),
            ("/v1/conversations", {"limit": "0"}, "limit"),
            ("/v1/conversations", {"colour": "red"}, "colour"),
            (f"/v1/conversations/{cid}/messages", {"before": "-3"}, "before"),
            (f"/v1/conversations/{cid}/messages", {"before": "0"}, "before"),
            (f"/v1/conversations/{cid}", {"detail": "everything"}, "detail"),
        ):
            answer = await door.get(path, **params)
            assert answer.status_code == 400, (path, params)
            assert answer.json()["error"]["code"] == "invalid_request"
            assert answer.json()["error"]["field"] == name, (path, params)


async def test_an_unknown_conversation_is_404(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        for path in ("/v1/conversations/c_nope", "/v1/conversations/c_nope/messages"):
            answer = await door.get(path)
            assert answer.status_code == 404
            assert answer.json()["error"]["code"] == "conversation_not_found"


async def test_I8_reads_need_a_live_bearer_token(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        for path in ("/v1/conversations", "/v1/approvals", "/v1/hands"):
            answer = await door.client.get(path, headers={"Authorization": "Bearer nope"})
            assert answer.status_code == 401
            assert answer.json()["error"]["code"] == "unauthorized"


async def test_I9_an_observer_reads_summaries_and_may_not_ask_for_transparent(
    tmp_path: Path,
) -> None:
    async with http_door(tmp_path) as (lmind, door):
        await hand_ready(lmind)
        watcher = await face_add(lmind.config.home, "watcher", "--profile", "observer")
        await lmind.mind.refresh_credentials()
        notes = tmp_path / "notes.txt"
        notes.write_text("secret plans\n")
        cid = await door.create_conversation()
        read = "/tool read_file " + json.dumps({"path": str(notes)})
        done = await door.command("face.chat", {"conversation_id": cid, "content": read},
                                  idempotency_key=key(), wait=20)
        assert done.status_code == 200, done.text
        mine = (await door.get(f"/v1/conversations/{cid}")).json()
        assert mine["detail_mode"] == "transparent"
        assert "args" in mine["tool_history"][0]
        theirs = await door.get(f"/v1/conversations/{cid}", token=watcher.token)
        assert theirs.status_code == 200
        assert theirs.json()["detail_mode"] == "summary"
        assert "args" not in theirs.json()["tool_history"][0]
        assert "result" not in theirs.json()["tool_history"][0]
        refused = await door.get(f"/v1/conversations/{cid}", token=watcher.token,
                                 detail="transparent")
        assert refused.status_code == 403
        assert refused.json()["error"] == {"code": "forbidden",
                                           "message": refused.json()["error"]["message"],
                                           "field": "detail"}
        asked = await door.get(f"/v1/conversations/{cid}", detail="summary")
        assert asked.json()["detail_mode"] == "summary"
        assert "args" not in asked.json()["tool_history"][0]


async def test_pending_approvals_are_listed_and_resolved_over_http(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (lmind, door):
        await hand_ready(lmind)
        assert (await door.get("/v1/approvals")).json() == {"approvals": []}
        cid = await door.create_conversation()
        chat = await door.command("face.chat", {"conversation_id": cid, "content": TRUE_TOOL},
                                  idempotency_key="tool")
        assert chat.status_code == 202
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not (pending := (await door.get("/v1/approvals")).json()["approvals"]):
            assert loop.time() < deadline, "the approval was never listed"
            await asyncio.sleep(0.02)  # polling a condition with a deadline
        approval = pending[0]
        assert approval["conversation_id"] == cid and "args" not in approval
        resolved = await door.command("face.approval.resolve",
                                      {"approval_id": approval["approval_id"],
                                       "decision": "allow_once"},
                                      idempotency_key="yes")
        assert resolved.status_code == 200, resolved.text
        assert resolved.json()["data"]["outcome"] == "applied"
        final = await door.command("face.chat", {"conversation_id": cid, "content": TRUE_TOOL},
                                   idempotency_key="tool", wait=20)
        assert final.json()["content"].startswith("exec_command succeeded")
        assert (await door.get("/v1/approvals")).json() == {"approvals": []}


async def test_hands_are_listed(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (lmind, door):
        await hand_ready(lmind)
        hands = (await door.get("/v1/hands")).json()["hands"]
        assert "local" in [h["hand_id"] for h in hands]


async def test_welcome_says_over_http_what_the_websocket_welcome_says(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (lmind, door):
        answer = await door.get("/v1/welcome")
        assert answer.status_code == 200, answer.text
        assert answer.headers["cache-control"] == "no-store"
        face = await FaceClient.connect(lmind.url, lmind.token)
        assert face.welcome is not None
        over_ws = {k: v for k, v in face.welcome["payload"].items() if k != "event_seq"}
        await face.close()
        assert answer.json() == over_ws
        assert "face.chat" in answer.json()["replay_safe"]


async def test_welcome_tells_an_observer_its_scopes_and_refuses_a_stranger(
    tmp_path: Path,
) -> None:
    async with http_door(tmp_path) as (lmind, door):
        watcher = await face_add(lmind.config.home, "watcher", "--profile", "observer")
        await lmind.mind.refresh_credentials()
        seen = (await door.get("/v1/welcome", token=watcher.token)).json()
        assert (seen["label"], seen["profile"]) == ("watcher", "observer")
        assert "face:chat" not in seen["scopes"]
        assert (await door.get("/v1/welcome", token="hpf_nobody")).status_code == 401
        odd = await door.get("/v1/welcome", extra="1")
        assert odd.status_code == 400 and odd.json()["error"]["field"] == "extra"
