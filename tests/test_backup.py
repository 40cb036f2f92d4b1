"""``halfpi backup`` says which of its files hold secrets, so that a Hand's
tool policy knows them wherever the folder is copied (DESIGN §8, issue 23
item 3)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from halfpi.backup import backup
from halfpi.core.policy import FORBIDDEN_PATH, Rule, Verdict
from halfpi.hand.policy import HandPolicy


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    sqlite3.connect(home / "halfpi.db").close()
    for name, text in (("face.token", "hpf_x"), ("hand.token", "hph_x"),
                       ("stream.key", "ab" * 32), ("agent.toml", 'agent = "openai"\n'),
                       ("openai.key", "sk-test-key-0123456789")):
        (home / name).write_text(text + "\n")
    return home


def test_the_manifest_lists_the_files_that_hold_secrets(tmp_path: Path) -> None:
    home = _home(tmp_path)
    taken = backup(home, home / "halfpi.db", tmp_path / "b")
    manifest = json.loads((taken.folder / "backup.json").read_text())
    assert sorted(manifest["secrets"]) == ["face.token", "halfpi.db", "hand.token",
                                          "openai.key", "stream.key"]
    assert "agent.toml" in manifest["files"] and "agent.toml" not in manifest["secrets"]


def test_a_copied_backup_keeps_its_secrets_from_every_tool(tmp_path: Path) -> None:
    home = _home(tmp_path)
    taken = backup(home, home / "halfpi.db", tmp_path / "b")
    work = tmp_path / "work"
    work.mkdir()
    copy = shutil.copytree(taken.folder, work / "old-mind")
    policy = HandPolicy([work], {"read_file": Rule.NEVER, "exec_command": Rule.NEVER})
    decision = policy.check("read_file", {"path": str(copy / "openai.key")})
    assert (decision.verdict, decision.category) == (Verdict.DENY, FORBIDDEN_PATH), decision
    assert policy.check("exec_command", {"command": f"tar c {copy}"}).verdict is Verdict.DENY
    assert policy.check("read_file", {"path": str(copy / "agent.toml")}).verdict is Verdict.ALLOW
