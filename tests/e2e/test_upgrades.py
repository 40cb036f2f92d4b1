"""A database of every released schema (``tests/store/schema_v*.py``) is
opened by a real ``halfpi mind``, upgraded on start with one clear line,
and serves: its old conversation takes a chat (docs/operations.md,
"Schema versions")."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

import pytest

from halfpi.store.sqlite_schema import SCHEMA_VERSION
from tests.support.client import FaceClient
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e

OLD_CONVERSATION = "c_from_an_older_halfpi"


def frozen_home(home: Path, version: int) -> None:
    """A home whose database a Mind of schema ``version`` left, with one
    conversation in it."""
    schema = getattr(importlib.import_module(f"tests.store.schema_v{version}"),
                     f"SCHEMA_V{version}")
    home.mkdir(mode=0o700)
    conn = sqlite3.connect(home / "halfpi.db")
    conn.executescript(schema)
    conn.execute(
        "INSERT INTO conversations (conversation_id, name, created_at, created_by, seq_reserved)"
        " VALUES (?, ?, 1.0, NULL, 0)", (OLD_CONVERSATION, f"made at schema {version}"))
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("version", range(SCHEMA_VERSION + 1))
async def test_a_real_mind_upgrades_a_database_of_every_released_schema_and_chats(
    tmp_path: Path, version: int
) -> None:
    home = tmp_path / "home"
    frozen_home(home, version)
    mind = MindProcess(home, extra_args=("--log-level", "info")).start()
    try:
        face = await FaceClient.connect(mind.url, mind.token)
        await face.subscribe(OLD_CONVERSATION)
        chat = await face.chat_to_end(OLD_CONVERSATION, "after the upgrade")
        assert chat["payload"]["status"] == "succeeded", chat
        assert chat["payload"]["content"] == "after the upgrade"
        await face.close()
    finally:
        assert mind.terminate() == 0
    upgraded = [line for line in mind.log().splitlines() if "upgraded the database" in line]
    if version < SCHEMA_VERSION:
        assert len(upgraded) == 1, mind.log()
        assert upgraded[0].endswith(
            f"upgraded the database {home / 'halfpi.db'} from schema {version} "
            f"to {SCHEMA_VERSION}")
    else:
        assert upgraded == []
    conn = sqlite3.connect(home / "halfpi.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
