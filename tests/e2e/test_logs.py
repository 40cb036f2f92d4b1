"""Structured logs (``--log-format json``) never carry a secret
(docs/operations.md, "Logs"): a real Mind at ``--log-level debug`` through
a chat with a tool call admitted in summary mode, an SSE stream opened
with a ticket and a handshake with a wrong token; every line of its log
is JSON and none holds a token, the ticket, the stream key, the tool
call's arguments or its output."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import hand_add
from tests.support.client import FaceClient
from tests.support.hand import HandProcess
from tests.support.http_door import base_url
from tests.support.mind import MindProcess
from tests.support.sse import read_sse

pytestmark = pytest.mark.e2e

ARGUMENT = "argument-0f3c9a1e"  # in the tool call's arguments only (the file's name)
OUTPUT = "output-7d52b64c"  # in the tool's output only (the file's content)
BAD_TOKEN = "not-a-token-93e1d0"


async def until_hand_connected(face: FaceClient, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        request_id = await face.command("face.hand.list")
        hands = (await face.reply(request_id))["payload"]["data"]["hands"]
        if any(h["connected"] for h in hands):
            return
        assert loop.time() < deadline, f"no Hand connected: {hands}"
        await asyncio.sleep(0.05)  # poll interval


async def read_a_file_in_summary_mode(
    mind: MindProcess, secret_file: Path
) -> tuple[FaceClient, str, dict[str, Any]]:
    """A Face that asks, in summary mode, for a chat whose tool call reads
    ``secret_file`` on a Hand: the Face, the conversation, the chat's result."""
    face = await FaceClient.connect(mind.url, mind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid, detail_mode="summary")
    await until_hand_connected(face)
    args = json.dumps({"path": str(secret_file)})
    chat = await face.chat_to_end(cid, f"/tool read_file {args}")
    assert chat["payload"]["status"] == "succeeded", chat
    # The output really flowed: the summary reply does not show it, but the
    # tool's completion counts its bytes (the file's whole content).
    [done] = [e["payload"]["data"] for e in face.events(cid)
              if e["payload"].get("type") == "chat.tool_completed"]
    assert done["success"] and done["output_bytes"] == len(f"{OUTPUT}\n"), done
    return face, cid, chat


async def test_json_logs_at_debug_never_hold_a_token_ticket_key_argument_or_output(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    secret_file = tmp_path / f"{ARGUMENT}.txt"  # the local Hand's root is tmp_path
    secret_file.write_text(f"{OUTPUT}\n")
    mind = MindProcess(home, extra_args=("--log-level", "debug", "--log-format", "json"))
    mind.start()
    try:
        face, cid, chat = await read_a_file_in_summary_mode(mind, secret_file)

        base = base_url(mind.url)
        async with httpx.AsyncClient(base_url=base) as client:
            answer = await client.post("/v1/stream-tickets", json={"conversations": [cid]},
                                       headers={"Authorization": f"Bearer {mind.token}"})
            assert answer.status_code == 200, answer.text
            ticket = answer.json()["ticket"]
            stream = await read_sse(f"{base}/v1/events",
                                    params={"conversations": cid, "ticket": ticket},
                                    stop=lambda r: any(f["type"] == "face.snapshot"
                                                       for f in r.frames()))
            assert stream.status == 200

        intruder = await FaceClient.connect(mind.url, hello=False)
        await intruder.send("face.hello", {"token": BAD_TOKEN, "protocol": 3,
                                           "client": {"name": "test", "version": "0"}})
        await intruder.closed_with()
        await face.close()
    finally:
        assert mind.terminate() == 0
    log = (home / "mind.log").read_text()
    lines = [line for line in log.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    # The chat's own line names its conversation, request and run.
    [ended] = [r for r in records if r["message"].startswith("chat ") and "ends" in r["message"]]
    assert ended["level"] == "debug"
    assert ended["conversation_id"] == cid
    assert ended["request_id"] == chat["payload"]["request_id"]
    assert ended["run_id"] == chat["payload"]["data"]["run_id"]
    assert any("failed: unknown or revoked face credential" in r["message"] for r in records)
    secrets = {
        "face token": mind.token,
        "hand token": (home / "hand.token").read_text().strip(),
        "stream ticket": ticket,
        "bad token": BAD_TOKEN,
        "tool argument": ARGUMENT,
        "tool output": OUTPUT,
    }
    key = home / "stream.key"
    if key.exists():
        secrets["stream key"] = key.read_bytes().hex()
    for what, secret in secrets.items():
        for line in lines:
            assert secret not in line, f"the log holds the {what}: {line}"


async def test_a_hand_logs_json_lines_too_without_its_token_or_a_tool_call(
    tmp_path: Path,
) -> None:
    """``halfpi hand --log-format json --log-level debug``: every line one
    JSON object, its connection said, none holding its token, the call's
    arguments or its output."""
    home = tmp_path / "home"
    home.mkdir()
    hand_token = (await hand_add(home, "laptop")).token
    root = tmp_path / "project"
    root.mkdir()
    secret_file = root / f"{ARGUMENT}.txt"
    secret_file.write_text(f"{OUTPUT}\n")
    mind = MindProcess(home, extra_args=("--no-local-hand",)).start()
    hand_log = tmp_path / "hand.log"
    hand = HandProcess(mind.url.removesuffix("/v1/face") + "/v1/hand", hand_token, "laptop",
                       hand_log, ("--root", str(root), "--log-format", "json",
                                  "--log-level", "debug"))
    try:
        face, _, _ = await read_a_file_in_summary_mode(mind, secret_file)
        await face.close()
    finally:
        hand.kill()
        mind.terminate()
    records = [json.loads(line) for line in hand_log.read_text().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records), records
    assert any(r["logger"] == "halfpi.hand" and "connected" in r["message"] for r in records)
    # The run's own line names its run, in the message and as a field.
    [ended] = [r for r in records if "read_file ended succeeded" in r["message"]]
    assert ended["run_id"] and ended["run_id"] in ended["message"], ended
    text = hand_log.read_text()
    for what, secret in {"hand token": hand_token, "tool argument": ARGUMENT,
                         "tool output": OUTPUT}.items():
        assert secret not in text, f"the Hand's log holds the {what}"
