"""The model provider against a real HTTP server speaking the Chat
Completions streaming format (``tests/support/fake_openai.py``), through the
real ``openai`` SDK: streaming, tool calls, retries, failures, cancel."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from halfpi.agents.base import AgentFailed, ChatInput, Delta, ToolSpec, Turn, Usage
from halfpi.agents.openai import OpenAIAgent
from halfpi.config import ModelSettings
from tests.support.fake_openai import (
    Cut,
    FakeModel,
    Gate,
    Reply,
    call,
    chunk,
    text,
    tool_calls,
    usage,
)

KEY = "sk-test-0123456789abcdef"
EXEC = ToolSpec("exec_command", "run a command", {"type": "object",
                                                  "properties": {"command": {"type": "string"}}})
READ = ToolSpec("read_file", "read a file", {"type": "object",
                                             "properties": {"path": {"type": "string"}}})


class Tools:
    """The Mind's tool path as the agent sees it: records each call."""

    def __init__(self, results: dict[str, dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.results = results or {}

    async def __call__(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((tool, args))
        return self.results.get(tool) or {"tool": tool, "status": "succeeded", "exit_code": 0,
                                           "stdout": f"ran {tool}", "stderr": ""}


@pytest.fixture
async def model() -> AsyncIterator[FakeModel]:
    async with FakeModel() as fake:
        yield fake


def agent(model: FakeModel, **settings: Any) -> tuple[OpenAIAgent, list[float]]:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    values = {"model": "fake-model", "base_url": model.base_url, "system_prompt": "be brief",
              **settings}
    return OpenAIAgent(ModelSettings(**values), KEY, sleep=sleep), waits


def chat(content: str = "hello", tools: Tools | None = None, history: list[Turn] | None = None,
         specs: tuple[ToolSpec, ...] = (EXEC, READ)) -> ChatInput:
    async def read_history() -> list[Turn]:
        return list(history or [])

    return ChatInput("c1", "q1", content, tools or Tools(), read_history, specs)


async def collect(brain: OpenAIAgent, input: ChatInput) -> tuple[str, list[Usage]]:
    said, used = [], []
    async for out in brain.reply(input):
        if isinstance(out, Delta):
            said.append(out.text)
        else:
            used.append(out)
    return "".join(said), used


async def test_text_streams_as_deltas_in_the_order_it_came(model: FakeModel) -> None:
    gate = Gate()  # opened once the first delta is out: the rest comes in a later read
    model.script(Reply([*text("Hel", "lo", finish=None), gate, *text(" there")]))
    brain, _ = agent(model)
    deltas = []
    async for out in brain.reply(chat()):
        if isinstance(out, Delta):
            deltas.append(out.text)
            gate.event.set()
    # The chunks one read brought are one delta; a later read, another.
    assert deltas == ["Hello", " there"]
    [request] = model.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["stream"] is True
    assert request.body["model"] == "fake-model"
    assert request.messages == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hello"}]
    offered = [t["function"]["name"] for t in request.body["tools"]]
    assert offered == ["exec_command", "read_file", "start_task"]
    assert request.body["tool_choice"] == "auto"


async def test_a_compressed_stream_is_read_as_plain_text(model: FakeModel) -> None:
    model.script(Reply(text("zip", "ped"), gzip=True))
    brain, _ = agent(model)
    said, _ = await collect(brain, chat())
    assert said == "zipped"


async def test_the_history_that_fits_comes_before_the_message(model: FakeModel) -> None:
    model.script(Reply(text("ok")))
    brain, _ = agent(model, context_budget=256)
    old = [Turn("user", "old " * 400), Turn("assistant", "long ago " * 100, "succeeded"),
           Turn("user", "recent"), Turn("assistant", "yes", "succeeded")]
    await collect(brain, chat("now", history=old))
    assert model.requests[0].messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "recent"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "now"},
    ]


async def test_a_tool_call_split_across_chunks_runs_and_its_result_goes_back(
    model: FakeModel,
) -> None:
    model.script(
        Reply(tool_calls(("call_1", "read_file", '{"path": "/etc/hostname"}'), pieces=4)),
        Reply(text("it is ", "myhost")),
    )
    tools = Tools({"read_file": {"tool": "read_file", "status": "succeeded", "exit_code": None,
                                 "stdout": "myhost\n", "stderr": ""}})
    brain, _ = agent(model)
    said, _ = await collect(brain, chat("what host?", tools))
    assert said == "it is myhost"
    assert tools.calls == [("read_file", {"path": "/etc/hostname"})]
    second = model.requests[1].messages
    assert second[-2] == {
        "role": "assistant", "content": "",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "read_file",
                                     "arguments": '{"path": "/etc/hostname"}'}}],
    }
    assert second[-1]["role"] == "tool"
    assert second[-1]["tool_call_id"] == "call_1"
    assert json.loads(second[-1]["content"]) == {"status": "succeeded", "stdout": "myhost\n"}
    assert model.requests[1].body["tool_choice"] == "auto"


async def test_two_tool_calls_in_one_turn_both_run_and_both_answer(model: FakeModel) -> None:
    model.script(
        Reply(tool_calls(("call_a", "read_file", '{"path": "a"}'),
                         ("call_b", "exec_command", '{"command": "uname"}'))),
        Reply(text("done")),
    )
    tools = Tools()
    brain, _ = agent(model)
    said, _ = await collect(brain, chat("two things", tools))
    assert said == "done"
    assert tools.calls == [("read_file", {"path": "a"}), ("exec_command", {"command": "uname"})]
    answers = [(m["tool_call_id"], json.loads(m["content"])["stdout"])
               for m in model.requests[1].messages if m["role"] == "tool"]
    assert answers == [("call_a", "ran read_file"), ("call_b", "ran exec_command")]


async def test_invalid_json_arguments_go_back_to_the_model_as_a_tool_error(
    model: FakeModel,
) -> None:
    model.script(
        Reply(tool_calls(("call_bad", "exec_command", '{"command": "ls'))),
        Reply(text("sorry")),
    )
    tools = Tools()
    brain, _ = agent(model)
    said, _ = await collect(brain, chat("list", tools))
    assert said == "sorry"
    assert tools.calls == []  # nothing ran
    answer = model.requests[1].messages[-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_bad"
    content = json.loads(answer["content"])
    assert content["status"] == "failed"
    assert content["error_category"] == "bad_arguments"
    assert "not valid JSON" in content["error"]


async def test_the_model_starts_a_background_task_and_hears_its_id_at_once(
    model: FakeModel,
) -> None:
    model.script(
        Reply(tool_calls(("call_1", "start_task",
                          '{"tool": "exec_command", "arguments": {"command": "make"}}'))),
        Reply(text("started")),
    )
    started: list[tuple[str, dict[str, Any]]] = []

    async def start_task(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        started.append((tool, args))
        return {"status": "accepted", "task_id": "t_1", "hand": "local"}

    tools = Tools()
    brain, _ = agent(model)
    base = chat("build it", tools)
    said, _ = await collect(brain, ChatInput(base.conversation_id, base.request_id, base.content,
                                             base.call_tool, base.history, base.tools,
                                             start_task))
    assert said == "started"
    assert started == [("exec_command", {"command": "make"})]
    assert tools.calls == []  # nothing ran in the foreground
    answer = json.loads(model.requests[1].messages[-1]["content"])
    assert answer == {"status": "accepted", "task_id": "t_1", "hand": "local"}


async def test_start_task_is_not_offered_without_a_hand(model: FakeModel) -> None:
    model.script(Reply(text("ok")))
    brain, _ = agent(model)
    await collect(brain, chat(specs=()))
    assert "tools" not in model.requests[0].body


async def test_a_tool_that_was_not_offered_does_not_run(model: FakeModel) -> None:
    model.script(Reply(tool_calls(("c1", "rm_everything", "{}"))), Reply(text("ok")))
    tools = Tools()
    brain, _ = agent(model, tools=("read_file",))
    await collect(brain, chat("x", tools))
    assert tools.calls == []
    assert [t["function"]["name"] for t in model.requests[0].body["tools"]] == ["read_file"]
    content = json.loads(model.requests[1].messages[-1]["content"])
    assert content["error_category"] == "unknown_tool"


async def test_a_forced_tool_applies_to_the_first_step_only(model: FakeModel) -> None:
    model.script(Reply(tool_calls(("c1", "exec_command", '{"command": "true"}'))),
                 Reply(text("ok")))
    brain, _ = agent(model, tool_choice="exec_command", later_tool_choice="none")
    await collect(brain, chat("x"))
    assert model.requests[0].body["tool_choice"] == {
        "type": "function", "function": {"name": "exec_command"}}
    assert model.requests[1].body["tool_choice"] == "none"


async def test_the_text_of_each_step_is_kept_apart(model: FakeModel) -> None:
    model.script(
        Reply([*text("Let me look.", finish=None)[:2],
               call(0, "c1", "read_file", '{"path": "a"}'), chunk({}, "tool_calls")]),
        Reply(text("Found it.")),
    )
    brain, _ = agent(model)
    said, _ = await collect(brain, chat("x"))
    assert said == "Let me look.\n\nFound it."
    assert model.requests[1].messages[-2]["content"] == "Let me look."


async def test_the_step_limit_ends_a_model_that_keeps_calling_tools(model: FakeModel) -> None:
    model.script(*(Reply(tool_calls((f"c{i}", "read_file", '{"path": "a"}'))) for i in range(3)))
    brain, _ = agent(model, step_limit=3)
    with pytest.raises(AgentFailed) as failed:
        await collect(brain, chat("x"))
    assert failed.value.code == "step_limit"
    assert len(model.requests) == 3


async def test_usage_is_reported_per_request(model: FakeModel) -> None:
    model.script(Reply([*text("hi"), usage(12, 3)]))
    brain, _ = agent(model)
    said, used = await collect(brain, chat())
    assert said == "hi"
    assert used == [Usage(12, 3, 15)]
    assert model.requests[0].body["stream_options"] == {"include_usage": True}


async def test_429_then_success_is_retried_before_anything_was_shown(model: FakeModel) -> None:
    model.script(Reply(status=429, message="slow down", retry_after=2),
                 Reply(status=503, message="busy"),
                 Reply(text("fine")))
    brain, waits = agent(model)
    said, _ = await collect(brain, chat())
    assert said == "fine"
    assert len(model.requests) == 3
    assert waits[0] == 2.0  # the server's Retry-After
    assert len(waits) == 2


async def test_retries_give_up_with_provider_error(model: FakeModel) -> None:
    model.script(*(Reply(status=500, message="down") for _ in range(3)))
    brain, waits = agent(model, retries=2)
    with pytest.raises(AgentFailed) as failed:
        await collect(brain, chat())
    assert failed.value.code == "provider_error"
    assert "500" in str(failed.value)
    assert len(model.requests) == 3 and len(waits) == 2


async def test_a_stream_cut_mid_reply_fails_with_the_shown_text_and_no_retry(
    model: FakeModel,
) -> None:
    model.script(Reply([*text("half a ", "sent", finish=None), Cut()]))
    brain, waits = agent(model)
    said: list[str] = []
    with pytest.raises(AgentFailed) as failed:
        async for out in brain.reply(chat()):
            if isinstance(out, Delta):
                said.append(out.text)
    assert "".join(said) == "half a sent"
    assert failed.value.code == "provider_error"
    assert waits == [] and len(model.requests) == 1


async def test_a_stream_cut_before_any_text_is_retried(model: FakeModel) -> None:
    model.script(Reply([chunk({"role": "assistant", "content": ""}), Cut()]), Reply(text("ok")))
    brain, waits = agent(model)
    said, _ = await collect(brain, chat())
    assert said == "ok" and len(waits) == 1


@pytest.mark.parametrize(
    ("status", "message", "code", "expected"),
    [
        (400, "This model's maximum context length is 2048 tokens", "context_length_exceeded",
         "context_too_long"),
        (404, "The model `nope` does not exist", "model_not_found", "model_not_found"),
        (401, f"Incorrect API key provided: {KEY}", "invalid_api_key", "provider_unauthorized"),
    ],
)
async def test_each_refusal_has_its_own_code_and_is_not_retried(
    model: FakeModel, status: int, message: str, code: str, expected: str
) -> None:
    model.script(Reply(status=status, message=message, code=code))
    brain, waits = agent(model)
    with pytest.raises(AgentFailed) as failed:
        await collect(brain, chat())
    assert failed.value.code == expected
    assert KEY not in str(failed.value)
    assert waits == [] and len(model.requests) == 1


async def test_an_unreachable_server_is_a_provider_error(model: FakeModel) -> None:
    port = model.port
    await model.stop()
    brain = OpenAIAgent(ModelSettings(model="m", base_url=f"http://127.0.0.1:{port}/v1",
                                      retries=1), None, sleep=lambda s: asyncio.sleep(0))
    with pytest.raises(AgentFailed) as failed:
        await collect(brain, chat())
    assert failed.value.code == "provider_error"
    assert "could not be reached" in str(failed.value)


async def test_a_cancel_during_a_slow_first_byte_closes_the_connection(
    model: FakeModel,
) -> None:
    gate = Gate()
    model.script(Reply(text("never"), before=gate))
    brain, _ = agent(model)
    task = asyncio.create_task(collect(brain, chat()))
    [request] = await model.wait_requests(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(request.gone.wait(), 5)


async def test_a_cancel_mid_stream_closes_the_connection_at_once(model: FakeModel) -> None:
    gate = Gate()
    model.script(Reply([*text("first ", finish=None), gate, *text("second")]))
    brain, _ = agent(model)
    first = asyncio.Event()

    async def run() -> None:
        async for out in brain.reply(chat()):
            if isinstance(out, Delta):
                first.set()

    task = asyncio.create_task(run())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(model.requests[0].gone.wait(), 5)
    assert not gate.event.is_set()
    assert not [t for t in asyncio.all_tasks() if "_pump" in repr(t.get_coro())]


async def test_an_error_the_server_reports_mid_stream_fails_the_chat_with_its_message(
    model: FakeModel,
) -> None:
    model.script(Reply([*text("partial", finish=None), {"error": {"message": "overloaded"}}]))
    brain, waits = agent(model)
    with pytest.raises(AgentFailed) as failed:
        await collect(brain, chat())
    assert failed.value.code == "provider_error"
    assert "overloaded" in str(failed.value)
    assert waits == []


async def test_a_reply_left_after_a_stream_error_leaves_no_unheard_failure(
    model: FakeModel,
) -> None:
    model.script(Reply([*text("partial", finish=None), {"error": {"message": "overloaded"}}]))
    brain, _ = agent(model)
    loop = asyncio.get_running_loop()
    unheard: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unheard.append(context))
    try:
        replies = brain.reply(chat())
        assert await anext(replies) == Delta("partial")
        await replies.aclose()  # the caller goes away before the failure is raised
        del replies
        await loop.shutdown_asyncgens()  # the provider's inner generators end now
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert not [c for c in unheard if "never retrieved" in str(c.get("message"))]


async def test_a_stream_that_ends_without_a_finish_reason_is_not_a_whole_reply(
    model: FakeModel,
) -> None:
    model.script(Reply(text("cut short", finish=None)))  # [DONE] without a finish reason
    brain, _ = agent(model)
    with pytest.raises(AgentFailed) as failed:
        await collect(brain, chat())
    assert failed.value.code == "provider_error"
    assert "before the reply finished" in str(failed.value)
