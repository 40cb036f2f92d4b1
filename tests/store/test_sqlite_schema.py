"""SQLite schema versions (``PRAGMA user_version``) and the upgrades of a
database written by an earlier release (docs/operations.md, "Schema versions").

Every released schema is frozen in ``tests/store/schema_vN.py``; a database
built from each one must upgrade to exactly the shape a new database gets.
Changing ``SCHEMA`` without a new version, an upgrade and a frozen copy
fails here."""

from __future__ import annotations

import importlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from halfpi import cli
from halfpi.errors import StoreError, TerminalExists
from halfpi.store import sqlite_schema
from halfpi.store.base import ChatRunRow, MessageRow, StoredEvent, TaskRow, TaskUpdate, WriteTx
from halfpi.store.sqlite import SQLiteStore
from halfpi.store.sqlite_schema import SCHEMA_VERSION
from tests.store.schema_v0 import SCHEMA_V0
from tests.store.schema_v1 import SCHEMA_V1
from tests.store.schema_v2 import SCHEMA_V2
from tests.store.schema_v3 import SCHEMA_V3
from tests.store.schema_v4 import SCHEMA_V4
from tests.store.schema_v5 import SCHEMA_V5

# Every released schema, by version. A new version adds its frozen copy here.
FROZEN = {
    0: SCHEMA_V0, 1: SCHEMA_V1, 2: SCHEMA_V2, 3: SCHEMA_V3, 4: SCHEMA_V4, 5: SCHEMA_V5,
}


def version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def event(conv: str, seq: int, type_: str, **data: object) -> tuple[object, ...]:
    return (conv, seq, type_, json.dumps(data), 100.0 + seq)


def unversioned_database(path: Path, events: list[tuple[object, ...]]) -> None:
    """A database exactly as a Mind before schema versioning left it."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_V0)
    conn.execute(
        "INSERT INTO credentials VALUES ('p_1', 'local', 'face', 'operator', '[]', 'h', 1.0, NULL)"
    )
    conn.execute("INSERT INTO conversations VALUES ('c_1', 'old', 1.0, 'p_1', 4096)")
    conn.executemany("INSERT INTO events VALUES (?,?,?,?,?)", events)
    conn.execute(
        "INSERT INTO runs VALUES ('run_1', 'c_1', 'r_1', 'p_1', 'succeeded', 1.0, 2.0, 'hi', NULL)"
    )
    conn.execute(
        "INSERT INTO runs VALUES ('run_2', 'c_1', 'r_2', 'p_1', 'running', 3.0, NULL, NULL, NULL)"
    )
    conn.commit()
    conn.close()
    assert version(path) == 0


OLD_LOG = [
    event("c_1", 1, "chat.message", request_id="r_1"),
    event("c_1", 2, "chat.started", request_id="r_1", run_id="run_1"),
    event("c_1", 3, "chat.completed", request_id="r_1", run_id="run_1", status="succeeded"),
    event("c_1", 4, "run.changed", run_id="tr_1", status="queued"),
    event("c_1", 5, "run.changed", run_id="tr_1", status="succeeded"),
    event("c_1", 6, "chat.started", request_id="r_2", run_id="run_2"),
]


async def test_a_new_database_gets_the_current_schema_version(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "halfpi.db")
    await store.open()
    await store.close()
    assert version(tmp_path / "halfpi.db") == SCHEMA_VERSION >= 1


async def test_a_database_of_the_unversioned_schema_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "halfpi.db"
    unversioned_database(path, OLD_LOG)
    store = SQLiteStore(path)
    await store.open()
    try:
        assert version(path) == SCHEMA_VERSION
        # Everything written before the upgrade reads back unchanged.
        assert [(e.seq, e.type) for e in await store.events("c_1", 0, 10)] == [
            (row[1], row[2]) for row in OLD_LOG
        ]
        assert await store.head_seq("c_1") == 4096
        assert [r.run_id for r in await store.open_chat_runs()] == ["run_2"]
        assert [c.principal_id for c in await store.credentials()] == ["p_1"]
        # Outcomes recorded before the upgrade stand: a second one is refused.
        for type_, data in (
            ("chat.interrupted", {"run_id": "run_1"}),
            ("run.changed", {"run_id": "tr_1", "status": "lost"}),
        ):
            with pytest.raises(TerminalExists):
                await store.write(
                    WriteTx(events=[StoredEvent("c_1", 7, type_, json.dumps(data).encode(), 7.0)])
                )
        with pytest.raises(TerminalExists):
            await store.write(
                WriteTx(chat_runs=[ChatRunRow("run_1", "c_1", "r_1", "p_1", "failed", 1.0, 9.0)])
            )
        # The open run may still end, once.
        end = StoredEvent("c_1", 7, "chat.interrupted", b'{"run_id":"run_2"}', 7.0)
        assert (await store.write(WriteTx(events=[end]))).committed
    finally:
        await store.close()


async def test_an_old_log_with_two_outcomes_for_one_run_still_upgrades(tmp_path: Path) -> None:
    """Two Minds on one home once wrote two outcomes for one chat. The
    upgrade keeps the log as it is (the first outcome stands), and refuses
    any further one."""
    path = tmp_path / "halfpi.db"
    log = [
        *OLD_LOG[:3],
        event("c_1", 4, "chat.interrupted", request_id="r_1", run_id="run_1"),
    ]
    unversioned_database(path, log)
    store = SQLiteStore(path)
    await store.open()
    try:
        assert [e.type for e in await store.events("c_1", 2, 10)] == [
            "chat.completed",
            "chat.interrupted",
        ]
        third = StoredEvent("c_1", 5, "chat.failed", b'{"run_id":"run_1"}', 5.0)
        with pytest.raises(TerminalExists):
            await store.write(WriteTx(events=[third]))
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    marked = conn.execute(
        "SELECT seq FROM events WHERE terminal_of = 'chat:run_1'"
    ).fetchall()
    conn.close()
    assert marked == [(3,)]


def test_the_cli_upgrades_an_unversioned_database_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unversioned_database(tmp_path / "halfpi.db", OLD_LOG)
    assert cli.main(["face", "list", "--home", str(tmp_path)]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [
        "LABEL",
        "local",
    ]
    assert version(tmp_path / "halfpi.db") == SCHEMA_VERSION


async def test_a_database_of_a_newer_halfpi_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "halfpi.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    before = shape(path)
    store = SQLiteStore(path)
    with pytest.raises(StoreError) as caught:
        await store.open()
    message = str(caught.value)
    assert "\n" not in message
    assert f"cannot open the database {path}" in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "newer" in message
    assert shape(path) == before


# -- every released schema upgrades to the current one -------------------------------------


def shape(path: Path) -> dict[str, Any]:
    """What a database is made of (version, tables with their columns in
    order, indexes, triggers), whitespace in their SQL aside; not its rows."""
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        )]
        return {
            "version": int(conn.execute("PRAGMA user_version").fetchone()[0]),
            "tables": {t: conn.execute(f"PRAGMA table_info({t})").fetchall() for t in tables},
            "others": sorted(
                (kind, name, table, " ".join(sql.split()))
                for kind, name, table, sql in conn.execute(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master"
                    " WHERE type IN ('index', 'trigger') AND sql IS NOT NULL"
                )
            ),
        }
    finally:
        conn.close()


def frozen_database(path: Path, schema_version: int, *, extra: str = "") -> None:
    """A database as a Mind of ``schema_version`` left it."""
    conn = sqlite3.connect(path)
    conn.executescript(FROZEN[schema_version] + extra)
    conn.execute(f"PRAGMA user_version = {schema_version}")
    conn.commit()
    conn.close()


async def new_database(path: Path) -> None:
    store = SQLiteStore(path)
    await store.open()
    await store.close()


def test_every_schema_version_has_its_frozen_copy() -> None:
    """Bumping SCHEMA_VERSION means freezing the new schema as
    tests/store/schema_vN.py (the next release's upgrade test builds on it)."""
    assert sorted(FROZEN) == list(range(SCHEMA_VERSION + 1))
    assert len(sqlite_schema.UPGRADES) == SCHEMA_VERSION
    for n in FROZEN:
        module = importlib.import_module(f"tests.store.schema_v{n}")
        assert getattr(module, f"SCHEMA_V{n}") == FROZEN[n]


async def test_the_frozen_current_schema_is_what_a_new_database_gets(tmp_path: Path) -> None:
    """Fails when SCHEMA changed without a new version: bump SCHEMA_VERSION,
    add an upgrade to UPGRADES and freeze the new schema (docs/operations.md)."""
    await new_database(tmp_path / "new.db")
    frozen_database(tmp_path / "frozen.db", SCHEMA_VERSION)
    assert shape(tmp_path / "new.db") == shape(tmp_path / "frozen.db")


# v0 databases come in two kinds: before replies kept their reasons, and
# after (the columns were added on open before versioning existed).
REPLY_REASONS = (
    "ALTER TABLE messages ADD COLUMN error_code TEXT;"
    " ALTER TABLE messages ADD COLUMN reason TEXT;"
)
RELEASED = [
    pytest.param(0, "", id="v0"),
    pytest.param(0, REPLY_REASONS, id="v0_with_reply_reasons"),
    *(pytest.param(n, "", id=f"v{n}") for n in range(1, SCHEMA_VERSION + 1)),
]


@pytest.mark.parametrize(("schema_version", "extra"), RELEASED)
async def test_a_database_of_every_released_schema_upgrades_to_the_current_shape(
    tmp_path: Path, schema_version: int, extra: str
) -> None:
    await new_database(tmp_path / "new.db")
    old = tmp_path / "old.db"
    frozen_database(old, schema_version, extra=extra)
    await new_database(old)
    assert shape(old) == shape(tmp_path / "new.db")
    assert shape(old)["version"] == SCHEMA_VERSION


async def test_a_version_1_database_keeps_its_rows_and_its_outcomes(tmp_path: Path) -> None:
    path = tmp_path / "halfpi.db"
    frozen_database(path, 1)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO messages VALUES ('c_1', 1, 'assistant', 'hi', 'r_1', 'failed', 1.0)")
    conn.execute(
        "INSERT INTO events VALUES ('c_1', 2, 'chat.failed', '{\"run_id\":\"run_1\"}', 2.0,"
        " 'chat:run_1')"
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    await store.open()
    try:
        page = await store.messages("c_1", limit=10, before_seq=None, max_seq=None)
        assert page.messages == [MessageRow("c_1", 1, "assistant", "hi", "r_1", "failed", 1.0)]
        second = StoredEvent("c_1", 3, "chat.interrupted", b'{"run_id":"run_1"}', 3.0)
        with pytest.raises(TerminalExists):
            await store.write(WriteTx(events=[second]))
        reason = MessageRow("c_1", 4, "assistant", "", "r_2", "failed", 4.0, "agent_failed", "x")
        await store.write(WriteTx(messages=[reason]))
        page = await store.messages("c_1", limit=10, before_seq=None, max_seq=None)
        assert page.messages[-1] == reason
    finally:
        await store.close()


async def test_a_version_2_database_keeps_its_conversations_which_have_no_epoch_yet(
    tmp_path: Path,
) -> None:
    """Version 3 stores each conversation's epoch: a conversation of an
    older database has none, so the first Mind to load it writes one."""
    path = tmp_path / "halfpi.db"
    frozen_database(path, 2)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO conversations VALUES ('c_1', 'old', 1.0, 'p_1', 4096)")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    await store.open()
    try:
        row = await store.get_conversation("c_1")
        assert row is not None
        assert (row.name, row.epoch) == ("old", None)
        assert await store.head_seq("c_1") == 4096
        await store.write(WriteTx(epochs=[("c_1", "e1")]))
        row = await store.get_conversation("c_1")
        assert row is not None and row.epoch == "e1"
    finally:
        await store.close()


async def test_a_version_4_database_keeps_its_rows_and_gains_the_task_outbox(
    tmp_path: Path,
) -> None:
    """Version 5 adds the background tasks' outbox: an older database gets
    the table empty, keeps what it had, and its tasks then move by the
    outbox's table like a new database's."""
    path = tmp_path / "halfpi.db"
    frozen_database(path, 4)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO conversations VALUES ('c_1', 'old', 1.0, 'p_1', 7, 'e1')")
    conn.execute(
        "INSERT INTO events VALUES ('c_1', 1, 'chat.message', '{\"n\":1}', 1.0, NULL)"
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    await store.open()
    try:
        assert version(path) == SCHEMA_VERSION == 5
        row = await store.get_conversation("c_1")
        assert row is not None and (row.name, row.epoch) == ("old", "e1")
        assert [e.seq for e in await store.events("c_1", 0, 10)] == [1]
        assert await store.list_tasks(limit=10) == []
        task = TaskRow("k_1", "dl_1", "c_1", "h_1", "laptop", "exec_command", {"argv": ["ls"]},
                       None, "sha256:x", "summary", "p_1", "r_1", 2.0, 2.0)
        await store.write(WriteTx(tasks=[task], events=[StoredEvent(
            "c_1", 2, "task.changed", b'{"task_id":"k_1"}', 2.0)]))
        assert await store.due_tasks(2.0, 10) == [task]
        await store.write(WriteTx(task_updates=[TaskUpdate("k_1", 3.0, state="lost")]))
        with pytest.raises(TerminalExists):
            await store.write(WriteTx(task_updates=[TaskUpdate("k_1", 4.0, state="succeeded")]))
    finally:
        await store.close()


async def test_an_upgrade_is_all_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade step that fails leaves the database as it was, the steps
    before it undone too, and the store unopened with one line."""
    path = tmp_path / "halfpi.db"
    unversioned_database(path, OLD_LOG)
    before = shape(path)

    def broken(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(sqlite_schema, "UPGRADES", (*sqlite_schema.UPGRADES[:-1], broken))
    store = SQLiteStore(path)
    with pytest.raises(StoreError, match="disk I/O error") as caught:
        await store.open()
    assert "\n" not in str(caught.value)
    assert shape(path) == before
    monkeypatch.undo()
    await new_database(path)
    assert shape(path)["version"] == SCHEMA_VERSION
