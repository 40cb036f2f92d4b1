"""SQLite schema versions (``PRAGMA user_version``) and the upgrade of a
database written before versioning (docs/operations.md)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from halfpi.errors import StoreError, TerminalExists
from halfpi.store.base import RunRow, StoredEvent, WriteTx
from halfpi.store.sqlite import SQLiteStore
from halfpi.store.sqlite_sql import SCHEMA_VERSION, open_db, select_credentials
from tests.store.schema_v0 import SCHEMA_V0


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
        assert [r.run_id for r in await store.open_runs()] == ["run_2"]
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
                WriteTx(runs=[RunRow("run_1", "c_1", "r_1", "p_1", "failed", 1.0, 9.0)])
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


def test_the_cli_upgrades_an_unversioned_database_too(tmp_path: Path) -> None:
    path = tmp_path / "halfpi.db"
    unversioned_database(path, OLD_LOG)
    conn = open_db(path)
    try:
        assert [c.label for c in select_credentials(conn)] == ["local"]
    finally:
        conn.close()
    assert version(path) == SCHEMA_VERSION


async def test_a_database_of_a_newer_halfpi_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "halfpi.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    with pytest.raises(StoreError) as caught:
        await store.open()
    message = str(caught.value)
    assert "\n" not in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "newer" in message
    assert version(path) == SCHEMA_VERSION + 1
