"""Two devices race one approval (DESIGN §7, I10), with real processes — on
one Mind and on a two-node cluster, where the devices' connections land on
different nodes and both decisions are forwarded to the conversation's owner."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support.client import FaceClient
from tests.support.mind import MindProcess

pytestmark = [pytest.mark.e2e, pytest.mark.servers("native", "asgi", "cluster")]

Frame = dict[str, Any]
CHAT_ENDS = ("chat.completed", "chat.failed", "chat.cancelled", "chat.interrupted")


def approval_events(face: FaceClient, type_: str, approval_id: str) -> list[Frame]:
    return [
        f for f in face.events()
        if f["type"] == "face.event"
        and f["payload"]["type"] == type_
        and f["payload"]["data"]["approval_id"] == approval_id
    ]


@pytest.mark.parametrize("rounds", [3])
async def test_I10_two_devices_race_an_approval_one_decision_stands_everywhere(
    mind_proc: MindProcess, rounds: int
) -> None:
    op = await FaceClient.connect(mind_proc.url, mind_proc.token)
    cid = await op.create_conversation()
    phone = await FaceClient.connect(mind_proc.url, mind_proc.token)
    laptop = await FaceClient.connect(mind_proc.url, mind_proc.token)
    for face in (op, phone, laptop):
        assert (await face.subscribe(cid))["type"] == "face.accepted"

    for n in range(rounds):
        content = "/tool exec_command " + json.dumps({"command": f"echo raced-{n}"})
        rid = await op.command("face.chat", f"chat-{n}", conversation_id=cid, content=content)
        asked = [
            await face.expect(
                lambda f, rid=rid: f["type"] == "face.event"
                and f["payload"]["type"] == "approval.requested"
                and f["payload"]["data"].get("request_id") == rid,
                20,
            )
            for face in (phone, laptop)
        ]
        approval_id = asked[0]["payload"]["data"]["approval_id"]
        assert asked[1]["payload"]["data"]["approval_id"] == approval_id
        # Either device lists it as waiting, whichever node it is connected to.
        for face in (phone, laptop):
            listed = await face.reply(await face.command("face.approval.list"))
            assert [a["approval_id"] for a in listed["payload"]["data"]["approvals"]] == [
                approval_id
            ]

        # Both decide at once, opposite ways.
        await asyncio.gather(
            phone.send("face.approval.resolve", {"request_id": f"phone-{n}",
                       "approval_id": approval_id, "decision": "allow_once"}),
            laptop.send("face.approval.resolve", {"request_id": f"laptop-{n}",
                        "approval_id": approval_id, "decision": "deny_once"}),
        )
        answers = [
            (await phone.reply(f"phone-{n}", ("face.result", "face.error"), 20))["payload"],
            (await laptop.reply(f"laptop-{n}", ("face.result", "face.error"), 20))["payload"],
        ]
        outcomes = sorted(a["data"]["outcome"] for a in answers)
        assert outcomes == ["already_resolved", "applied"], answers
        standing = [a["data"]["resolution"] for a in answers]
        assert standing[0] == standing[1]  # the loser is told the winner's decision
        winner = standing[0]["decision"]
        assert winner in ("allow_once", "deny_once")

        # Every device sees exactly one resolution, the winner's, and the chat
        # ends the way that decision says.
        for face in (op, phone, laptop):
            await face.expect(
                lambda f, rid=rid: f["type"] == "face.event"
                and f["payload"]["type"] in CHAT_ENDS
                and f["payload"]["data"].get("request_id") == rid,
                20,
            )
            resolved = approval_events(face, "approval.resolved", approval_id)
            assert len(resolved) == 1, resolved
            assert resolved[0]["payload"]["data"]["decision"] == winner
    for face in (op, phone, laptop):
        await face.close()
