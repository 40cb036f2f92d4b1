"""HTTP commands (DESIGN §9, docs/protocol.md §18): ``POST /v1/commands/{type}``
on an in-process Mind, through a real socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from halfpi.gateway.http.commands import HttpCaller
from tests.support.cli import face_add
from tests.support.client import FaceClient
from tests.support.http_door import http_door, key
from tests.support.rig import fake_time_mind


def without_event_seq(payload: dict[str, Any]) -> dict[str, Any]:
    """A WebSocket payload as HTTP answers it (``event_seq`` is per connection)."""
    return {k: v for k, v in payload.items() if k != "event_seq"}


async def test_a_chat_is_admitted_with_202_and_its_accepted_body(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        answer = await door.command("face.chat", {"conversation_id": cid, "content": "/sleep 1"},
                                    idempotency_key="chat-1")
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert body["request_id"] == "chat-1"
        assert body["operation"] == "chat"
        assert body["conversation_id"] == cid
        assert answer.headers["cache-control"] == "no-store"


async def test_wait_holds_the_answer_until_the_chat_result(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        answer = await door.command("face.chat", {"conversation_id": cid, "content": "hello there"},
                                    idempotency_key="chat-w", wait=10)
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert (result["request_id"], result["status"]) == ("chat-w", "succeeded")
        assert result["content"] == "hello there"


async def test_wait_ends_with_202_when_the_result_is_not_ready(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        answer = await door.command("face.chat", {"conversation_id": cid, "content": "/sleep 5"},
                                    idempotency_key="chat-slow", wait=0.2)
        assert answer.status_code == 202, answer.text
        assert answer.json()["operation"] == "chat"


async def test_I5_the_same_key_twice_admits_once_and_answers_the_same_result(
    tmp_path: Path,
) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        body = {"conversation_id": cid, "content": "only once"}
        first = await door.command("face.chat", body, idempotency_key="once", wait=10)
        second = await door.command("face.chat", body, idempotency_key="once", wait=10)
        assert first.status_code == second.status_code == 200
        assert first.json() == second.json()
        page = (await door.get(f"/v1/conversations/{cid}/messages", limit=50)).json()
        users = [m for m in page["messages"] if m["role"] == "user"]
        assert [m["content"] for m in users] == ["only once"]


async def test_I5_a_running_chat_replayed_answers_its_accepted_again(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        body = {"conversation_id": cid, "content": "/sleep 1"}
        first = await door.command("face.chat", body, idempotency_key="run")
        again = await door.command("face.chat", body, idempotency_key="run")
        assert first.status_code == again.status_code == 202
        assert first.json() == again.json()
        final = await door.command("face.chat", body, idempotency_key="run", wait=10)
        assert final.status_code == 200
        assert final.json()["content"] == "done"


async def test_a_key_reused_with_another_payload_is_409_request_conflict(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        ok = await door.command("face.chat", {"conversation_id": cid, "content": "a"},
                                idempotency_key="dup", wait=10)
        assert ok.status_code == 200
        clash = await door.command("face.chat", {"conversation_id": cid, "content": "b"},
                                   idempotency_key="dup")
        assert clash.status_code == 409
        assert clash.json()["error"]["code"] == "request_conflict"


async def test_a_mutation_without_idempotency_key_is_400_naming_the_header(
    tmp_path: Path,
) -> None:
    async with http_door(tmp_path) as (_, door):
        answer = await door.command("face.conversation.create", {"name": "x"})
        assert answer.status_code == 400
        assert answer.json()["error"] == {
            "code": "invalid_request",
            "message": answer.json()["error"]["message"],
            "field": "Idempotency-Key",
        }


async def test_a_body_request_id_other_than_the_key_is_400(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        answer = await door.command("face.conversation.create",
                                    {"request_id": "other", "name": "x"},
                                    idempotency_key="this")
        assert answer.status_code == 400
        assert answer.json()["error"]["field"] == "request_id"
        same = await door.command("face.conversation.create", {"request_id": "this"},
                                  idempotency_key="this")
        assert same.status_code == 200


async def test_a_payload_the_wire_refuses_is_400_naming_the_field(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        wrong = await door.command("face.chat", {"conversation_id": cid, "content": 5},
                                   idempotency_key=key())
        assert wrong.status_code == 400
        assert wrong.json()["error"]["field"] == "content"
        unknown = await door.command("face.chat", {"conversation_id": cid, "content": "a",
                                                   "colour": "red"}, idempotency_key=key())
        assert unknown.status_code == 400
        assert unknown.json()["error"]["code"] == "invalid_request"
        garbage = await door.client.post("/v1/commands/face.chat", content=b"{not json",
                                         headers={"Idempotency-Key": key()})
        assert garbage.status_code == 400
        assert garbage.json()["error"]["code"] == "invalid_request"
        listed = await door.client.post("/v1/commands/face.chat", content=b"[1]",
                                        headers={"Idempotency-Key": key()})
        assert listed.status_code == 400


async def test_hello_subscribe_and_unknown_types_are_not_http_commands(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        for type_ in ("face.hello", "face.subscribe", "face.unsubscribe", "face.nope"):
            answer = await door.command(type_, {}, idempotency_key=key())
            assert answer.status_code == 404, type_
            assert answer.json()["error"] == {
                "code": "invalid_request",
                "message": answer.json()["error"]["message"],
                "field": "type",
            }


async def test_an_instant_mutation_answers_200_with_its_result(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        answer = await door.command("face.conversation.create", {"name": "plans"},
                                    idempotency_key="c1")
        assert answer.status_code == 200
        result = answer.json()
        assert (result["request_id"], result["status"]) == ("c1", "succeeded")
        assert result["data"]["name"] == "plans"


async def test_a_read_command_needs_no_key(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        await door.create_conversation("one")
        answer = await door.command("face.conversation.list", {"limit": 5})
        assert answer.status_code == 200
        result = answer.json()
        assert result["status"] == "succeeded"
        assert [c["name"] for c in result["data"]["conversations"]] == ["one"]
        pong = await door.command("face.ping")
        assert pong.status_code == 200


async def test_an_unknown_conversation_is_404_conversation_not_found(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        answer = await door.command("face.chat", {"conversation_id": "c_nope", "content": "hi"},
                                    idempotency_key=key())
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "conversation_not_found"


async def test_a_second_chat_while_one_runs_is_409_busy(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        first = await door.command("face.chat", {"conversation_id": cid, "content": "/sleep 2"},
                                   idempotency_key=key())
        assert first.status_code == 202
        second = await door.command("face.chat", {"conversation_id": cid, "content": "hi"},
                                    idempotency_key=key())
        assert second.status_code == 409
        assert second.json()["error"]["code"] == "busy"


async def test_wait_is_bounded(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        for wait in ("61", "-1", "soon", "nan"):
            answer = await door.client.post(
                "/v1/commands/face.conversation.create", params={"wait": wait}, json={},
                headers={"Idempotency-Key": key()})
            assert answer.status_code == 400, wait
            assert answer.json()["error"]["field"] == "wait"


async def test_a_body_over_the_frame_limit_is_413_too_large(tmp_path: Path) -> None:
    async with http_door(tmp_path, max_frame_bytes=4096) as (_, door):
        answer = await door.client.post(
            "/v1/commands/face.conversation.create", content=b'{"name":"' + b"a" * 5000 + b'"}',
            headers={"Idempotency-Key": key()})
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "too_large"


async def test_I8_no_bearer_is_401_and_a_bad_one_too(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        bare = await door.client.post("/v1/commands/face.ping", json={},
                                      headers={"Authorization": ""})
        assert bare.status_code == 401
        assert bare.headers["www-authenticate"] == "Bearer"
        assert bare.json()["error"]["code"] == "unauthorized"
        wrong = await door.command("face.ping", token="not-a-token")
        assert wrong.status_code == 401


async def test_I8_an_observer_gets_403_for_a_mutation(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (lmind, door):
        watcher = await face_add(lmind.config.home, "watcher", "--profile", "observer")
        await lmind.mind.refresh_credentials()
        answer = await door.command("face.conversation.create", {}, idempotency_key=key(),
                                    token=watcher.token)
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "forbidden"
        listed = await door.command("face.conversation.list", token=watcher.token)
        assert listed.status_code == 200


async def test_I1_the_chat_goes_on_after_its_http_request_ended(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        answer = await door.command("face.chat", {"conversation_id": cid, "content": "/sleep 0.3"},
                                    idempotency_key="bg")
        assert answer.status_code == 202
        final = await door.command("face.chat", {"conversation_id": cid, "content": "/sleep 0.3"},
                                   idempotency_key="bg", wait=10)
        assert final.status_code == 200
        assert final.json()["status"] == "succeeded"


async def test_I5_a_chat_sent_over_http_and_retried_over_websocket_is_admitted_once(
    tmp_path: Path,
) -> None:
    async with http_door(tmp_path) as (lmind, door):
        cid = await door.create_conversation()
        body = {"conversation_id": cid, "content": "/sleep 0.5"}
        http = await door.command("face.chat", body, idempotency_key="both")
        assert http.status_code == 202
        face = await FaceClient.connect(lmind.url, lmind.token)
        await face.send("face.chat", {"request_id": "both", **body})
        accepted = await face.reply("both", ("face.accepted", "face.error"))
        assert accepted["type"] == "face.accepted"
        assert without_event_seq(accepted["payload"]) == http.json()
        result = await face.reply("both")
        assert result["payload"]["content"] == "done"
        page = (await door.get(f"/v1/conversations/{cid}/messages", limit=50)).json()
        assert [m["content"] for m in page["messages"] if m["role"] == "user"] == ["/sleep 0.5"]
        await face.close()


async def test_I5_a_chat_sent_over_websocket_and_retried_over_http_is_admitted_once(
    tmp_path: Path,
) -> None:
    async with http_door(tmp_path) as (lmind, door):
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        ws = await face.chat_to_end(cid, "hi there", request_id="ws-first")
        again = await door.command("face.chat", {"conversation_id": cid, "content": "hi there"},
                                   idempotency_key="ws-first")
        assert again.status_code == 200
        assert again.json() == without_event_seq(ws["payload"])
        clash = await door.command("face.chat", {"conversation_id": cid, "content": "other"},
                                   idempotency_key="ws-first")
        assert clash.status_code == 409
        await face.close()


async def test_I1_a_client_gone_while_it_waits_ends_nothing(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        body = {"conversation_id": cid, "content": "/sleep 0.5"}
        with pytest.raises(httpx.ReadTimeout):
            await door.client.post("/v1/commands/face.chat", json=body, params={"wait": "30"},
                                   headers={"Idempotency-Key": "gone"}, timeout=0.2)
        # The chat ran to its end all the same (I1): the same key answers its result.
        final = await door.command("face.chat", body, idempotency_key="gone", wait=10)
        assert final.status_code == 200
        assert (final.json()["status"], final.json()["content"]) == ("succeeded", "done")


async def test_I8_a_credential_revoked_while_its_command_waits_gets_401(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (lmind, door):
        cid = await door.create_conversation()
        tablet = await face_add(lmind.config.home, "tablet")
        await lmind.mind.refresh_credentials()
        watcher = await FaceClient.connect(lmind.url, lmind.token)
        await watcher.subscribe(cid)
        waiting = asyncio.create_task(door.command(
            "face.chat", {"conversation_id": cid, "content": "/sleep 0.5"},
            idempotency_key="revoked-wait", wait=20, token=tablet.token))
        # The chat has started: the command is past its authorisation and waits.
        await watcher.expect(lambda f: f["type"] == "face.event"
                             and f["payload"]["type"] == "chat.started")
        await lmind.mind.store.revoke_credential("face", "tablet", lmind.mind.now())
        await lmind.mind.refresh_credentials()
        answer = await waiting
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["code"] == "unauthorized"
        # It ran to its end all the same (I1).
        await watcher.expect(lambda f: f["type"] == "face.event"
                             and f["payload"]["type"] == "chat.completed")
        await watcher.close()


@pytest.mark.parametrize("step", [-3600.0, 3600.0], ids=["back", "forward"])
async def test_wait_counts_on_the_minds_monotonic_clock_whatever_the_wall_clock_does(
    tmp_path: Path, step: float
) -> None:
    """``?wait=S`` is a timer of the Mind's scheduler: S seconds of its
    monotonic clock, not stalled nor cut short by a step of the wall clock."""
    async with fake_time_mind(tmp_path / "home") as rig:
        credential = rig.mind.auth.authenticate(rig.face_token, "face")
        assert credential is not None
        caller = HttpCaller(rig.mind, credential)
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(caller.wait_final(20.0, gone, rig.mind.scheduler))
        await asyncio.sleep(0)
        rig.clock.step_wall(step)
        rig.advance(20.0 - 0.001)
        await asyncio.sleep(0)
        assert not waiting.done(), "not before its S seconds"
        rig.advance(0.001)
        await asyncio.wait_for(waiting, 5)
        assert caller.final() is None
