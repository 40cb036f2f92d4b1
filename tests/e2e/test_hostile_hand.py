"""A Hand with valid credentials that breaks the limits or lies (DESIGN §8).

A raw WebSocket client speaks the Hand protocol to a real ``halfpi mind``
with a real Hand credential, takes a run, then misbehaves. The Mind must
refuse the frame, close the Hand with 4009, mark its run ``lost``, and pass
nothing oversized on to a Face.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.core.hand_wire import CHUNK_BYTES, PROGRESS_EVENTS
from tests.support.cli import hand_add
from tests.support.client import FaceClient
from tests.support.frames import event, events_of
from tests.support.hand import allow_check, hello_payload, honest_result
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e

HAND = "rogue"


@pytest.fixture
async def mind(tmp_path: Path) -> AsyncIterator[tuple[MindProcess, str]]:
    home = tmp_path / "home"
    home.mkdir()
    token = (await hand_add(home, HAND)).token
    process = MindProcess(home, extra_args=("--no-local-hand",)).start()
    try:
        yield process, token
    finally:
        process.kill()


def of_type(type_: str) -> Any:
    return lambda f: f["type"] == type_


def progress(run_id: str, generation: int, data: str) -> str:
    return json.dumps({"type": "hand.progress", "payload": {
        "run_id": run_id, "generation": generation, "kind": "stdout", "data": data}})


@pytest.mark.parametrize(
    "misbehaviour",
    ["oversized_chunk", "too_many_events", "lying_length", "lying_digest", "oversized_result"],
)
async def test_hand_breaking_the_limits_is_closed_and_its_run_lost(
    mind: tuple[MindProcess, str], misbehaviour: str
) -> None:
    process, token = mind
    face = await FaceClient.connect(process.url, process.token)
    cid = await face.create_conversation("hostile")
    await face.subscribe(cid, detail_mode="transparent")
    hand = await FaceClient.connect(process.url.removesuffix("/v1/face") + "/v1/hand",
                                    hello=False)
    await hand.send("hand.hello", hello_payload(token, HAND, os.urandom(8).hex()))
    await hand.expect(of_type("hand.welcome"))

    chat = await face.command("face.chat", conversation_id=cid, content="/tool read_file "
                              + json.dumps({"path": "/etc/hostname", "hand": HAND}))
    check = await hand.expect(of_type("hand.check"))
    await hand.send("hand.checked", allow_check(check["payload"]))
    order = (await hand.expect(of_type("hand.run")))["payload"]
    run_id, generation = order["run_id"], order["generation"]
    await hand.send("hand.started", {"run_id": run_id, "generation": generation})
    await face.expect(event("run.changed", run_id=run_id, status="running"), 10)

    if misbehaviour == "oversized_chunk":
        for _ in range(3):  # the first one is enough; the rest must go nowhere
            await hand.send_raw(progress(run_id, generation, "x" * 16 * 1024))
    elif misbehaviour == "too_many_events":
        for n in range(PROGRESS_EVENTS + 50):
            await hand.send_raw(progress(run_id, generation, f"line {n}\n"))
    else:
        lie = {
            "lying_length": {"output_bytes": 5},
            "lying_digest": {"digest": "sha256:lie"},
            "oversized_result": {"stdout": "y" * (1024 * 1024 + 10), "truncated": True,
                                 "output_bytes": 4 << 20},
        }[misbehaviour]
        result = honest_result(run_id, generation, stdout="z" * 100)
        await hand.send("hand.result", {**result, **lie})

    assert await hand.closed_with(10) == 4009
    completed = await face.expect(event("chat.tool_completed", request_id=chat), 10)
    assert completed["payload"]["data"]["status"] == "lost", completed
    reply = await face.reply(chat, ("face.result", "face.error"), 10)
    assert "broke the protocol" in reply["payload"]["content"], reply
    assert [f["payload"]["data"]["status"] for f in events_of(face.seen, "run.changed",
                                                              run_id=run_id)][-1] == "lost"
    shown = [f for f in face.seen if f["type"] == "face.chat.tool.progress"]
    assert all(len(f["payload"]["data"].encode()) <= CHUNK_BYTES for f in shown)
    assert len(shown) <= PROGRESS_EVENTS
    text = json.dumps(face.seen)
    assert "x" * CHUNK_BYTES not in text and "y" * CHUNK_BYTES not in text
    assert "z" * 100 not in text, "the lying result was not recorded"
    await face.close()


async def test_an_impostor_with_the_local_hands_stolen_token_is_refused_and_gets_no_call(
    tmp_path: Path,
) -> None:
    """Issue: with the ``local`` Hand's token an impostor connected, displaced
    the embedded Hand, received a tool call's arguments and returned a forged
    result. Now it is refused (4029, audited) and the embedded Hand answers."""
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "note.txt").write_text("the real file\n")
    process = MindProcess(home).start()
    try:
        face = await FaceClient.connect(process.url, process.token)
        cid = await face.create_conversation("impostor")
        await face.subscribe(cid, detail_mode="transparent")
        first = await face.chat_to_end(cid, "/tool read_file " + json.dumps(
            {"path": str(tmp_path / "note.txt"), "hand": "local"}))
        assert "the real file" in first["payload"]["content"], first  # the local Hand is up
        stolen = (home / "hand.token").read_text().strip()
        impostor = await FaceClient.connect(
            process.url.removesuffix("/v1/face") + "/v1/hand", hello=False)
        await impostor.send("hand.hello", hello_payload(stolen, "local", os.urandom(8).hex()))
        assert await impostor.closed_with(10) == 4029
        assert not [f for f in impostor.seen if f["type"] in ("hand.welcome", "hand.check",
                                                                 "hand.run")]
        again = await face.chat_to_end(cid, "/tool read_file " + json.dumps(
            {"path": str(tmp_path / "note.txt"), "hand": "local"}))
        assert again["payload"]["status"] == "succeeded", again
        assert "the real file" in again["payload"]["content"], again
        assert "audit: refused a second link for Hand 'local' from 127.0.0.1" in process.log()
        assert stolen not in process.log()
        await face.close()
    finally:
        process.kill()
