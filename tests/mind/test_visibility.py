"""Tool visibility (DESIGN §6) and I9: detail mode frozen at admission.

A summary viewer never receives tool arguments, output bodies or progress —
live, through an exact replay, or in a snapshot. A summary admission stores
nothing to show, so no later viewer can upgrade it. Secrets in arguments are
masked at any depth and never reach a Face, the database or the logs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.agents.base import ChatInput, Delta
from halfpi.core.projection import canonical_digest
from tests.support.cli import face_add
from tests.support.client import FaceClient, connect_new_credential
from tests.support.frames import Frame, event, events_of
from tests.support.mind import LocalMind, hand_ready, local_mind

SECRET_COMMAND = {"command": "for i in 1 2 3; do echo line$i; done", "password": "hunter2"}
SECRET_TOOL = "/tool exec_command " + json.dumps(SECRET_COMMAND)
LINES = "line1\nline2\nline3\n"


# -- helpers ---------------------------------------------------------------------------


def detail_leaks(frames: list[Frame]) -> list[str]:
    """Everything in ``frames`` a summary viewer must never receive."""
    leaks: list[str] = []
    for frame in frames:
        kind, payload = frame["type"], frame["payload"]
        if kind in ("face.chat.tool.progress", "face.run.progress"):
            leaks.append(f"{kind} seq {payload.get('seq')}")
        elif kind == "face.event":
            data = payload["data"]
            if payload["type"] in ("chat.tool_called", "approval.requested") and "args" in data:
                leaks.append(f"args in {payload['type']}")
            if payload["type"] == "chat.tool_completed" and "result" in data:
                leaks.append("result in chat.tool_completed")
        elif kind in ("face.snapshot", "face.reset"):
            snap = payload if kind == "face.snapshot" else payload["snapshot"]
            leaks += snapshot_leaks(snap)
    return leaks


def snapshot_leaks(snap: dict[str, Any]) -> list[str]:
    leaks = [f"args in pending approval {a['approval_id']}"
             for a in snap["pending_approvals"] if "args" in a]
    for record in snap["tool_history"]:
        leaks += [f"{key} in tool_history {record['tool_call_id']}"
                  for key in ("args", "result") if key in record]
    return leaks


async def observer(lmind: LocalMind, label: str) -> FaceClient:
    added = await face_add(lmind.config.home, label, "--profile", "observer")
    face = await connect_new_credential(lmind.url, added.token)
    assert face.welcome is not None and face.welcome["payload"]["profile"] == "observer"
    return face


async def snapshot(face: FaceClient, cid: str, **extra: Any) -> dict[str, Any]:
    request_id = await face.command("face.conversation.snapshot", conversation_id=cid, **extra)
    reply = await face.reply(request_id)
    assert reply["type"] == "face.snapshot", reply
    return dict(reply["payload"])


def head_of(accepted: Frame, cid: str) -> str:
    assert accepted["type"] == "face.accepted", accepted
    return str(accepted["payload"]["heads"][cid])


def read_rows(db: Path, sql: str, *params: Any) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(sql, params).fetchall()]


# -- who may ask for what ------------------------------------------------------------------


async def test_I9_observer_cannot_request_transparent(lmind: LocalMind) -> None:
    watcher = await observer(lmind, "watcher")
    owner = await FaceClient.connect(lmind.url, lmind.token)
    cid = await owner.create_conversation()
    refused = await watcher.subscribe(cid, detail_mode="transparent")
    assert refused["type"] == "face.error"
    assert refused["payload"]["code"] == "forbidden"
    assert refused["payload"].get("field") == "detail_mode"
    request_id = await watcher.command(
        "face.conversation.snapshot", conversation_id=cid, detail_mode="transparent"
    )
    refused = await watcher.reply(request_id)
    assert refused["type"] == "face.error" and refused["payload"]["code"] == "forbidden"
    # Its default is summary, and asking for summary is fine.
    accepted = await watcher.subscribe(cid)
    assert accepted["type"] == "face.accepted"
    assert (await snapshot(watcher, cid))["detail_mode"] == "summary"
    await owner.close()
    await watcher.close()


# -- a transparent admission seen by a summary viewer ------------------------------------


async def test_I9_summary_viewer_never_sees_args_results_or_progress(
    lmind: LocalMind,
) -> None:
    await hand_ready(lmind)
    owner = await FaceClient.connect(lmind.url, lmind.token)
    watcher = await observer(lmind, "watcher")
    cid = await owner.create_conversation()
    await owner.subscribe(cid)
    # Even asking for progress by name does not get it to a summary connection.
    wanted = ["face.chat.delta", "face.chat.tool.progress", "face.run.progress"]
    before_chat = head_of(await watcher.subscribe(cid, transient_types=wanted), cid)

    chat_id = await owner.command("face.chat", conversation_id=cid, content=SECRET_TOOL)
    requested = await owner.expect(event("approval.requested", request_id=chat_id))
    approval_id = requested["payload"]["data"]["approval_id"]
    masked = {"command": SECRET_COMMAND["command"], "password": "***"}
    assert requested["payload"]["data"]["args"] == masked
    called = events_of(owner.seen, "chat.tool_called", request_id=chat_id)
    assert called[0]["payload"]["data"]["args"] == masked
    digest = canonical_digest(SECRET_COMMAND)
    assert called[0]["payload"]["data"]["args_digest"] == digest

    # While the approval is pending, the observer's snapshot shows it, bare.
    await watcher.expect(event("approval.requested", approval_id=approval_id))
    pending = await snapshot(watcher, cid)
    assert pending["detail_mode"] == "summary"
    assert [a["approval_id"] for a in pending["pending_approvals"]] == [approval_id]
    assert pending["pending_approvals"][0]["args_digest"] == digest
    assert [r["tool"] for r in pending["tool_history"]] == ["exec_command"]
    assert snapshot_leaks(pending) == []
    owner_pending = await snapshot(owner, cid)
    assert owner_pending["pending_approvals"][0]["args"] == masked
    assert owner_pending["tool_history"][0]["args"] == masked

    resolve_id = await owner.command(
        "face.approval.resolve", approval_id=approval_id, decision="allow_once"
    )
    assert (await owner.reply(resolve_id))["payload"]["data"]["outcome"] == "applied"
    result = await owner.reply(chat_id, timeout=20)
    assert result["payload"]["status"] == "succeeded"
    await watcher.expect(event("chat.completed", request_id=chat_id))

    # The operator saw everything its admission allows: progress and the result.
    progress = [f for f in owner.seen if f["type"] == "face.chat.tool.progress"]
    assert "".join(p["payload"]["data"] for p in progress) == LINES
    completed = events_of(owner.seen, "chat.tool_completed", request_id=chat_id)
    assert completed[0]["payload"]["data"]["result"]["stdout"] == LINES
    assert "hunter2" not in json.dumps(
        [f for f in owner.seen if f["type"] == "face.event"
         and f["payload"]["type"] != "chat.message"]
    )

    # Live: the observer got the events, none of the detail.
    assert detail_leaks(watcher.seen) == []
    seen_types = {f["payload"]["type"] for f in watcher.seen if f["type"] == "face.event"}
    assert {"chat.tool_called", "approval.requested", "approval.resolved",
            "chat.tool_completed", "run.changed"} <= seen_types
    shown = events_of(watcher.seen, "chat.tool_completed", request_id=chat_id)[0]
    assert shown["payload"]["data"]["output_bytes"] == len(LINES)
    assert shown["payload"]["data"]["digest"] == completed[0]["payload"]["data"]["digest"]

    # Replay: an observer resuming from before the chat gets the same, bare.
    resumed = await observer(lmind, "resumer")
    accepted = await resumed.subscribe(cid, since=before_chat, transient_types=wanted)
    assert accepted["payload"]["replay"] == "exact"
    await resumed.expect(event("chat.completed", request_id=chat_id))
    replayed = [f for f in resumed.seen if f["type"] == "face.event"]
    assert [f["payload"]["seq"] for f in replayed] == [
        f["payload"]["seq"] for f in watcher.seen if f["type"] == "face.event"
    ]
    assert detail_leaks(resumed.seen) == []

    # Snapshot: the stored record, projected for the asking connection.
    done = await snapshot(watcher, cid)
    assert snapshot_leaks(done) == []
    (record,) = done["tool_history"]
    assert record["status"] == "succeeded" and record["args_digest"] == digest
    assert record["output_bytes"] == len(LINES)
    subscribed = await resumed.command(
        "face.subscribe", conversation_ids=[cid], snapshot=True
    )
    snap_frame = await resumed.reply(subscribed, ("face.snapshot",))
    assert snapshot_leaks(snap_frame["payload"]) == []
    assert snap_frame["payload"]["tool_history"][0]["tool_call_id"] == record["tool_call_id"]
    owner_done = await snapshot(owner, cid)
    assert owner_done["tool_history"][0]["args"] == masked
    assert owner_done["tool_history"][0]["result"]["stdout"] == LINES

    for face in (owner, watcher, resumed):
        await face.close()


# -- a summary admission: nothing stored, nothing to upgrade -----------------------------


async def test_I9_summary_admission_stores_nothing_and_is_never_upgraded(
    lmind: LocalMind,
) -> None:
    await hand_ready(lmind)
    chatter = await FaceClient.connect(lmind.url, lmind.token)
    live = await FaceClient.connect(lmind.url, lmind.token)  # transparent, watching live
    cid = await chatter.create_conversation()
    before_chat = head_of(await chatter.subscribe(cid, detail_mode="summary"), cid)
    await live.subscribe(cid, detail_mode="transparent")

    content = '/tool exec_command {"command": "echo summary-body", "password": "hunter2"}'
    chat_id = await chatter.command("face.chat", conversation_id=cid, content=content)
    requested = await chatter.expect(event("approval.requested", request_id=chat_id))
    approval_id = requested["payload"]["data"]["approval_id"]
    # Switching the connection to transparent now changes nothing for this
    # chat: its mode was frozen when it was admitted.
    switched = await chatter.subscribe(cid, detail_mode="transparent")
    assert switched["type"] == "face.accepted"
    resolve_id = await chatter.command(
        "face.approval.resolve", approval_id=approval_id, decision="allow_once"
    )
    await chatter.reply(resolve_id)
    result = await chatter.reply(chat_id, timeout=20)
    assert result["payload"]["status"] == "succeeded"
    # Nor does the reply's text (what an observer reads) carry the output.
    assert result["payload"]["content"] == (
        "exec_command succeeded (exit 0; output not shown: summary detail)")
    await live.expect(event("chat.completed", request_id=chat_id))
    completed = events_of(live.seen, "chat.tool_completed", request_id=chat_id)
    assert completed[0]["payload"]["data"]["status"] == "succeeded"
    assert completed[0]["payload"]["data"]["output_bytes"] == len("summary-body\n")

    # Nobody got detail: not the admitting connection, not a transparent one.
    assert detail_leaks(chatter.seen) == []
    assert detail_leaks(live.seen) == []

    # Nothing to show was stored.
    db = lmind.config.db_path
    calls = read_rows(db, "SELECT * FROM tool_calls WHERE conversation_id = ?", cid)
    assert len(calls) == 1
    assert calls[0]["detail_mode"] == "summary"
    assert calls[0]["args"] is None and calls[0]["result"] is None
    assert calls[0]["args_digest"].startswith("sha256:")
    approvals = read_rows(db, "SELECT * FROM approvals WHERE conversation_id = ?", cid)
    assert [a["args"] for a in approvals] == [None]
    stored_events = read_rows(
        db, "SELECT type, data FROM events WHERE conversation_id = ? ORDER BY seq", cid
    )
    for row in stored_events:
        data = json.loads(row["data"])
        if row["type"] in ("chat.tool_called", "approval.requested"):
            assert "args" not in data, row
        if row["type"] == "chat.tool_completed":
            assert "result" not in data, row

    # A transparent operator arriving later: replay and snapshot, still bare.
    later = await FaceClient.connect(lmind.url, lmind.token)
    accepted = await later.subscribe(cid, since=before_chat, detail_mode="transparent")
    assert accepted["payload"]["replay"] == "exact"
    await later.expect(event("chat.completed", request_id=chat_id))
    assert detail_leaks(later.seen) == []
    snap = await snapshot(later, cid, detail_mode="transparent")
    assert snap["detail_mode"] == "transparent"
    (record,) = snap["tool_history"]
    assert record["detail_mode"] == "summary"
    assert "args" not in record and "result" not in record
    assert record["status"] == "succeeded"

    for face in (chatter, live, later):
        await face.close()


async def test_I9_snapshot_read_does_not_change_the_admission_mode(
    lmind: LocalMind, tmp_path: Path
) -> None:
    await hand_ready(lmind)
    target = tmp_path / "plain.txt"
    target.write_text("body\n")
    chatter = await FaceClient.connect(lmind.url, lmind.token)
    cid = await chatter.create_conversation()
    await chatter.subscribe(cid, detail_mode="summary")  # DESIGN §6: set by face.subscribe
    await snapshot(chatter, cid, detail_mode="transparent")  # a read, for a fuller view
    content = "/tool read_file " + json.dumps({"path": str(target)})
    result = await chatter.chat_to_end(cid, content)
    assert result["payload"]["status"] == "succeeded"
    called = events_of(chatter.seen, "chat.tool_called")[0]["payload"]["data"]
    assert called["detail_mode"] == "summary"
    calls = read_rows(
        lmind.config.db_path, "SELECT * FROM tool_calls WHERE conversation_id = ?", cid
    )
    assert [(c["detail_mode"], c["args"], c["result"]) for c in calls] == [
        ("summary", None, None)
    ]
    await chatter.close()


# -- secrets the agent supplies ---------------------------------------------------------

SECRETS = ("TOPSECRET-123", "TOPSECRET-456")


class SecretAgent:
    """Calls ``read_file`` with secrets in nested arguments the user never typed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.args: dict[str, Any] = {
            "path": str(path),
            "config": {"token": SECRETS[0], "depth": 1},
            "items": [{"password": SECRETS[1], "name": "first"}],
        }

    async def reply(self, chat: ChatInput) -> AsyncIterator[Delta]:
        result = await chat.call_tool("read_file", self.args)
        yield Delta(f"read_file {result['status']}: {result['stdout']}")


def mind_with_agent(home: Path, agent: Any) -> contextlib.AbstractAsyncContextManager[LocalMind]:
    """A Mind in this loop with ``agent`` as its brain, its Face server and local Hand."""
    return local_mind(home, agent)


def db_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(home.glob("halfpi.db*")))


async def test_agent_secrets_masked_everywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="halfpi")
    target = tmp_path / "notes.txt"
    target.write_text("plain file body\n")
    agent = SecretAgent(target)
    home = tmp_path / "home"
    async with mind_with_agent(home, agent) as lmind:
        await hand_ready(lmind)
        owner = await FaceClient.connect(lmind.url, lmind.token)
        watcher = await observer(lmind, "watcher")
        cid = await owner.create_conversation()
        before_chat = head_of(await owner.subscribe(cid), cid)
        await watcher.subscribe(cid)

        result = await owner.chat_to_end(cid, "please read my notes")
        assert result["payload"]["status"] == "succeeded"
        assert result["payload"]["content"] == "read_file succeeded: plain file body\n"
        await watcher.expect(event("chat.completed"))

        # The operator sees the projection: secrets masked at any depth.
        called = events_of(owner.seen, "chat.tool_called")[0]["payload"]["data"]
        assert called["args"] == {
            "path": str(target),
            "config": {"token": "***", "depth": 1},
            "items": [{"password": "***", "name": "first"}],
        }
        assert called["args_digest"] == canonical_digest(agent.args)
        shown = events_of(watcher.seen, "chat.tool_called")[0]["payload"]["data"]
        assert shown["args_digest"] == called["args_digest"] and "args" not in shown

        # Replay and snapshots, both modes.
        resumed = await FaceClient.connect(lmind.url, lmind.token)
        await resumed.subscribe(cid, since=before_chat)
        await resumed.expect(event("chat.completed"))
        snaps = [await snapshot(owner, cid), await snapshot(watcher, cid)]
        assert snaps[0]["tool_history"][0]["args"] == called["args"]
        assert snaps[0]["tool_history"][0]["args_digest"] == called["args_digest"]

        faces = (owner, watcher, resumed)
        received = json.dumps([f for face in faces for f in face.seen])
        for secret in SECRETS:
            assert secret not in received, f"{secret} reached a Face"
            assert secret.encode() not in db_bytes(home), f"{secret} is in the database"
        for face in faces:
            await face.close()

    stored = db_bytes(home)  # after the checkpoint on close, too
    assert stored and b"read_file" in stored
    for secret in SECRETS:
        assert secret.encode() not in stored, f"{secret} is in the database"
    records = [r for r in caplog.records if r.name.startswith("halfpi")]
    assert records, "the halfpi loggers were not captured"
    logged = "\n".join(
        f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in records
    )
    for secret in SECRETS:
        assert secret not in logged, f"{secret} was logged"
