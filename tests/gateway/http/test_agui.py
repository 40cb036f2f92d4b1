"""The AG-UI endpoint (DESIGN §9, docs/protocol.md §19) on an in-process Mind:
every event it produces validates against the ``ag-ui-protocol`` models."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pydantic
from ag_ui.core import Event, RunAgentInput

from tests.support.http_door import Door, http_door
from tests.support.sse import parse_events

EVENT = pydantic.TypeAdapter(Event)


def run_input(thread: str, run: str, text: str | None = None, **more: Any) -> dict[str, Any]:
    messages = [] if text is None else [{"id": uuid.uuid4().hex, "role": "user", "content": text}]
    body = {"threadId": thread, "runId": run, "messages": messages, **more}
    RunAgentInput.model_validate(body)  # what we send is valid AG-UI too
    return body


async def post(door: Door, body: dict[str, Any], stop: int | None = None,
               **params: str) -> tuple[int, list[tuple[dict[str, Any], str | None]], str]:
    """POST a run and read its events (validated) until the response ends,
    or ``stop`` events were read."""
    return await _read(door, "POST", body, None, stop, params)


async def rejoin(door: Door, thread: str, last_id: str | None, stop: int | None = None,
                 **params: str) -> tuple[int, list[tuple[dict[str, Any], str | None]], str]:
    return await _read(door, "GET", None, last_id, stop, {"threadId": thread, **params})


async def _read(door: Door, method: str, body: dict[str, Any] | None, last_id: str | None,
                stop: int | None, params: dict[str, str]
                ) -> tuple[int, list[tuple[dict[str, Any], str | None]], str]:
    headers = {"Last-Event-ID": last_id} if last_id else {}
    events: list[tuple[dict[str, Any], str | None]] = []
    text = ""
    async with door.client.stream(method, "/v1/agui", json=body, params=params,
                                  headers=headers) as response:
        if response.status_code != 200:
            return response.status_code, [], (await response.aread()).decode()
        async for chunk in response.aiter_text():
            text += chunk
            done = text.rfind("\n\n")
            blocks, text = parse_events(text[: done + 2]), text[done + 2:]
            for block in blocks:
                if block.data:
                    event = json.loads(block.data)
                    EVENT.validate_python(event)  # the package's own models
                    assert block.id, f"an event without an id: {block.data}"
                    events.append((event, block.id))
            if stop is not None and len(events) >= stop:
                break
    return 200, events, ""


def types(events: list[tuple[dict[str, Any], str | None]]) -> list[str]:
    return [e["type"] for e, _ in events]


def reply_text(events: list[tuple[dict[str, Any], str | None]], chat: str) -> str:
    return "".join(e["delta"] for e, _ in events
                   if e["type"] == "TEXT_MESSAGE_CONTENT" and e["messageId"] == f"{chat}:reply")


async def test_a_run_streams_its_reply_as_valid_agui_events_with_ids(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        status, events, _ = await post(door, run_input(cid, "run-1", "hello there friend"))
        assert status == 200
        kinds = types(events)
        assert kinds[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
        assert kinds[-2:] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
        assert "TEXT_MESSAGE_START" in kinds
        assert reply_text(events, "run-1") == "hello there friend"
        started = events[0][0]
        assert (started["threadId"], started["runId"]) == (cid, "run-1")


async def test_I5_a_retried_post_with_the_same_run_id_is_admitted_once(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        body = run_input(cid, "run-once", "only once")
        first = await post(door, body)
        again = await post(door, body)
        assert types(again[1])[-1] == "RUN_FINISHED"
        snapshot = (await door.get(f"/v1/conversations/{cid}")).json()
        users = [m for m in snapshot["messages"] if m["role"] == "user"]
        assert len(users) == 1
        # The retry shows the same reply (from the snapshot), not a second one.
        assert reply_text(first[1], "run-once") == "only once"
        snap = next(e for e, _ in again[1] if e["type"] == "MESSAGES_SNAPSHOT")
        assert [m["id"] for m in snap["messages"]] == ["run-once:user", "run-once:reply"]


async def test_a_foreign_thread_id_gets_one_conversation_created_on_first_use(
        tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        await post(door, run_input("thread-from-a-browser", "r1", "one"))
        await post(door, run_input("thread-from-a-browser", "r2", "two"))
        listed = (await door.get("/v1/conversations")).json()["conversations"]
        assert [c["name"] for c in listed] == ["thread-from-a-browser"]
        _, events, _ = await post(door, run_input("thread-from-a-browser", "r3", "three"))
        snap = next(e for e, _ in events if e["type"] == "MESSAGES_SNAPSHOT")
        assert [m["id"] for m in snap["messages"]] == ["r1:user", "r1:reply", "r2:user",
                                                        "r2:reply"]


async def test_a_stream_resumed_inside_a_message_resends_its_start_and_no_duplicate(
        tmp_path: Path) -> None:
    async with http_door(tmp_path, scripted_delta_ms=30.0) as (_, door):
        cid = await door.create_conversation()
        status, head, _ = await post(door, run_input(cid, "long", "/repeat 12 tick"), stop=8)
        assert types(head)[-1] == "TEXT_MESSAGE_CONTENT"
        status, tail, _ = await rejoin(door, cid, head[-1][1], runId="long")
        assert status == 200
        assert types(tail)[:2] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
        assert types(tail)[-1] == "RUN_FINISHED"
        assert reply_text(head, "long") + reply_text(tail, "long") == " ".join(["tick"] * 12)


async def test_I4_a_resume_from_every_event_id_gives_no_gap_and_no_duplicate(
        tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        _, whole, _ = await post(door, run_input(cid, "all", "a b c d"))
        for i in range(1, len(whole) - 1):
            _, tail, _ = await rejoin(door, cid, whole[i][1], runId="all")
            opened: dict[str, dict[str, Any]] = {}  # what the reader stands inside
            for event, _ in whole[: i + 1]:
                if event["type"] == "TEXT_MESSAGE_START":
                    opened[event["messageId"]] = event
                elif event["type"] == "TEXT_MESSAGE_END":
                    opened.pop(event["messageId"])
            assert tail[0][0]["type"] == "RUN_STARTED"
            assert [e for e, _ in tail[1:]] == [*opened.values(), *(e for e, _ in whole[i + 1:])], i


async def test_a_tool_approval_is_an_interrupt_and_resume_decides_it(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        command = '/tool exec_command {"command": "echo approved-output"}'
        _, first, _ = await post(door, run_input(cid, "tool-run", command))
        finished = first[-1][0]
        assert finished["type"] == "RUN_FINISHED"
        assert finished["outcome"]["type"] == "interrupt"
        interrupt = finished["outcome"]["interrupts"][0]
        assert interrupt["reason"] == "tool_approval" and interrupt["toolCallId"]
        assert "TOOL_CALL_START" in types(first)
        resume = [{"interruptId": interrupt["id"], "status": "resolved",
                   "payload": {"decision": "allow_once"}}]
        _, second, _ = await post(door, run_input(cid, "tool-run-2", None, resume=resume))
        kinds = types(second)
        assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
        result = next(e for e, _ in second if e["type"] == "TOOL_CALL_RESULT")
        assert result["toolCallId"] == interrupt["toolCallId"]
        assert "approved-output" in result["content"]
        assert "outcome" not in second[-1][0]


async def test_an_observer_gets_tool_calls_without_arguments_I9(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        cid = await door.create_conversation()
        command = '/tool read_file {"path": "nothing-here.txt"}'
        _, events, _ = await post(door, run_input(cid, "summary-run", command), detail="summary")
        assert "TOOL_CALL_START" in types(events)
        assert "TOOL_CALL_ARGS" not in types(events), types(events)


async def test_bad_input_is_an_http_error_before_any_stream(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        status, _, body = await post(door, {"threadId": "t", "messages": []})
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_request"
        status, _, body = await post(door, run_input("t", "no-user-message"))
        assert status == 400 and json.loads(body)["error"]["field"] == "messages"
        response = await door.client.post("/v1/agui", json=run_input("t", "r", "x"),
                                          headers={"Authorization": "Bearer nope"})
        assert response.status_code == 401
        response = await door.client.post("/v1/agui", json=run_input("t", "r", "x"),
                                          headers={"Origin": "https://evil.example"})
        assert response.status_code == 403
