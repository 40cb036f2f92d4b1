"""The SQLite Store's hot path (docs/performance.md, "Durable chats"): what
one turn of the loop writes commits together, and a command's registry
lookup is answered on the loop's own thread — no hop to a reader thread and
back — unless the database is busy."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.core.requests import RequestRecord
from halfpi.store import sqlite_sql
from halfpi.store.base import StoredEvent, WriteTx
from halfpi.store.sqlite import SQLiteStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "halfpi.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def event(seq: int) -> StoredEvent:
    return StoredEvent("c_1", seq, "chat.message", b"{}", 1.0)


async def test_the_writes_of_one_turn_of_the_loop_commit_together(store: SQLiteStore) -> None:
    before = store.batches
    # Fifty writers in one turn (as fifty chats admitted by one wake-up):
    # handed to the writer at the end of the turn, one commit for all.
    futures = [store.write(WriteTx(events=[event(seq)])) for seq in range(1, 51)]
    outcomes = [await f for f in futures]
    assert all(o.committed for o in outcomes)
    assert store.batches - before == 1


async def test_writes_of_later_turns_are_not_held_back(store: SQLiteStore) -> None:
    for seq in range(1, 4):  # one write per turn, each awaited: each commits
        assert (await store.write(WriteTx(events=[event(seq)]))).committed
    assert await store.head_seq("c_1") == 3


def record(request_id: str) -> RequestRecord:
    return RequestRecord("p_1", request_id, "face.chat", "d" * 64, "accepted", 1.0)


async def test_a_request_lookup_stays_on_the_loop_thread(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.write(WriteTx(admit=record("r_1")))
    threads: list[str] = []
    lookup = sqlite_sql.lookup_request

    def watched(conn: sqlite3.Connection, **key: Any) -> Any:
        threads.append(threading.current_thread().name)
        return lookup(conn, **key)

    monkeypatch.setattr(sqlite_sql, "lookup_request", watched)
    found = await store.get_request("p_1", "r_1")
    assert found is not None and found.request_id == "r_1"
    assert await store.get_request("p_1", "r_404") is None
    assert threads == [threading.current_thread().name] * 2


async def test_a_busy_database_sends_the_lookup_to_a_reader_thread(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.write(WriteTx(admit=record("r_1")))
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []
    lookup = sqlite_sql.lookup_request

    def busy_on_the_loop(conn: sqlite3.Connection, **key: Any) -> Any:
        threads.append(threading.current_thread())
        if threading.current_thread() is loop_thread:
            raise sqlite3.OperationalError("database is locked")
        return lookup(conn, **key)

    monkeypatch.setattr(sqlite_sql, "lookup_request", busy_on_the_loop)
    found = await store.get_request("p_1", "r_1")
    assert found is not None and found.request_id == "r_1"
    assert threads[0] is loop_thread and threads[1] is not loop_thread


async def test_the_credentials_version_is_read_on_the_loop_thread(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The maintenance round reads it four times a second (I8): an idle Mind
    # must not pay a thread hop for each.
    threads: list[str] = []
    read = sqlite_sql.credentials_version

    def watched(conn: sqlite3.Connection) -> int:
        threads.append(threading.current_thread().name)
        return read(conn)

    monkeypatch.setattr(sqlite_sql, "credentials_version", watched)
    assert await store.credentials_version() == 0
    assert threads == [threading.current_thread().name]
