"""Every reply stays with its status, its reason and whatever text it had.

A failed, cancelled or interrupted reply is an assistant message like a
successful one — live (the terminal event) and after a resync (the
snapshot) — so no Face ever shows a question with nothing after it.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.client import FaceClient
from tests.support.frames import event
from tests.support.mind import LocalMind, local_mind


async def snapshot_messages(face: FaceClient, cid: str) -> list[dict[str, object]]:
    request_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    return list((await face.reply(request_id))["payload"]["messages"])


async def test_a_failed_reply_keeps_a_message_with_its_code_and_reason(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    result = await face.chat_to_end(cid, "/tool exec_command {not json")
    assert result["payload"]["status"] == "failed"
    assert result["payload"]["error_code"] == "agent_bad_input"
    reason = result["payload"]["data"]["reason"]
    assert reason.startswith("tool arguments are not JSON")
    failed = await face.expect(event("chat.failed"))
    assert failed["payload"]["data"]["reason"] == reason
    reply = (await snapshot_messages(face, cid))[-1]
    assert (reply["role"], reply["status"], reply["content"]) == ("assistant", "failed", "")
    assert (reply["error_code"], reply["reason"]) == ("agent_bad_input", reason)
    await face.close()


async def test_a_cancelled_reply_says_who_cancelled_it(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    chat_id = await face.command("face.chat", conversation_id=cid, content="/sleep 20")
    await face.expect(event("chat.started", request_id=chat_id))
    await face.command("face.chat.cancel", conversation_id=cid, target_request_id=chat_id)
    result = await face.reply(chat_id)
    assert result["payload"]["status"] == "cancelled"
    cancelled = await face.expect(event("chat.cancelled", request_id=chat_id))
    assert cancelled["payload"]["data"]["reason"] == "cancelled by local"
    reply = (await snapshot_messages(face, cid))[-1]
    assert (reply["status"], reply["reason"], reply["content"]) == (
        "cancelled", "cancelled by local", ""
    )
    await face.close()


async def test_a_reply_stopped_by_a_shutdown_says_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with local_mind(home, scripted_delta_ms=50.0) as lmind:
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        chat_id = await face.command("face.chat", conversation_id=cid, content="/repeat 500 w")
        await face.expect(lambda f: f["type"] == "face.chat.delta")
    async with local_mind(home) as lmind:
        face = await FaceClient.connect(lmind.url, lmind.token)
        reply = (await snapshot_messages(face, cid))[-1]
        assert (reply["request_id"], reply["status"]) == (chat_id, "interrupted")
        assert reply["reason"] == "the Mind shut down"
        assert str(reply["content"]).startswith("w")
        await face.close()
