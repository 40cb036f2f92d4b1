"""A model answers through the Mind (DESIGN §1.2): a real Mind in this loop,
its provider pointed at a fake model server on 127.0.0.1 (real HTTP, the
real ``openai`` SDK). Everything the Mind promises for the scripted agent
holds for a model's words and a model's tool calls: commit before show,
approvals on a real Hand, visibility, cancel, honest failures, usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.agents.openai import OpenAIAgent
from halfpi.config import ModelSettings
from tests.support.client import FaceClient
from tests.support.fake_openai import (
    Cut,
    FakeModel,
    Gate,
    Reply,
    chunk,
    text,
    tool_calls,
    usage,
)
from tests.support.frames import event, events_of
from tests.support.mind import LocalMind, hand_ready, local_mind
from tests.support.stream import delta_text

KEY = "sk-test-never-shown-0123456789"


@pytest.fixture
async def model() -> AsyncIterator[FakeModel]:
    async with FakeModel() as fake:
        yield fake


def brain(model: FakeModel, **settings: Any) -> OpenAIAgent:
    values = {"model": "fake-model", "base_url": model.base_url, "system_prompt": "be brief",
              **settings}
    return OpenAIAgent(ModelSettings(**values), KEY)


@pytest.fixture
async def lmind(tmp_path: Path, model: FakeModel) -> AsyncIterator[LocalMind]:
    async with local_mind(tmp_path / "home", brain(model)) as m:
        await hand_ready(m)
        yield m


async def face_on(lmind: LocalMind) -> tuple[FaceClient, str]:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    return face, cid


async def snapshot(face: FaceClient, cid: str) -> dict[str, Any]:
    request_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    return (await face.reply(request_id))["payload"]


async def test_a_models_words_stream_to_faces_and_the_reply_keeps_its_usage(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(Reply([*text("Hello", ", ", "world"), usage(20, 3)]))
    face, cid = await face_on(lmind)
    result = await face.chat_to_end(cid, "hi", "q1")
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == "Hello, world"
    assert delta_text(face.seen, "q1") == "Hello, world"
    expected = {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23, "requests": 1}
    assert result["payload"]["data"]["usage"] == expected
    done = await face.expect(event("chat.completed", request_id="q1"))
    assert done["payload"]["data"]["usage"] == expected
    reply = (await snapshot(face, cid))["messages"][-1]
    assert (reply["role"], reply["content"], reply["usage"]) == (
        "assistant", "Hello, world", expected)
    await face.close()


async def test_a_reply_without_usage_has_no_usage_field(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(Reply(text("plain")))
    face, cid = await face_on(lmind)
    result = await face.chat_to_end(cid, "hi", "q1")
    assert "usage" not in result["payload"]["data"]
    assert "usage" not in (await snapshot(face, cid))["messages"][-1]
    await face.close()


async def test_the_next_chat_carries_the_conversation_so_far(
    lmind: LocalMind, model: FakeModel
) -> None:
    face, cid = await face_on(lmind)
    await face.chat_to_end(cid, "first question", "q1")  # echoed by the fake model
    await face.chat_to_end(cid, "second question", "q2")
    second = model.requests[1].messages
    assert second == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first question"},
        {"role": "user", "content": "second question"},
    ]
    await face.close()


async def test_the_model_is_offered_the_tools_of_the_conversations_hand(
    lmind: LocalMind, model: FakeModel
) -> None:
    face, cid = await face_on(lmind)
    await face.chat_to_end(cid, "hi", "q1")
    tools = model.requests[0].body["tools"]
    assert [t["function"]["name"] for t in tools] == ["exec_command", "read_file", "start_task"]
    schema = tools[0]["function"]["parameters"]
    assert schema["required"] == ["command"] and schema["type"] == "object"
    await face.close()


async def test_without_a_hand_no_tool_is_offered(tmp_path: Path, model: FakeModel) -> None:
    async with local_mind(tmp_path / "home", brain(model), local_hand=False) as lm:
        face, cid = await face_on(lm)
        await face.chat_to_end(cid, "hi", "q1")
        assert "tools" not in model.requests[0].body
        assert "tool_choice" not in model.requests[0].body
        await face.close()


async def test_a_model_tool_call_waits_for_approval_runs_on_the_hand_and_its_result_goes_back(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(
        Reply(tool_calls(("call_42", "exec_command", '{"command": "echo from-the-hand"}'))),
        Reply(text("It said ", "from-the-hand.")),
    )
    face, cid = await face_on(lmind)
    chat = await face.command("face.chat", "q1", conversation_id=cid, content="run it")
    called = await face.expect(event("chat.tool_called", request_id=chat))
    assert called["payload"]["data"]["tool"] == "exec_command"
    assert called["payload"]["data"]["args"] == {"command": "echo from-the-hand"}
    asked = await face.expect(event("approval.requested", request_id=chat))
    assert len(model.requests) == 1  # the model waits with the chat
    decide = await face.command("face.approval.resolve",
                                approval_id=asked["payload"]["data"]["approval_id"],
                                decision="allow_once")
    assert (await face.reply(decide))["payload"]["data"]["outcome"] == "applied"
    completed = await face.expect(event("chat.tool_completed", request_id=chat))
    assert completed["payload"]["data"]["status"] == "succeeded"
    result = await face.reply(chat, ("face.result",), 20)
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == "It said from-the-hand."

    [tool] = [m for m in model.requests[1].messages if m["role"] == "tool"]
    assert tool["tool_call_id"] == "call_42"
    content = json.loads(tool["content"])
    assert content["status"] == "succeeded" and content["exit_code"] == 0
    assert content["stdout"] == "from-the-hand\n"
    await face.close()


async def test_a_denied_call_tells_the_model_and_the_chat_goes_on(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(Reply(tool_calls(("c1", "exec_command", '{"command": "rm -rf /"}'))),
                 Reply(text("understood")))
    face, cid = await face_on(lmind)
    chat = await face.command("face.chat", "q1", conversation_id=cid, content="go")
    asked = await face.expect(event("approval.requested", request_id=chat))
    await face.command("face.approval.resolve", approval_id=asked["payload"]["data"]["approval_id"],
                       decision="deny_once")
    result = await face.reply(chat, ("face.result",), 20)
    assert result["payload"]["content"] == "understood"
    content = json.loads(model.requests[1].messages[-1]["content"])
    assert content == {"status": "denied", "error_category": "denied"}
    await face.close()


async def test_bad_arguments_from_the_model_never_reach_a_hand_nor_crash_the_chat(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(Reply(tool_calls(("c1", "read_file", '{"path": '))), Reply(text("oops")))
    face, cid = await face_on(lmind)
    result = await face.chat_to_end(cid, "go", "q1")
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == "oops"
    assert not events_of(face.seen, "chat.tool_called")
    content = json.loads(model.requests[1].messages[-1]["content"])
    assert content["error_category"] == "bad_arguments"
    await face.close()


async def test_cancel_while_the_model_is_silent_closes_its_stream_and_keeps_the_text(
    lmind: LocalMind, model: FakeModel
) -> None:
    gate = Gate()
    model.script(Reply([*text("So far ", finish=None), gate, *text("never shown")]))
    face, cid = await face_on(lmind)
    chat = await face.command("face.chat", "q1", conversation_id=cid, content="go")
    await face.expect(lambda f: f["type"] == "face.chat.delta")
    cancel = await face.command("face.chat.cancel", conversation_id=cid, target_request_id=chat)
    result = await face.reply(chat, ("face.result",))
    assert (result["payload"]["status"], result["payload"]["content"]) == ("cancelled", "So far ")
    assert (await face.reply(cancel, ("face.result",)))["payload"]["data"]["outcome"] == "cancelled"
    await model.requests[0].gone.wait()  # the provider's stream is closed
    assert not gate.event.is_set()
    reply = (await snapshot(face, cid))["messages"][-1]
    assert (reply["status"], reply["content"]) == ("cancelled", "So far ")
    await face.close()


async def test_cancel_before_the_first_byte_closes_the_request(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(Reply(text("late"), before=Gate()))
    face, cid = await face_on(lmind)
    chat = await face.command("face.chat", "q1", conversation_id=cid, content="go")
    await model.wait_requests(1)
    await face.command("face.chat.cancel", conversation_id=cid, target_request_id=chat)
    result = await face.reply(chat, ("face.result",))
    assert (result["payload"]["status"], result["payload"]["content"]) == ("cancelled", "")
    await model.requests[0].gone.wait()
    await face.close()


async def test_a_stream_cut_after_text_was_shown_fails_with_that_text_and_is_not_retried(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(Reply([*text("Half of it", finish=None), Cut()]))
    face, cid = await face_on(lmind)
    result = await face.chat_to_end(cid, "go", "q1")
    assert result["payload"]["status"] == "failed"
    assert result["payload"]["error_code"] == "provider_error"
    assert result["payload"]["content"] == "Half of it"
    assert "model server" in result["payload"]["data"]["reason"]
    assert len(model.requests) == 1
    reply = (await snapshot(face, cid))["messages"][-1]
    assert (reply["status"], reply["error_code"], reply["content"]) == (
        "failed", "provider_error", "Half of it")
    await face.close()


async def test_a_refused_key_is_its_own_failure_and_never_reaches_a_face(
    lmind: LocalMind, model: FakeModel
) -> None:
    model.script(Reply(status=401, message=f"Incorrect API key provided: {KEY}",
                       code="invalid_api_key"))
    face, cid = await face_on(lmind)
    result = await face.chat_to_end(cid, "go", "q1")
    assert result["payload"]["error_code"] == "provider_unauthorized"
    assert all(KEY not in json.dumps(f) for f in face.seen)
    await face.close()


async def test_a_retried_request_shows_nothing_twice(lmind: LocalMind, model: FakeModel) -> None:
    model.script(Reply(status=429, message="slow down", retry_after=0),
                 Reply([chunk({"role": "assistant"}), Cut()]),
                 Reply(text("once")))
    face, cid = await face_on(lmind)
    result = await face.chat_to_end(cid, "go", "q1")
    assert result["payload"]["content"] == "once"
    assert delta_text(face.seen, "q1") == "once"
    assert len(model.requests) == 3
    await face.close()
