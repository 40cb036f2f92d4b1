"""The tool policy end to end (DESIGN §8), with real processes.

A ``halfpi mind`` subprocess, a ``halfpi hand`` subprocess with its own root,
Faces over WebSocket, tool calls through the scripted agent (``/tool NAME
JSON``) and the approval flow — as a user drives them. Then the escalation
that once worked: a credential that may not approve reads the local
operator's token through ``read_file`` and approves its own commands.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import face_add, hand_add
from tests.support.client import FaceClient, connect_new_credential
from tests.support.frames import event, events_of
from tests.support.hand import HandProcess
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e

HAND = "laptop"


@dataclass
class Scene:
    tmp: Path
    mind: MindProcess
    hand: HandProcess
    root: Path
    face: FaceClient
    cid: str

    def tool(self, name: str, **args: Any) -> str:
        return f"/tool {name} " + json.dumps({**args, "hand": HAND})


async def listed_hand(face: FaceClient, hand_id: str = HAND,
                      timeout: float = 15.0) -> dict[str, Any]:
    """Poll ``face.hand.list`` until the Hand is connected."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        request_id = await face.command("face.hand.list")
        reply = await face.reply(request_id)
        for hand in reply["payload"]["data"]["hands"]:
            if hand["hand_id"] == hand_id and hand["connected"]:
                return dict(hand)
        assert loop.time() < deadline, f"the Hand never connected: {reply}"
        await asyncio.sleep(0.05)  # poll interval


@pytest.fixture
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    home = tmp_path / "home"
    home.mkdir()
    token = (await hand_add(home, HAND)).token
    root = tmp_path / "project"
    root.mkdir()
    mind = MindProcess(home, extra_args=("--no-local-hand",)).start()
    hand = HandProcess(mind.url.removesuffix("/v1/face") + "/v1/hand", token, HAND,
                       tmp_path / "hand.log", ("--root", str(root)))
    face = await FaceClient.connect(mind.url, mind.token)
    try:
        cid = await face.create_conversation("policy")
        await face.subscribe(cid, detail_mode="transparent")
        yield Scene(tmp_path, mind, hand, root, face, cid)
    finally:
        await face.close()
        hand.kill()
        mind.kill()


async def chat(s: Scene, content: str) -> str:
    request_id = await s.face.command("face.chat", conversation_id=s.cid, content=content)
    accepted = await s.face.reply(request_id, ("face.accepted", "face.error"))
    assert accepted["type"] == "face.accepted", accepted
    return request_id


async def outcome(s: Scene, request_id: str) -> tuple[dict[str, Any], str]:
    """The call's ``chat.tool_completed`` data and the chat's final content."""
    completed = await s.face.expect(event("chat.tool_completed", request_id=request_id), 20)
    result = await s.face.reply(request_id, ("face.result", "face.error"), 20)
    assert result["type"] == "face.result", result
    return completed["payload"]["data"], str(result["payload"].get("content", ""))


async def requested(s: Scene, request_id: str) -> dict[str, Any]:
    frame = await s.face.expect(event("approval.requested", request_id=request_id), 20)
    return dict(frame["payload"]["data"])


async def allow(s: Scene, approval: dict[str, Any]) -> None:
    resolve = await s.face.command("face.approval.resolve", decision="allow_once",
                                   approval_id=approval["approval_id"])
    assert (await s.face.reply(resolve))["payload"]["data"]["outcome"] == "applied"


def asked(s: Scene, request_id: str) -> bool:
    return bool(events_of(s.face.seen, "approval.requested", request_id=request_id))


async def test_tool_policy_of_a_real_hand(scene: Scene) -> None:
    s = scene
    listed = await listed_hand(s.face)
    assert listed["roots"] == [str(s.root.resolve())]
    assert listed["rules"] == {"exec_command": "always", "read_file": "outside_roots"}
    token_file = s.mind.home / "face.token"
    secret = token_file.read_text().strip()

    # Inside the root: runs without asking.
    (s.root / "notes.txt").write_text("inside the root\n")
    inside = await chat(s, s.tool("read_file", path=str(s.root / "notes.txt")))
    done, content = await outcome(s, inside)
    assert done["status"] == "succeeded" and "inside the root" in content
    assert not asked(s, inside)

    # Outside the root: asks, and runs once allowed.
    far = s.tmp / "far.txt"
    far.write_text("outside the root\n")
    outside = await chat(s, s.tool("read_file", path=str(far)))
    approval = await requested(s, outside)
    assert str(far) in approval["reason"] and "outside" in approval["reason"]
    await allow(s, approval)
    done, content = await outcome(s, outside)
    assert done["status"] == "succeeded" and "outside the root" in content

    # The Mind's token, directly or through a symlink in the root: refused,
    # no human is even asked, nothing of the token comes back.
    link = s.root / "innocent.txt"
    link.symlink_to(token_file)
    for path in (token_file, link, s.mind.home / "halfpi.db"):
        refused = await chat(s, s.tool("read_file", path=str(path)))
        done, content = await outcome(s, refused)
        assert done["status"] == "failed", done
        assert done["error_category"] == "forbidden_path", done
        assert not asked(s, refused)
        assert secret not in content

    # Even with approval: a link that points outside the root when the call
    # is checked, and at the token when it runs, is refused by the Hand.
    swap = s.root / "swap.txt"
    swap.symlink_to(far)
    racing = await chat(s, s.tool("read_file", path=str(swap)))
    approval = await requested(s, racing)
    swap.unlink()
    swap.symlink_to(token_file)
    await allow(s, approval)
    done, content = await outcome(s, racing)
    assert done["error_category"] == "forbidden_path", done
    assert secret not in content

    # An approved command: refused if it names the token, and its process
    # never sees the Hand's own token (in its environment).
    named = await chat(s, s.tool("exec_command", argv=["cat", str(link)]))
    done, _ = await outcome(s, named)
    assert done["error_category"] == "forbidden_path", done
    env = await chat(s, s.tool("exec_command", command="env; cat /proc/$$/environ"))
    await allow(s, await requested(s, env))
    done, content = await outcome(s, env)
    assert done["status"] == "succeeded", done
    assert "PATH=" in content
    assert "HALFPI_HAND_TOKEN" not in content and "hph_" not in content
    assert secret not in json.dumps(s.face.seen)
    assert s.hand.alive(), s.hand.log()


async def test_a_credential_that_may_not_approve_cannot_read_the_token_that_may(
    tmp_path: Path,
) -> None:
    """The original escalation, against the embedded set-up (the local Hand in
    the Mind's process, the Mind's home on the same disk) — even with the
    local Hand told to read anything without asking, the home in its root."""
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, extra_args=("--hand-root", str(tmp_path),
                                         "--hand-approval", "read_file=never")).start()
    try:
        secret = mind.token
        plain = await face_add(home, "intruder")  # an operator without face:approve
        face = await connect_new_credential(mind.url, plain.token)
        assert "face:approve" not in face.welcome["payload"]["scopes"]  # type: ignore[index]
        local = await listed_hand(face, "local")
        assert local["roots"] == [str(tmp_path.resolve())]
        assert local["rules"]["read_file"] == "never"
        cid = await face.create_conversation("escalation")
        await face.subscribe(cid)
        targets = [home / "face.token", home / "hand.token", home / "halfpi.db",
                   "/proc/self/environ", f"{tmp_path}/../{tmp_path.name}/home/face.token"]
        for target in targets:
            result = await face.chat_to_end(
                cid, "/tool read_file " + json.dumps({"path": str(target)}))
            assert result["type"] == "face.result", result
            request_id = result["payload"]["request_id"]
            (completed,) = events_of(face.seen, "chat.tool_completed", request_id=request_id)
            assert completed["payload"]["data"]["error_category"] == "forbidden_path", target
            assert secret not in json.dumps(face.seen)
            assert not events_of(face.seen, "approval.requested", request_id=request_id)
        await face.close()
    finally:
        mind.kill()
