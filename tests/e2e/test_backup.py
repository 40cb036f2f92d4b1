"""``halfpi backup`` while a real Mind serves, ``halfpi restore`` into an
empty home, and the restored Mind keeps its promises (docs/operations.md,
"Backup and restore"): cursors resume with an honest reset, every request
record is kept (a retried request is admitted once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import halfpi_cli
from tests.support.client import FaceClient
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e

WORDS = " ".join(f"w{i}" for i in range(60))


async def test_a_backup_taken_while_the_mind_streams_restores_into_a_mind_that_keeps_its_records(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    first = MindProcess(home).start()
    try:
        face = await FaceClient.connect(first.url, first.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        done = await face.chat_to_end(cid, "kept before the backup", request_id="kept-1")
        assert done["payload"]["status"] == "succeeded", done
        cursor = done["payload"]["data"]["cursor"]
        # A chat streams while the backup runs: the Mind keeps serving.
        streaming = await face.command("face.chat", "during-1", conversation_id=cid,
                                       content=f"/pace 20 {WORDS}")
        await face.expect(lambda f: f["type"] == "face.chat.delta")
        taken = await halfpi_cli("backup", str(tmp_path / "backup"), "--home", str(home))
        assert taken.returncode == 0, taken.stderr
        assert "backed up halfpi.db, face.token, hand.token" in taken.stderr
        during = await face.reply(streaming, ("face.result", "face.error"), 30)
        assert during["payload"]["status"] == "succeeded", during
        await face.close()
    finally:
        assert first.terminate() == 0
    backup = tmp_path / "backup"
    assert {p.name for p in backup.iterdir()} >= {"halfpi.db", "backup.json", "face.token"}
    assert all(p.stat().st_mode & 0o077 == 0 for p in backup.iterdir())
    assert backup.stat().st_mode & 0o077 == 0
    manifest = json.loads((backup / "backup.json").read_text())
    assert manifest["schema"] >= 5

    restored_home = tmp_path / "restored"
    restored = await halfpi_cli("restore", str(backup), "--home", str(restored_home))
    assert restored.returncode == 0, restored.stderr
    second = MindProcess(restored_home).start()
    try:
        assert second.token == first.token  # the operator's token came along
        face = await FaceClient.connect(second.url, second.token)
        # The old cursor: the journal did not come along. An honest reset.
        sub = await face.subscribe(cid, since=cursor)
        assert sub["payload"]["conversations"] == {cid: "reset"}, sub
        reset = await face.expect(lambda f: f["type"] == "face.reset")
        assert reset["payload"]["reason"] == "epoch_changed"
        messages = reset["payload"]["snapshot"]["messages"]
        assert [m["request_id"] for m in messages][:2] == ["kept-1", "kept-1"]
        # The request record came along: a retry is answered, not run again.
        again = await face.chat_to_end(cid, "kept before the backup", request_id="kept-1")
        assert again["payload"]["status"] == "succeeded", again
        assert again["payload"]["data"]["run_id"] == done["payload"]["data"]["run_id"]
        conflict = await face.chat_to_end(cid, "another message", request_id="kept-1")
        assert conflict["payload"]["code"] == "request_conflict"
        rid = await face.command("face.conversation.snapshot", conversation_id=cid)
        snap = (await face.reply(rid, ("face.snapshot",)))["payload"]
        assert [m["request_id"] for m in snap["messages"]].count("kept-1") == 2  # once
        await face.close()
    finally:
        assert second.terminate() == 0


async def test_restore_refuses_a_home_that_is_not_empty_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        taken = await halfpi_cli("backup", str(tmp_path / "b"), "--home", str(home))
        assert taken.returncode == 0, taken.stderr
        again = await halfpi_cli("backup", str(tmp_path / "b"), "--home", str(home))
        assert (again.returncode, again.stderr.count("\n")) == (1, 1), again
        assert again.stderr.startswith("halfpi: ")
    finally:
        mind.terminate()
    refused = await halfpi_cli("restore", str(tmp_path / "b"), "--home", str(home))
    assert refused.returncode == 1
    assert refused.stderr == (f"halfpi: the home {home} is not empty: "
                              "restore only into a new or empty home\n")
    not_a_backup = await halfpi_cli("restore", str(tmp_path), "--home", str(tmp_path / "new"))
    assert not_a_backup.returncode == 1 and "is not a halfpi backup" in not_a_backup.stderr
    assert not (tmp_path / "new").exists()


async def test_backup_of_a_postgresql_store_prints_pg_dump_guidance(tmp_path: Path) -> None:
    run = await halfpi_cli("backup", str(tmp_path / "b"), "--home", str(tmp_path / "home"),
                           "--store", "postgresql://user:secret@db.invalid/halfpi")
    assert run.returncode == 1
    assert "pg_dump" in run.stderr and "pg_restore" in run.stderr
    assert "secret" not in run.stderr
    assert not (tmp_path / "b").exists()
