"""Every tool call the Mind records ends with its ``chat.tool_completed`` (DESIGN §6),
however its run ends: cancelled twice, or called with arguments of the wrong type."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.client import FaceClient, approve_next
from tests.support.frames import event, events_of
from tests.support.mind import LocalMind, hand_ready

STUBBORN = '/tool exec_command {"command": "trap \'\' TERM; echo ready; sleep 30"}'


async def test_second_cancel_during_tool_cancel_still_completes_the_call(
    lmind: LocalMind,
) -> None:
    await hand_ready(lmind)
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    chat_id = await face.command("face.chat", conversation_id=cid, content=STUBBORN)
    await approve_next(face, chat_id)
    await face.expect(
        lambda f: f["type"] == "face.chat.tool.progress" and "ready" in f["payload"]["data"]
    )
    # An impatient person presses cancel twice (or two Faces cancel at once).
    first = await face.command("face.chat.cancel", conversation_id=cid, target_request_id=chat_id)
    await face.reply(first, ("face.accepted",))
    second = await face.command("face.chat.cancel", conversation_id=cid, target_request_id=chat_id)
    await face.reply(second, ("face.accepted",))
    ended = await face.expect(event("chat.cancelled", request_id=chat_id), timeout=20)
    (called,) = events_of(face.seen, "chat.tool_called", request_id=chat_id)
    tool_call_id = called["payload"]["data"]["tool_call_id"]
    completed = [
        f
        for f in events_of(face.seen, "chat.tool_completed", tool_call_id=tool_call_id)
        if f["payload"]["seq"] < ended["payload"]["seq"]
    ]
    # Let the Hand finish killing the command before looking at the record.
    await face.expect(event("run.changed", status="cancelled"), timeout=20)
    snap_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    snap = await face.reply(snap_id)
    statuses = [r["status"] for r in snap["payload"]["tool_history"]]
    assert completed, "the chat ended with its tool call still open"
    assert statuses == ["cancelled"], statuses
    await face.close()


async def test_bad_timeout_argument_completes_the_call_as_failed(
    lmind: LocalMind, tmp_path: Path
) -> None:
    await hand_ready(lmind)
    target = tmp_path / "notes.txt"
    target.write_text("body\n")
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    content = "/tool read_file " + json.dumps({"path": str(target), "timeout_s": "soon"})
    result = await face.chat_to_end(cid, content)
    chat_id = result["payload"]["request_id"]
    (called,) = events_of(face.seen, "chat.tool_called", request_id=chat_id)
    tool_call_id = called["payload"]["data"]["tool_call_id"]
    completed = events_of(face.seen, "chat.tool_completed", tool_call_id=tool_call_id)
    snap_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    snap = await face.reply(snap_id)
    statuses = [r["status"] for r in snap["payload"]["tool_history"]]
    assert result["payload"].get("error_code") != "internal_error", result
    assert completed, "the tool call was never completed"
    assert statuses != ["running"], statuses
    await face.close()
