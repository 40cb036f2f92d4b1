"""``face.chat.cancel`` reaches the chat it names (DESIGN §5), whenever it lands."""

from __future__ import annotations

import asyncio

from halfpi.core.scopes import scopes_for
from halfpi.mind.auth import make_credential
from tests.support.client import FaceClient
from tests.support.frames import events_of
from tests.support.mind import LocalMind
from tests.support.store import HeldCommits


async def test_cancel_during_admission_commit_cancels_the_chat(lmind: LocalMind) -> None:
    asker = await FaceClient.connect(lmind.url, lmind.token)
    other = await FaceClient.connect(lmind.url, lmind.token)  # the same principal elsewhere
    cid = await asker.create_conversation()
    held = HeldCommits(
        lmind.mind.store, lambda tx: tx.admit is not None and tx.admit.type == "face.chat"
    )
    lmind.mind.store = held  # type: ignore[assignment]
    chat_id = await asker.command("face.chat", conversation_id=cid, content="hello world")
    await asyncio.wait_for(held.arrived.wait(), 10)
    cancel_id = await other.command(
        "face.chat.cancel", conversation_id=cid, target_request_id=chat_id
    )
    accepted = await other.reply(cancel_id, ("face.accepted", "face.error"))
    assert accepted["type"] == "face.accepted", accepted  # the Mind took the cancel
    await held.release()
    lmind.mind.store = held.inner

    result = await asker.reply(chat_id, ("face.result", "face.error"))
    cancel = await other.reply(cancel_id)
    # The agent was never told to stop: the reply ran to its end.
    assert result["payload"]["status"] == "cancelled", result
    assert cancel["payload"]["data"]["outcome"] == "cancelled", cancel
    await asker.close()
    await other.close()


async def second_operator(lmind: LocalMind, label: str) -> FaceClient:
    mind = lmind.mind
    credential, token = make_credential(
        "face", label, "operator", scopes_for("operator"), mind.wall()
    )
    await mind.store.add_credential(credential)
    await mind.refresh_credentials()
    return await FaceClient.connect(lmind.url, token)


async def test_chat_cancel_targets_the_callers_own_request(lmind: LocalMind) -> None:
    alice = await FaceClient.connect(lmind.url, lmind.token)
    bob = await second_operator(lmind, "bob")
    cid = await alice.create_conversation()
    await alice.subscribe(cid)
    mine = await bob.chat_to_end(cid, "hello", request_id="job-1")
    assert mine["payload"]["status"] == "succeeded"
    await alice.command("face.chat", "job-1", conversation_id=cid, content="/sleep 30")
    await alice.reply("job-1", ("face.accepted",))  # admitted, and its reply running
    # Bob cancels *his* job-1, which has already finished.
    cancel_id = await bob.command(
        "face.chat.cancel", conversation_id=cid, target_request_id="job-1"
    )
    reply = await bob.reply(cancel_id, timeout=20)
    assert reply["payload"]["data"]["target_status"] == "succeeded", reply
    assert not events_of(alice.seen, "chat.cancelled", request_id="job-1")
    await alice.close()
    await bob.close()
