"""No secret leaves through a tool (DESIGN §8, issue 23 item 3), with a real
``halfpi mind`` and a real ``halfpi hand``: the three leaks that once
worked — a Hand token saved under a name of the user's choosing, the
provider key in a ``halfpi backup`` folder, a command that prints the
Mind's secrets — are refused or answered with redacted output, and
``/metrics`` counts the redactions."""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_tool_policy import (
    Scene,
    allow,
    chat,
    listed_hand,
    outcome,
    requested,
)
from tests.support.cli import face_add, halfpi_cli, hand_add
from tests.support.client import FaceClient, connect_new_credential
from tests.support.hand import HandProcess
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e

HAND = "laptop"


async def test_three_leaks_are_refused_or_redacted_by_a_real_mind_and_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    provider_key = "sk-proj-" + secrets.token_urlsafe(40)
    metrics_token = secrets.token_urlsafe(24)
    (home / "openai.key").write_text(provider_key + "\n")
    os.chmod(home / "openai.key", 0o600)
    (tmp_path / "metrics.token").write_text(metrics_token + "\n")
    monkeypatch.setenv("OPENAI_API_KEY", provider_key)  # in the Mind's environment too
    hand_token = (await hand_add(home, HAND)).token
    root = tmp_path / "project"
    root.mkdir()
    # What docs/hands.md tells a user to do, into the Hand's own root.
    (root / "laptop.token").write_text(hand_token + "\n")
    # A config file a user keeps in the project, holding the provider key.
    (root / "settings.env").write_text(f"OPENAI_API_KEY={provider_key}\nMODEL=x\n")
    mind = MindProcess(home, extra_args=(
        "--no-local-hand", "--metrics-token-file", str(tmp_path / "metrics.token"))).start()
    taken = await halfpi_cli("backup", str(root / "mind-backup"), "--home", str(home))
    assert taken.returncode == 0, taken.stderr
    hand = HandProcess(mind.url.removesuffix("/v1/face") + "/v1/hand", hand_token, HAND,
                       tmp_path / "hand.log", ("--root", str(root)))
    face = await FaceClient.connect(mind.url, mind.token)
    plain = await face_add(home, "intruder")  # an operator without face:approve
    intruder = await connect_new_credential(mind.url, plain.token)
    try:
        await listed_hand(face)
        cid = await face.create_conversation("leaks")
        await face.subscribe(cid, detail_mode="transparent")
        s = Scene(tmp_path, mind, hand, root, face, cid)

        # 1 and 2: read_file inside the roots (no approval needed), by a
        # credential that may not approve: refused, no human asked.
        other = await intruder.create_conversation("intruder")
        await intruder.subscribe(other, detail_mode="transparent")
        for path in (root / "laptop.token", root / "mind-backup" / "openai.key",
                     root / "mind-backup" / "hand.token"):
            done = await intruder.chat_to_end(
                other, "/tool read_file " + json.dumps({"path": str(path), "hand": HAND}))
            assert done["payload"]["status"] == "succeeded", done
            assert f"{path} is protected" in done["payload"]["content"], done
        assert not [f for f in intruder.seen if f["payload"].get("type") == "approval.requested"]
        # A path the Hand cannot resolve: refused at once, with its reason
        # (it once waited for the policy check's 30 s and failed).
        done = await intruder.chat_to_end(other, "/tool read_file " + json.dumps(
            {"path": "/proc/1/root/etc/passwd", "hand": HAND}), timeout=10)
        content = done["payload"]["content"]
        assert "cannot be resolved" in content or "permission denied" in content, done

        # 3: approved commands that print secrets: by a path built at run
        # time (the token file), a copy of the key, the Mind's environment.
        mind_pid = mind.proc.pid if mind.proc is not None else 0
        commands = [
            "cat $(echo lap)top.token",
            "cat settings.env",
            f"tr '\\0' '\\n' < /proc/{mind_pid}/envi$(echo ron) || true",
        ]
        shown: list[str] = []
        for command in commands:
            request_id = await chat(s, s.tool("exec_command", command=command, cwd=str(root)))
            await allow(s, await requested(s, request_id))  # exec_command always asks
            done, content = await outcome(s, request_id)
            assert done["status"] in ("succeeded", "failed"), done
            shown.append(json.dumps(done) + content)
        assert "[redacted: halfpi token]" in shown[0], shown[0]
        assert "OPENAI_API_KEY=[redacted: provider API key]" in shown[1], shown[1]

        everything = json.dumps(face.seen) + json.dumps(intruder.seen)
        for secret in (hand_token, provider_key, metrics_token):
            assert secret not in everything
            assert secret[:24] not in everything
        database = (home / "halfpi.db").read_bytes()
        assert provider_key.encode() not in database and hand_token.encode() not in database
        logs = mind.log() + hand.log()
        assert provider_key not in logs and hand_token not in logs
        assert "redacted" in logs

        async with httpx.AsyncClient(base_url=mind.url.removesuffix("/v1/face")) as client:
            scrape = (await client.get("/metrics", headers={
                "Authorization": f"Bearer {metrics_token}"})).text
        counted = {kind: float(value) for kind, value in re.findall(
            r'^halfpi_tool_output_redactions_total\{kind="([^"]+)"\} (\S+)$', scrape, re.M)}
        assert counted.get("halfpi token", 0) >= 1 and counted.get("provider API key", 0) >= 1
        assert hand.alive(), hand.log()
    finally:
        await intruder.close()
        await face.close()
        hand.kill()
        mind.kill()
