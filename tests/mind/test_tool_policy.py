"""How the Mind applies the tool policy (DESIGN §8) around a tool call.

The Mind asks the Hand for its verdict (``hand.check``), refuses ``deny``,
asks a human on ``ask`` — or on ``allow`` where its own floor requires it —
and tells the Hand whether a human approved. A Mind in this loop, a raw Hand
on a real socket, Faces over WebSocket.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.support.cli import halfpi_cli
from tests.support.client import FaceClient
from tests.support.frames import event, events_of
from tests.support.hand import hello_payload, honest_result
from tests.support.mind import LocalMind, hand_ready, local_mind


def of_type(type_: str) -> Any:
    return lambda f: f["type"] == type_


async def raw_hand(lmind: LocalMind, rules: dict[str, str]) -> FaceClient:
    run = await halfpi_cli("hand", "add", "raw", "--home", str(lmind.config.home))
    assert run.returncode == 0, run.stderr
    await lmind.mind.refresh_credentials()
    hand = await FaceClient.connect(f"ws://127.0.0.1:{lmind.server.port}/v1/hand", hello=False)
    await hand.send("hand.hello", hello_payload(run.stdout.strip(), "raw", os.urandom(8).hex(),
                                                rules=rules))
    await hand.expect(of_type("hand.welcome"))
    return hand


async def operator(lmind: LocalMind) -> tuple[FaceClient, str]:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation("policy")
    await face.subscribe(cid, detail_mode="transparent")
    return face, cid


async def answer_check(hand: FaceClient, verdict: str, reason: str,
                       category: str | None = None) -> dict[str, Any]:
    check = (await hand.expect(of_type("hand.check")))["payload"]
    answer = {"check_id": check["check_id"], "verdict": verdict, "reason": reason}
    if category:
        answer["category"] = category
    await hand.send("hand.checked", answer)
    return dict(check)


async def test_the_minds_floor_asks_whatever_the_hand_claims(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        hand = await raw_hand(lmind, {"exec_command": "never", "read_file": "never"})
        face, cid = await operator(lmind)
        chat = await face.command("face.chat", conversation_id=cid, content="/tool exec_command "
                                  + json.dumps({"argv": ["true"], "hand": "raw"}))
        await answer_check(hand, "allow", "exec_command needs no approval on this Hand")
        requested = await face.expect(event("approval.requested", request_id=chat))
        assert "this Mind requires approval" in requested["payload"]["data"]["reason"]
        assert not [f for f in hand.seen if f["type"] == "hand.run"], "nothing runs unasked"
        resolve = await face.command("face.approval.resolve", decision="allow_once",
                                     approval_id=requested["payload"]["data"]["approval_id"])
        await face.reply(resolve)
        order = (await hand.expect(of_type("hand.run")))["payload"]
        assert order["approved"] is True
        await hand.send("hand.result", honest_result(order["run_id"], order["generation"]))
        reply = await face.reply(chat, ("face.result",))
        assert reply["payload"]["content"].startswith("exec_command succeeded")


async def test_a_hands_ask_is_asked_with_its_reason_and_a_deny_is_refused_unasked(
    tmp_path: Path,
) -> None:
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        hand = await raw_hand(lmind, {"read_file": "outside_roots"})
        face, cid = await operator(lmind)
        content = "/tool read_file " + json.dumps({"path": "/srv/x", "hand": "raw"})

        denied = await face.command("face.chat", conversation_id=cid, content=content)
        await answer_check(hand, "deny", "/srv/x is protected (inside /srv)", "forbidden_path")
        done = await face.expect(event("chat.tool_completed", request_id=denied))
        assert done["payload"]["data"]["error_category"] == "forbidden_path"
        reply = await face.reply(denied, ("face.result",))
        assert "/srv/x is protected" in reply["payload"]["content"]
        assert not events_of(face.seen, "approval.requested", request_id=denied)

        asked = await face.command("face.chat", conversation_id=cid, content=content)
        check = await answer_check(hand, "ask", "/srv/x is outside this Hand's roots")
        assert check["tool"] == "read_file" and check["args"] == {"path": "/srv/x"}
        requested = await face.expect(event("approval.requested", request_id=asked))
        assert "outside this Hand's roots" in requested["payload"]["data"]["reason"]
        resolve = await face.command("face.approval.resolve", decision="deny_once",
                                     approval_id=requested["payload"]["data"]["approval_id"])
        await face.reply(resolve)
        done = await face.expect(event("chat.tool_completed", request_id=asked))
        assert done["payload"]["data"]["error_category"] == "denied"
        assert not [f for f in hand.seen if f["type"] == "hand.run"]


async def test_a_hand_that_does_not_answer_the_check_fails_the_call(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        lmind.mind.hands.check_timeout_s = 0.2
        hand = await raw_hand(lmind, {"read_file": "never"})
        face, cid = await operator(lmind)
        reply = await face.chat_to_end(cid, "/tool read_file " + json.dumps(
            {"path": "/etc/hostname", "hand": "raw"}))
        assert "did not answer the policy check" in reply["payload"]["content"], reply
        (done,) = events_of(face.seen, "chat.tool_completed")
        assert done["payload"]["data"]["error_category"] == "hand_unavailable"
        await hand.close()


async def test_the_operator_of_the_mind_may_lower_its_local_hands_rules(tmp_path: Path) -> None:
    """``halfpi mind --hand-approval exec_command=never``: the Mind's operator's
    own choice for its own Hand stands over the Mind's floor."""
    async with local_mind(tmp_path / "home",
                          hand_approval=(("exec_command", "never"),)) as lmind:
        await hand_ready(lmind)
        face, cid = await operator(lmind)
        reply = await face.chat_to_end(cid, '/tool exec_command {"argv": ["echo", "ran"]}')
        assert reply["payload"]["content"].startswith("exec_command succeeded"), reply
        assert not events_of(face.seen, "approval.requested")
        listed = lmind.mind.hands.hands["local"].to_wire()
        assert listed["rules"]["exec_command"] == "never"
        assert listed["roots"] == [str(tmp_path.resolve())]


async def test_the_local_hand_never_reads_the_minds_home(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", hand_roots=(str(tmp_path / "home"),),
                          hand_approval=(("read_file", "never"),)) as lmind:
        await hand_ready(lmind)
        face, cid = await operator(lmind)
        reply = await face.chat_to_end(cid, "/tool read_file " + json.dumps(
            {"path": str(lmind.config.face_token_path)}))
        assert lmind.token not in json.dumps(face.seen)
        (done,) = events_of(face.seen, "chat.tool_completed")
        assert done["payload"]["data"]["error_category"] == "forbidden_path", reply
