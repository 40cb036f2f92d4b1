"""The Chat Completions rules as plain functions: no server, no SDK."""

from __future__ import annotations

import json

import pytest

from halfpi.agents.base import ToolSpec, Turn
from halfpi.agents.completions import (
    CONTEXT_TOO_LONG,
    DONE,
    MAX_TOOL_RESULT_CHARS,
    MODEL_NOT_FOUND,
    PROVIDER_ERROR,
    PROVIDER_UNAUTHORIZED,
    AnswerDecoder,
    EventStream,
    StreamError,
    ToolCallAssembler,
    assistant_message,
    classify,
    decode_chunk,
    estimate_tokens,
    fit_history,
    parse_arguments,
    refuses_unlisted,
    request_messages,
    scrub,
    tool_choice,
    tool_result_content,
)

# -- tool calls ---------------------------------------------------------------------


def test_a_call_split_across_fragments_is_put_together() -> None:
    calls = ToolCallAssembler()
    calls.feed(0, "call_a", "read_", None)
    calls.feed(0, None, "file", '{"pa')
    calls.feed(0, None, None, 'th": "/etc/')
    calls.feed(0, None, None, 'hostname"}')
    [call] = calls.calls(0)
    assert (call.id, call.name) == ("call_a", "read_file")
    assert json.loads(call.arguments) == {"path": "/etc/hostname"}


def test_two_interleaved_calls_come_out_in_index_order() -> None:
    calls = ToolCallAssembler()
    calls.feed(1, "call_b", "exec_command", '{"command":')
    calls.feed(0, "call_a", "read_file", '{"path":')
    calls.feed(1, None, None, ' "ls"}')
    calls.feed(0, None, None, ' "x"}')
    got = [(c.id, c.name, json.loads(c.arguments)) for c in calls.calls(0)]
    assert got == [
        ("call_a", "read_file", {"path": "x"}),
        ("call_b", "exec_command", {"command": "ls"}),
    ]


def test_a_server_that_repeats_id_and_name_in_every_fragment_is_read_right() -> None:
    calls = ToolCallAssembler()  # llama-cpp-python's chatml-function-calling does this
    for piece in ('{"comm', 'and": ', '"uname"}'):
        calls.feed(0, "call_x", "exec_command", piece)
    [call] = calls.calls(0)
    assert (call.id, call.name, call.arguments) == (
        "call_x", "exec_command", '{"command": "uname"}'
    )


def test_a_call_without_an_id_gets_one_its_result_can_answer() -> None:
    calls = ToolCallAssembler()
    calls.feed(0, None, "read_file", "{}")
    calls.feed(1, None, "read_file", "{}")
    assert [c.id for c in calls.calls(3)] == ["call_3_0", "call_3_1"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"path": "/etc', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('"ls"', "must be a JSON object, not str"),
    ],
)
def test_arguments_that_are_not_one_json_object_say_why(text: str, why: str) -> None:
    result = parse_arguments(text)
    assert isinstance(result, str) and why in result


def test_empty_arguments_are_an_empty_object() -> None:
    assert parse_arguments("") == {}
    assert parse_arguments(' {"a": 1} ') == {"a": 1}


def test_the_assistant_step_keeps_a_string_content_next_to_its_calls() -> None:
    calls = ToolCallAssembler()
    calls.feed(0, "c1", "read_file", '{"path": "a"}')
    message = assistant_message("", calls.calls(0))
    assert message["content"] == ""
    assert message["tool_calls"] == [
        {"id": "c1", "type": "function",
         "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
    ]


def test_a_tool_result_for_the_model_is_bounded_and_says_so() -> None:
    result = {"status": "succeeded", "exit_code": 0, "stdout": "x" * (MAX_TOOL_RESULT_CHARS + 5),
              "stderr": "", "error_category": None}
    content = json.loads(tool_result_content(result))
    assert content["status"] == "succeeded" and content["exit_code"] == 0
    assert len(content["stdout"]) == MAX_TOOL_RESULT_CHARS
    assert content["truncated"] is True
    assert "stderr" not in content and "error_category" not in content
    denied = json.loads(tool_result_content(
        {"status": "denied", "error_category": "denied", "exit_code": None}))
    assert denied == {"status": "denied", "error_category": "denied"}


def test_tool_choice_names_a_forced_tool_and_is_absent_without_tools() -> None:
    spec = ToolSpec("exec_command", "run", {"type": "object"})
    assert tool_choice("auto", [spec]) == "auto"
    assert tool_choice("none", [spec]) == "none"
    assert tool_choice("exec_command", [spec]) == {
        "type": "function", "function": {"name": "exec_command"}
    }
    assert tool_choice("read_file", [spec]) == "auto"
    assert tool_choice("exec_command", []) is None


# -- the context budget ---------------------------------------------------------------


def turns(*pairs: tuple[str, str]) -> list[Turn]:
    out = []
    for question, answer in pairs:
        out += [Turn("user", question), Turn("assistant", answer, "succeeded")]
    return out


def test_the_oldest_messages_are_dropped_first() -> None:
    history = turns(("q1" * 40, "a1" * 40), ("q2", "a2"), ("q3", "a3"))
    budget = sum(estimate_tokens(t.content) for t in history[2:])
    kept, dropped = fit_history(history, budget)
    assert [t.content for t in kept] == ["q2", "a2", "q3", "a3"]
    assert dropped == 2


def test_what_is_kept_never_starts_with_a_reply() -> None:
    history = turns(("q1", "a1" * 100), ("q2", "a2"))
    budget = sum(estimate_tokens(t.content) for t in history[1:])  # a1 fits, q1 does not
    kept, dropped = fit_history(history, budget - estimate_tokens("q1"))
    assert kept[0].role == "user"
    assert [t.content for t in kept] == ["q2", "a2"]
    assert dropped == 2


def test_a_question_whose_reply_said_nothing_is_left_out_with_it() -> None:
    history = [Turn("user", "q1"), Turn("assistant", "", "failed"),
               Turn("user", "q2"), Turn("assistant", "partly", "interrupted")]
    kept, dropped = fit_history(history, 10_000)
    assert [(t.role, t.content) for t in kept] == [("user", "q2"), ("assistant", "partly")]
    assert dropped == 2


def test_the_system_prompt_and_the_message_are_always_sent() -> None:
    messages, dropped = request_messages("be brief", turns(("q1", "a1")), "now", budget=1)
    assert messages == [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": "now"}]
    assert dropped == 2
    messages, dropped = request_messages("", turns(("q1", "a1")), "now", budget=10_000)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert dropped == 0


# -- failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "code", "expected", "retryable"),
    [
        (None, "Connection refused", None, PROVIDER_ERROR, True),
        (429, "Rate limit reached", "rate_limit_exceeded", PROVIDER_ERROR, True),
        (500, "boom", None, PROVIDER_ERROR, True),
        (503, "overloaded", None, PROVIDER_ERROR, True),
        (401, "Incorrect API key provided", "invalid_api_key", PROVIDER_UNAUTHORIZED, False),
        (403, "not allowed", None, PROVIDER_UNAUTHORIZED, False),
        (400, "This model's maximum context length is 4096 tokens", None, CONTEXT_TOO_LONG,
         False),
        (400, "too long", "context_length_exceeded", CONTEXT_TOO_LONG, False),
        (400, "the request exceeds the available context size, try increasing it", None,
         CONTEXT_TOO_LONG, False),
        (404, "The model `gpt-9` does not exist", "model_not_found", MODEL_NOT_FOUND, False),
        (404, "model 'llama9' not found", None, MODEL_NOT_FOUND, False),
        (400, "gpt-9 is not a valid model ID", None, MODEL_NOT_FOUND, False),
        (404, "Not Found", None, PROVIDER_ERROR, False),
        (400, "temperature must be at most 2", None, PROVIDER_ERROR, False),
    ],
)
def test_each_failure_has_its_code(
    status: int | None, message: str, code: str | None, expected: str, retryable: bool
) -> None:
    failure = classify(status, message, code=code)
    assert (failure.code, failure.retryable) == (expected, retryable)
    assert "\n" not in failure.message


def test_a_failure_never_repeats_the_key() -> None:
    key = "sk-proj-abcdefghijklmnop1234"
    failure = classify(401, f"Incorrect API key provided: {key}. Also sk-ab***1234 and "
                            f"Bearer {key}", secrets=[key])
    assert key not in failure.message
    assert "sk-ab" not in failure.message
    assert "***" in failure.message


def test_a_reason_is_one_bounded_line() -> None:
    line = scrub("a\nb\t c " + "x" * 1000)
    assert line.startswith("a b c ")
    assert len(line) <= 300 and "\n" not in line


# -- the event stream ---------------------------------------------------------------


def test_events_split_anywhere_come_out_whole() -> None:
    wire = b'data: {"a": 1}\n\ndata: {"b": 2}\r\n\r\n: a comment\n\nevent: x\ndata: [DONE]\n\n'
    for cut in range(1, len(wire)):
        events = EventStream()
        got = events.feed(wire[:cut]) + events.feed(wire[cut:])
        assert got == [b'{"a": 1}', b'{"b": 2}', DONE], cut


def test_events_of_plain_newlines_split_anywhere_come_out_whole() -> None:
    wire = (b'data: {"a": 1}\n\n: a comment\n\nevent: x\ndata: y\ndata: z\n\n\n'
            b"data:{}\n\ndata: [DONE]\n\n")
    want = [b'{"a": 1}', b"y\nz", b"{}", DONE]
    for cut in range(1, len(wire)):
        for tail in (wire[cut:], wire[cut:].replace(b"\n", b"\r\n")):
            events = EventStream()
            assert events.feed(wire[:cut]) + events.feed(tail) == want, (cut, tail)


def test_the_data_lines_of_one_event_are_joined() -> None:
    events = EventStream()
    assert events.feed(b"data: a\r\n") == []
    assert events.feed(b"data: b\n\n") == [b"a\nb"]  # one event, two reads
    assert EventStream().feed(b"data: {\"a\":\ndata: 1}\n\n") == [b'{"a":\n1}']
    assert EventStream().feed(b"data:{}\n\n") == [b"{}"]


def test_a_chunk_is_read_for_what_a_chat_needs_and_nothing_more() -> None:
    chunk = decode_chunk(json.dumps({
        "id": "x", "object": "chat.completion.chunk", "system_fingerprint": "fp",
        "choices": [{"index": 0, "logprobs": None, "finish_reason": None,
                     "delta": {"role": "assistant", "content": "hi", "reasoning": "…",
                               "tool_calls": [{"id": "c", "function": {"name": "f"}}]}}],
    }).encode())
    assert chunk.choices is not None
    [choice] = chunk.choices
    assert choice.delta is not None and choice.delta.content == "hi"
    assert choice.delta.tool_calls is not None
    assert (choice.delta.tool_calls[0].index, choice.delta.tool_calls[0].id) == (0, "c")
    usage = decode_chunk(b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,'
                         b' "total_tokens": 7}}').usage
    assert usage is not None and usage.total_tokens == 7
    assert decode_chunk(b'{"error": {"message": "overloaded"}}').error == {"message": "overloaded"}


def test_something_that_is_not_a_chunk_says_so() -> None:
    with pytest.raises(ValueError, match="not a chunk"):
        decode_chunk(b"<html>502 Bad Gateway</html>")


def _sse(*chunks: object) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n"
                    for c in chunks)


def _text(content: str, finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


def test_the_text_of_the_chunks_fed_together_is_taken_as_one() -> None:
    answer = AnswerDecoder(ToolCallAssembler())
    answer.feed(_sse(_text("Hel"), _text("lo")) + b'data: {"choices": [{"delta": {"con')
    assert answer.take_text() == "Hello"
    assert answer.take_text() == ""
    answer.feed(b'tent": " there"}}]}\n\n' + _sse(_text("", "stop")))
    assert (answer.take_text(), answer.finish) == (" there", "stop")


def test_an_answer_assembles_its_calls_and_counts_its_tokens() -> None:
    calls = ToolCallAssembler()
    answer = AnswerDecoder(calls)
    fragment = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}
    answer.feed(_sse(
        {"choices": [{"delta": {"tool_calls": [fragment]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
        DONE,
        _text("after the end"),
    ))
    [call] = calls.calls(0)
    assert (call.id, call.name, call.arguments) == ("c1", "f", '{"a": 1}')
    assert answer.finish == "tool_calls" and answer.done
    assert [u.total_tokens for u in answer.take_usage()] == [7]
    assert answer.take_text() == "" and answer.take_usage() == []


def test_an_answer_that_is_not_a_reply_says_why() -> None:
    with pytest.raises(StreamError, match="overloaded"):
        AnswerDecoder(ToolCallAssembler()).feed(_sse({"error": {"message": "overloaded"}}))
    with pytest.raises(StreamError, match="not a chunk"):
        AnswerDecoder(ToolCallAssembler()).feed(_sse(b"<html>502</html>"))


# -- which model lists say what a server refuses ---------------------------------------


@pytest.mark.parametrize(("listed", "refused"), [
    ([("gpt-4o", "openai"), ("gpt-4o-mini", "system")], True),  # OpenAI
    ([("qwen2.5:0.5b", "library")], True),  # Ollama
    ([("Qwen/Qwen2.5-0.5B", "vllm")], True),  # vLLM
    ([("/models/SmolLM2-135M.gguf", "llamacpp")], False),  # llama.cpp's llama-server
    ([("SmolLM2-135M-Instruct", "me")], False),  # llama-cpp-python's server
    ([("smollm2", "llamacpp")], False),  # listed: nothing to warn of anyway
    ([("smollm2", "openai")], False),
    ([], False),  # a server that lists nothing says nothing
])
def test_only_an_authoritative_model_list_predicts_model_not_found(
    listed: list[tuple[str, str | None]], refused: bool,
) -> None:
    assert refuses_unlisted("smollm2", listed) is refused
