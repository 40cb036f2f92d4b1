"""A real model behind a real ``halfpi mind`` (DESIGN §1.2).

llama-cpp-python's OpenAI-compatible server runs SmolLM2-135M-Instruct
(``tests/support/real_model.py``); a recording proxy between the Mind and it
(``FakeModel(upstream=…)``) keeps every request the Mind sent. The model's
words are nonsense: these tests assert structure — real tokens stream to a
Face, a Face that loses its link mid-reply resumes exactly, a forced tool
call runs ``exec_command`` on the Mind's Hand after a person's approval and
its result is in the model's next request — never content.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.client import FaceClient, seq_of
from tests.support.fake_openai import FakeModel
from tests.support.frames import event
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy
from tests.support.real_model import llama_server
from tests.support.stream import assert_contiguous, delta_text, is_terminal_event, positioned

pytestmark = [pytest.mark.e2e, pytest.mark.real_model]

# What the Mind is told about the model (HOME/agent.toml). llama-cpp-python's
# chatml-function-calling streams a tool call only when tool_choice forces
# one, and text only with "none": never "auto".
SETTINGS = """\
[openai]
system_prompt = "You are a helpful assistant."
temperature = 0
max_output_tokens = {tokens}
context_budget = 1024
tool_choice = "{first}"
later_tool_choice = "none"
step_limit = 2
"""
# A command the test lets run: words, paths and quotes, none of them one
# that changes anything. Anything else the model makes up is denied.
HARMLESS = re.compile(r"^[\w\s.,:/='\"()-]*$")
CHANGES = re.compile(r"\b(rm|mv|dd|mkfs|chmod|chown|kill|shutdown|reboot|curl|wget|sudo)\b|>")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server(tmp_path_factory.mktemp("llama") / "server.log") as url:
        yield url


@pytest.fixture
async def recorder(llama: str) -> AsyncIterator[FakeModel]:
    async with FakeModel(upstream=llama) as proxy:
        yield proxy


def start_mind(tmp_path: Path, recorder: FakeModel, *, tokens: int, first: str) -> MindProcess:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agent.toml").write_text(SETTINGS.format(tokens=tokens, first=first))
    mind = MindProcess(home, extra_args=("--agent", "openai", "--model", "smollm2",
                                         "--base-url", recorder.base_url))
    return mind.start()


@pytest.fixture
def marks_cleanup() -> Iterator[list[MindProcess]]:
    started: list[MindProcess] = []
    yield started
    for mind in started:
        mind.kill()


async def test_real_tokens_stream_to_a_face_that_resumes_mid_reply_exactly(
    tmp_path: Path, recorder: FakeModel, marks_cleanup: list[MindProcess]
) -> None:
    mind = start_mind(tmp_path, recorder, tokens=96, first="none")
    marks_cleanup.append(mind)
    proxy = await FaultProxy(mind.port).start()
    try:
        face = await FaceClient.connect(proxy.url, mind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        watcher = await FaceClient.connect(mind.url, mind.token)
        await watcher.subscribe(cid)
        chat = await face.command("face.chat", "q-real", conversation_id=cid,
                                  content="Tell me a long story about a cat and a boat.")
        # Two tokens shown, then the link breaks while the model goes on.
        for _ in range(2):
            await face.expect(lambda f: f["type"] == "face.chat.delta", 120)
        proxy.cut_all()
        assert await face.closed_with(5) is None
        before = positioned(face.seen, cid)
        last = before[-1]["payload"]["cursor"]
        assert not [f for f in before if is_terminal_event(f)], "the reply ended before the cut"

        again = await FaceClient.connect(proxy.url, mind.token)
        sub = await again.subscribe(cid, since=last)
        assert sub["payload"]["replay"] == "exact", sub
        done = await again.expect(lambda f: is_terminal_event(f, chat), 180)
        assert done["payload"]["type"] == "chat.completed", done
        content = done["payload"]["data"]["content"]
        after = positioned(again.seen, cid)
        assert_contiguous(after, seq_of(last) + 1, done["payload"]["seq"])
        shown = delta_text(before, chat) + delta_text(after, chat)
        assert shown == content and len(content.split()) > 2
        # Real tokens, one delta each: many deltas, each a piece of the text.
        deltas = [f for f in before + after if f["type"] == "face.chat.delta"]
        assert len(deltas) > 5
        # The Face that never lost its link saw the same reply.
        await watcher.expect(lambda f: is_terminal_event(f, chat), 30)
        assert delta_text(watcher.seen, chat) == content
        [request] = recorder.requests
        assert request.body["stream"] is True and request.body["tool_choice"] == "none"
        await again.close()
        await watcher.close()
    finally:
        await proxy.stop()


async def test_a_forced_tool_call_runs_on_the_hand_after_approval_and_its_result_reaches_the_model(
    tmp_path: Path, recorder: FakeModel, marks_cleanup: list[MindProcess]
) -> None:
    mind = start_mind(tmp_path, recorder, tokens=48, first="exec_command")
    marks_cleanup.append(mind)
    face = await FaceClient.connect(mind.url, mind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    chat = await face.command("face.chat", "q-tool", conversation_id=cid,
                              content="Run the command: echo hello")
    called = await face.expect(event("chat.tool_called", request_id=chat), 180)
    assert called["payload"]["data"]["tool"] == "exec_command"
    asked = await face.expect(event("approval.requested", request_id=chat), 60)
    args: dict[str, Any] = asked["payload"]["data"]["args"]
    command = str(args.get("command", ""))
    harmless = bool(HARMLESS.match(command)) and not CHANGES.search(command)
    decide = await face.command(
        "face.approval.resolve", approval_id=asked["payload"]["data"]["approval_id"],
        decision="allow_once" if harmless else "deny_once")
    assert (await face.reply(decide))["payload"]["data"]["outcome"] == "applied"
    completed = await face.expect(event("chat.tool_completed", request_id=chat), 60)
    outcome = completed["payload"]["data"]
    if harmless:  # it ran on the Hand: a process that exited
        assert outcome["run_id"] is not None
        assert outcome["result"]["exit_code"] is not None, (args, json.dumps(outcome))
    else:
        assert outcome["status"] == "denied"
    result = await face.reply(chat, ("face.result",), 180)
    assert result["payload"]["status"] == "succeeded", result

    first, second = recorder.requests
    forced = {"type": "function", "function": {"name": "exec_command"}}
    assert first.body["tool_choice"] == forced
    assert second.body["tool_choice"] == "none"
    step, answer = second.messages[-2], second.messages[-1]
    [made] = step["tool_calls"]
    assert made["function"]["name"] == "exec_command"
    assert json.loads(made["function"]["arguments"]) == args
    assert answer["role"] == "tool" and answer["tool_call_id"] == made["id"]
    told = json.loads(answer["content"])
    assert told["status"] == outcome["status"]
    if harmless:
        assert told["exit_code"] == outcome["result"]["exit_code"]
    await face.close()
