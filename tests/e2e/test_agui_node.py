"""AG-UI's own client (``@ag-ui/client``, run by node, its event verifier on)
against a real ``halfpi mind`` on both servers (docs/protocol.md §19)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from halfpi.core.agui import messages_of
from tests.support import programs
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy

NODE_DIR = Path(__file__).resolve().parents[1] / "agui" / "node"
DRIVER = NODE_DIR / "driver.mjs"


def need_node() -> str:
    """node, with the AG-UI client installed (``npm ci``, once per run); skips
    without node (CI requires it: HALFPI_NODE)."""
    programs.node_modules(NODE_DIR)
    return programs.require("node")


@pytest.fixture
def slow_mind(tmp_path: Path, server_kind: str) -> Any:
    need_node()  # skips (or fails, in CI) before any process starts
    (tmp_path / "home").mkdir()
    proc = MindProcess(tmp_path / "home", server=server_kind, delta_ms=40.0).start()
    try:
        yield proc
    finally:
        proc.kill()


def http_of(proc: MindProcess) -> str:
    return "http://" + proc.url.split("://", 1)[1].split("/", 1)[0]


async def drive(base: str, token: str, thread: str, mode: str, text: str,
                on_content: Any = None) -> dict[str, Any]:
    node = need_node()
    child = await asyncio.create_subprocess_exec(
        node, str(DRIVER), base, token, thread, mode, text, cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    contents = 0
    result: dict[str, Any] | None = None
    async with asyncio.timeout(60):
        async for line in child.stdout:
            if line.startswith(b"CONTENT"):
                contents += 1
                if on_content is not None:
                    on_content(contents)
            elif line.startswith(b"RESULT "):
                result = json.loads(line[7:])
        errors = (await child.stderr.read()).decode()
        assert await child.wait() == 0, errors
    assert result is not None, errors
    # The client's verifier (and its appliers' warnings) speak up on stderr;
    # a cut connection is logged too ("terminated"), and is expected.
    for refusal in ("AGUIError", "Cannot send", "First event", "No message found", "warn"):
        assert refusal not in errors, errors
    return result


async def mind_messages(base: str, token: str, cid: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=base,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        snapshot = (await client.get(f"/v1/conversations/{cid}")).json()
    return [m.model_dump(mode="json", by_alias=True) for m in messages_of(snapshot)]


async def create(base: str, token: str) -> str:
    async with httpx.AsyncClient(base_url=base,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        answer = await client.post("/v1/commands/face.conversation.create", json={},
                                   headers={"Idempotency-Key": "agui-node-create"})
        return str(answer.json()["data"]["conversation_id"])


async def test_the_agui_client_streams_a_reply_cut_mid_message_and_rejoined(
        slow_mind: MindProcess) -> None:
    base = http_of(slow_mind)
    cid = await create(base, slow_mind.token)
    proxy = await FaultProxy(slow_mind.port if slow_mind.port else int(base.rsplit(":", 1)[1])
                             ).start()
    try:
        def cut(contents: int) -> None:
            if contents == 4:
                proxy.cut_all()  # mid-message: the reply has 12 words

        result = await drive(f"http://127.0.0.1:{proxy.port}", slow_mind.token, cid, "run",
                             "/repeat 12 word", cut)
    finally:
        await proxy.stop()
    assert result["cuts"] >= 1, result["log"]
    assert result["messages"] == await mind_messages(base, slow_mind.token, cid)
    reply = result["messages"][-1]
    assert reply["content"] == " ".join(["word"] * 12)


async def test_the_agui_client_round_trips_a_tool_approval(slow_mind: MindProcess) -> None:
    base = http_of(slow_mind)
    cid = await create(base, slow_mind.token)
    result = await drive(base, slow_mind.token, cid, "tool",
                         '/tool exec_command {"command": "echo from-the-hand"}')
    assert result["cuts"] == 0, result["log"]
    messages = result["messages"]
    assert messages == await mind_messages(base, slow_mind.token, cid)
    tool = next(m for m in messages if m["role"] == "tool")
    assert "from-the-hand" in tool["content"]


async def test_a_run_rejoined_after_a_mind_restart_ends_with_an_honest_run_error_I11(
        slow_mind: MindProcess) -> None:
    base = http_of(slow_mind)
    token = slow_mind.token
    cid = await create(base, token)
    body = {"threadId": cid, "runId": "before-restart",
            "messages": [{"id": "m1", "role": "user", "content": "/repeat 200 word"}]}
    last_id = None
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                 timeout=30) as client, \
            client.stream("POST", "/v1/agui", json=body) as response:
        contents = 0
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                last_id = line[4:]
            contents += '"TEXT_MESSAGE_CONTENT"' in line
            if contents >= 3 and line.startswith("id: "):
                break
    slow_mind.kill()
    slow_mind.port = 0
    slow_mind.start()
    base = http_of(slow_mind)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                 timeout=30) as client:
        answer = await client.get("/v1/agui", params={"threadId": cid, "runId": "before-restart"},
                                  headers={"Last-Event-ID": last_id or ""})
    events = [json.loads(line[6:]) for line in answer.text.splitlines()
              if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "RUN_STARTED" and "MESSAGES_SNAPSHOT" in kinds
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "interrupted"
