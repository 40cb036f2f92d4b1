"""What only the PostgreSQL Store must do, beyond the conformance suite:
fencing checked by the database in the transaction that writes, a request
registry shared by every node, and its schema created, upgraded or refused.

Two Store objects on one database stand for two Mind nodes (each has its
own connections, as separate processes would).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from halfpi.core.requests import RequestRecord
from halfpi.errors import FencedOut, StoreError, TerminalExists
from halfpi.store import postgres_schema, postgres_sql
from halfpi.store.base import (
    ChatRunRow,
    Fence,
    StoredEvent,
    TaskRow,
    TaskUpdate,
    TxOutcome,
    WriteTx,
)
from halfpi.store.postgres import PostgresStore
from halfpi.store.postgres_schema import FENCED_OUT, SCHEMA_VERSION
from tests.store.postgres_schema_v1 import SCHEMA_V1
from tests.support.postgres import (  # noqa: F401  (pg_url: a fixture)
    fresh_database,
    hold_postgres_writer,
    pg_url,
)


def event(conv: str, seq: int) -> StoredEvent:
    return StoredEvent(conv, seq, "chat.message", b'{"n":%d}' % seq, 100.0)


def admission(request_id: str) -> RequestRecord:
    return RequestRecord(
        principal_id="p_1",
        request_id=request_id,
        type="face.chat",
        digest="d_1",
        status="accepted",
        created_at=100.0,
        conversation_id="c_1",
        run_id=f"run_{request_id}",
        accepted={"request_id": request_id},
    )


@pytest.fixture
async def nodes(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:  # noqa: F811
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def until_waiting_on(conn: Any, table: str, waiters: int) -> None:
    """Poll until ``waiters`` transactions wait for a lock on ``table``."""
    deadline = time.monotonic() + 30
    while (
        await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted", table
        )
        < waiters
    ):
        assert time.monotonic() < deadline, f"nobody waited on {table}"
        await asyncio.sleep(0.01)  # polling a condition with a deadline


# -- fencing (DESIGN §10) -------------------------------------------------------------


async def test_a_stale_owners_append_is_refused_by_the_database(
    nodes: tuple[PostgresStore, PostgresStore],
) -> None:
    old, new = nodes
    assert (await old.write(WriteTx(events=[event("c_1", 1)], fence=Fence("c_1", 1)))).committed
    # A take-over: the new owner claims the conversation with a newer token.
    assert (await new.write(WriteTx(fence=Fence("c_1", 2)))).committed
    with pytest.raises(FencedOut):
        await old.write(WriteTx(events=[event("c_1", 2)], fence=Fence("c_1", 1)))
    assert await new.head_seq("c_1") == 1  # nothing of the stale write landed
    assert (await new.write(WriteTx(events=[event("c_1", 2)], fence=Fence("c_1", 2)))).committed
    assert [e.seq for e in await old.events("c_1", 0, 10)] == [1, 2]


async def test_a_stale_owners_other_writes_are_refused_whole(
    nodes: tuple[PostgresStore, PostgresStore],
) -> None:
    old, new = nodes
    await new.write(WriteTx(fence=Fence("c_1", 5)))
    with pytest.raises(FencedOut):
        await old.write(
            WriteTx(
                admit=admission("r_stale"),
                chat_runs=[ChatRunRow("run_stale", "c_1", "r_stale", "p_1", "running", 100.0)],
                events=[event("c_1", 1)],
                fence=Fence("c_1", 4),
            )
        )
    assert await new.get_request("p_1", "r_stale") is None
    assert await new.chat_run_for_request("c_1", "r_stale") is None


async def test_a_fence_is_per_conversation(nodes: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = nodes
    await b.write(WriteTx(fence=Fence("c_b", 9)))
    assert (await a.write(WriteTx(events=[event("c_a", 1)], fence=Fence("c_a", 1)))).committed


async def test_only_the_stale_append_fails_in_a_group_commit(
    nodes: tuple[PostgresStore, PostgresStore],
) -> None:
    old, new = nodes
    await new.write(WriteTx(fence=Fence("c_taken", 2)))
    before = old.batches
    async with hold_postgres_writer(old):
        stale = old.write(WriteTx(events=[event("c_taken", 1)], fence=Fence("c_taken", 1)))
        mine = [
            old.write(WriteTx(events=[event("c_mine", seq)], fence=Fence("c_mine", 1)))
            for seq in range(1, 11)
        ]
    results = await asyncio.gather(stale, *mine, return_exceptions=True)
    assert isinstance(results[0], FencedOut)
    assert all(isinstance(r, TxOutcome) and r.committed for r in results[1:])
    assert old.batches - before == 2  # the held batch, then the rest together
    assert await old.head_seq("c_taken") == 0
    assert await old.head_seq("c_mine") == 10


async def test_a_take_over_waits_for_the_old_owners_transaction_then_fences_it_out(
    nodes: tuple[PostgresStore, PostgresStore],
    pg_url: str,  # noqa: F811
) -> None:
    """The old owner's append is in flight (its transaction holds the fence
    row) when the new owner claims: the claim waits, lands after it, and
    the old owner's next write is refused."""
    old, new = nodes
    await old.write(WriteTx(events=[event("c_1", 1)], fence=Fence("c_1", 1)))
    watcher = await asyncpg.connect(pg_url)
    try:
        async with hold_postgres_writer(old):
            in_flight = old.write(WriteTx(events=[event("c_1", 2)], fence=Fence("c_1", 1)))
        # …the held batch is committing; the append follows in the next.
        claim = new.write(WriteTx(fence=Fence("c_1", 2)))
        assert (await in_flight).committed and (await claim).committed
        with pytest.raises(FencedOut):
            await old.write(WriteTx(events=[event("c_1", 3)], fence=Fence("c_1", 1)))
        with pytest.raises(asyncpg.PostgresError) as refused:
            await watcher.execute("SELECT halfpi_fence('c_1', 1)")
        assert refused.value.sqlstate == FENCED_OUT  # the database itself says no
    finally:
        await watcher.close()
    assert await new.head_seq("c_1") == 2


async def until_blocked_on_a_lock(conn: Any) -> None:
    """Poll until some session of this database waits for a lock."""
    deadline = time.monotonic() + 30
    while not await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ):
        assert time.monotonic() < deadline, "nobody waited for a lock"
        await asyncio.sleep(0.01)  # polling a condition with a deadline


@pytest.mark.parametrize("taken", [True, False], ids=["take-over-commits", "take-over-rolls-back"])
async def test_an_append_racing_an_uncommitted_take_over_waits_for_its_outcome(
    nodes: tuple[PostgresStore, PostgresStore],
    pg_url: str,  # noqa: F811
    taken: bool,
) -> None:
    """The new owner has raised the fence but not committed yet when the old
    owner's append arrives: the append waits on the fence row, then is
    refused if the take-over committed, or lands if it rolled back — never
    written against the fence it read before the take-over ended."""
    old, _ = nodes
    await old.write(WriteTx(events=[event("c_1", 1)], fence=Fence("c_1", 1)))
    taker = await asyncpg.connect(pg_url)
    try:
        take_over = taker.transaction()
        await take_over.start()
        await taker.execute("SELECT halfpi_fence('c_1', 2)")
        append = old.write(WriteTx(events=[event("c_1", 2)], fence=Fence("c_1", 1)))
        await until_blocked_on_a_lock(taker)
        assert not append.done()
        await (take_over.commit() if taken else take_over.rollback())
        if taken:
            with pytest.raises(FencedOut):
                await append
        else:
            assert (await append).committed
    finally:
        await taker.close()
    assert await old.head_seq("c_1") == (1 if taken else 2)
    assert await old.fence_of("c_1") == (2 if taken else 1)


def test_fenced_out_is_a_store_error_no_retry_can_fix() -> None:
    assert issubclass(FencedOut, StoreError)
    assert FencedOut.retryable is False


# -- the request registry, shared by every node (I5) ------------------------------------


async def test_I5_the_same_request_admitted_on_two_nodes_at_once_is_admitted_once(
    nodes: tuple[PostgresStore, PostgresStore],
    pg_url: str,  # noqa: F811
) -> None:
    """Both nodes look the key up and find nothing, then both insert: the
    database keeps one, and the other node gets the existing record."""
    a, b = nodes
    locker = await asyncpg.connect(pg_url)
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE requests IN EXCLUSIVE MODE")  # lookups still pass
        on_a = a.write(WriteTx(admit=admission("r_twice")))
        on_b = b.write(WriteTx(admit=admission("r_twice")))
        await until_waiting_on(locker, "requests", 2)  # both looked up, both insert
        await tx.rollback()
    finally:
        await locker.close()
    outcomes = await asyncio.gather(on_a, on_b)
    assert sorted(o.committed for o in outcomes) == [False, True]
    [existing] = [o.existing for o in outcomes if not o.committed]
    assert isinstance(existing, RequestRecord) and existing.request_id == "r_twice"
    assert len(await a.open_requests()) == 1


async def test_I5_a_request_admitted_on_one_node_is_found_on_another(
    nodes: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = nodes
    assert (await a.write(WriteTx(admit=admission("r_1")))).committed
    again = await b.write(WriteTx(admit=admission("r_1")))
    assert not again.committed and isinstance(again.existing, RequestRecord)


# -- the background tasks' outbox, shared by every node (I10) ----------------------------


async def test_I10_a_task_ended_on_two_nodes_at_once_keeps_the_first_end(
    nodes: tuple[PostgresStore, PostgresStore],
    pg_url: str,  # noqa: F811
) -> None:
    """One node's end of a task is in flight (its transaction holds the row)
    when another node ends it otherwise: the second waits for the first,
    then the database refuses it, reading the row the first one left."""
    a, b = nodes
    task = TaskRow("k_1", "dl_1", "c_1", "h_1", "laptop", "exec_command", {"argv": ["ls"]},
                   None, "sha256:x", "summary", "p_1", "r_1", 2.0, 2.0)
    await a.write(WriteTx(tasks=[task]))
    await a.write(WriteTx(task_updates=[TaskUpdate("k_1", 3.0, state="running")]))
    first = await asyncpg.connect(pg_url)
    try:
        tr = first.transaction()
        await tr.start()
        await first.execute(
            "UPDATE tasks SET state = 'succeeded', exit_code = 0 WHERE task_id = 'k_1'"
        )
        second = b.write(WriteTx(
            task_updates=[TaskUpdate("k_1", 4.0, state="cancelled")],
            events=[StoredEvent("c_1", 1, "task.changed", b'{"task_id":"k_1"}', 4.0)],
        ))
        deadline = time.monotonic() + 30
        while not await first.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"):
            assert time.monotonic() < deadline, "the second end never waited for the first"
            await asyncio.sleep(0.01)  # polling a condition with a deadline
        await tr.commit()
    finally:
        await first.close()
    with pytest.raises(TerminalExists):
        await second
    got = await b.get_task("k_1")
    assert got is not None and (got.state, got.exit_code) == ("succeeded", 0)
    assert await b.head_seq("c_1") == 0


# -- the schema -------------------------------------------------------------------


async def test_an_empty_database_gets_the_current_schema(pg_url: str) -> None:  # noqa: F811
    store = PostgresStore(pg_url)
    await store.open()
    await store.close()
    conn = await asyncpg.connect(pg_url)
    try:
        version = await conn.fetchval("SELECT value FROM meta WHERE key = 'schema_version'")
        tables = {
            r[0]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        }
    finally:
        await conn.close()
    assert int(version) == SCHEMA_VERSION
    assert {"events", "requests", "credentials", "conversation_fences"} <= tables


async def test_nodes_starting_together_on_an_empty_database_all_open(
    pg_url: str,  # noqa: F811
) -> None:
    stores = [PostgresStore(pg_url) for _ in range(3)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        assert (await stores[0].write(WriteTx(events=[event("c_1", 1)]))).committed
        assert await stores[2].head_seq("c_1") == 1
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_newer_schema_is_refused_in_one_line_and_left_untouched(
    pg_url: str,  # noqa: F811
) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    await store.write(WriteTx(events=[event("c_1", 1)]))
    await store.close()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        newer = PostgresStore(pg_url)
        with pytest.raises(StoreError) as refused:
            await newer.open()
        message = str(refused.value)
        assert "\n" not in message
        assert "schema version 99 is newer" in message and "upgrade halfpi" in message
        assert await conn.fetchval("SELECT value FROM meta WHERE key = 'schema_version'") == "99"
        assert await conn.fetchval("SELECT count(*) FROM events") == 1
    finally:
        await conn.close()


# Every released schema, by version: a new version freezes the previous
# one's statements as tests/store/postgres_schema_vN.py and adds it here.
FROZEN = {1: SCHEMA_V1}


def test_every_earlier_schema_version_has_its_frozen_copy() -> None:
    assert sorted(FROZEN) == list(range(1, SCHEMA_VERSION))
    assert len(postgres_schema.UPGRADES) == SCHEMA_VERSION - 1


async def shape(url: str) -> dict[str, Any]:
    """What a database is made of (version, columns in order, constraints,
    indexes, triggers, our functions); not its rows."""
    conn = await asyncpg.connect(url)
    try:
        here = "table_schema = current_schema()"
        return {
            "version": await conn.fetchval(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ),
            "columns": [tuple(r) for r in await conn.fetch(
                "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
                f" column_default FROM information_schema.columns WHERE {here}"
                " ORDER BY table_name, ordinal_position"
            )],
            "constraints": sorted(tuple(r) for r in await conn.fetch(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
                " FROM pg_constraint WHERE connamespace = current_schema()::regnamespace"
            )),
            "indexes": sorted(tuple(r) for r in await conn.fetch(
                "SELECT tablename, indexname, indexdef FROM pg_indexes"
                " WHERE schemaname = current_schema()"
            )),
            "triggers": sorted(tuple(r) for r in await conn.fetch(
                "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid)"
                " FROM pg_trigger WHERE NOT tgisinternal"
            )),
            "functions": sorted(tuple(r) for r in await conn.fetch(
                "SELECT proname, prosrc FROM pg_proc"
                " WHERE pronamespace = current_schema()::regnamespace"
            )),
        }
    finally:
        await conn.close()


async def frozen_database(url: str, version: int) -> None:
    """A database as a node of schema ``version`` left it, with a few rows:
    a conversation, its log, a chat that ended."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            for statement in FROZEN[version]:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', $1)", str(version)
            )
            await conn.execute(
                "INSERT INTO conversations VALUES ('c_1', 'old', 1.0, 'p_1', 7, 'e1')"
            )
            await conn.execute(
                "INSERT INTO events VALUES ('c_1', 1, 'chat.completed', '{\"run_id\":\"run_1\"}',"
                " 1.0, 'chat:run_1')"
            )
            await conn.execute(
                "INSERT INTO runs VALUES ('run_1', 'c_1', 'r_1', 'p_1', 'succeeded', 1.0, 2.0,"
                " 'hi', NULL)"
            )
    finally:
        await conn.close()


async def test_a_version_1_database_upgrades_in_place_to_the_shape_of_a_new_one(
    pg_url: str,  # noqa: F811
) -> None:
    """Version 2 adds the background tasks' outbox: a version 1 database
    gets it empty, keeps every row and every rule it had, and its tasks
    then move by the outbox's table like a new database's."""
    new = PostgresStore(fresh_database())
    await new.open()  # creates the schema
    await new.close()
    new_url = new.url
    await frozen_database(pg_url, 1)
    store = PostgresStore(pg_url)
    await store.open()
    try:
        assert await shape(pg_url) == await shape(new_url)
        assert (await shape(pg_url))["version"] == str(SCHEMA_VERSION) == "2"
        row = await store.get_conversation("c_1")
        assert row is not None and (row.name, row.epoch) == ("old", "e1")
        assert await store.head_seq("c_1") == 7
        with pytest.raises(TerminalExists):
            await store.write(WriteTx(events=[StoredEvent(
                "c_1", 8, "chat.interrupted", b'{"run_id":"run_1"}', 8.0)]))
        assert await store.list_tasks(limit=10) == []
        task = TaskRow("k_1", "dl_1", "c_1", "h_1", "laptop", "exec_command", {"argv": ["ls"]},
                       None, "sha256:x", "summary", "p_1", "r_1", 2.0, 2.0)
        await store.write(WriteTx(tasks=[task]))
        assert await store.due_tasks(2.0, 10) == [task]
        await store.write(WriteTx(task_updates=[TaskUpdate("k_1", 3.0, state="lost")]))
        with pytest.raises(TerminalExists):
            await store.write(WriteTx(task_updates=[TaskUpdate("k_1", 4.0, state="succeeded")]))
    finally:
        await store.close()


async def test_a_failed_upgrade_leaves_the_database_as_it_was(
    pg_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    await frozen_database(pg_url, 1)
    before = await shape(pg_url)

    async def broken(conn: Any) -> None:
        await conn.execute("CREATE TABLE half_done (x INT)")
        raise asyncpg.DiskFullError("no space left on device")

    monkeypatch.setattr(postgres_schema, "UPGRADES", (broken,))
    store = PostgresStore(pg_url)
    with pytest.raises(StoreError, match="no space left") as caught:
        await store.open()
    assert "\n" not in str(caught.value)
    assert await shape(pg_url) == before
    monkeypatch.undo()
    again = PostgresStore(pg_url)
    await again.open()
    await again.close()
    assert (await shape(pg_url))["version"] == str(SCHEMA_VERSION)


async def test_a_lost_connection_fails_the_batch_and_the_next_write_reconnects(
    pg_url: str,  # noqa: F811
) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        with pytest.raises(StoreError):
            await store.write(WriteTx(events=[event("c_1", 1)]))
        assert (await store.write(WriteTx(events=[event("c_1", 1)]))).committed
        assert await store.head_seq("c_1") == 1
    finally:
        await store.close()


async def test_a_full_disk_inside_a_write_fails_the_group_commit_and_is_remembered(
    pg_url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """PostgreSQL says a full disk when a write needs a new page ("could not
    extend file", 53100), inside the write's savepoint, while a small
    in-place update (the readiness probe's row) still commits: that refusal
    of the database must fail the group commit and set
    ``last_commit_failed``, which ``/readyz`` reads, as a constraint a write
    breaks on its own does not."""
    store = PostgresStore(pg_url)
    await store.open()
    real = postgres_sql.apply_tx

    async def disk_full_for_events(conn: Any, tx: WriteTx) -> TxOutcome:
        if tx.admit is not None:  # an admission: it needs new pages
            raise asyncpg.exceptions.DiskFullError(
                'could not extend file "base/16384/16500": No space left on device')
        return await real(conn, tx)

    try:
        await store.write(WriteTx(meta=[("readyz_probe", "1.0")]))
        assert store.last_commit_failed is False
        monkeypatch.setattr(postgres_sql, "apply_tx", disk_full_for_events)
        with pytest.raises(StoreError, match="No space left on device"):
            await store.write(WriteTx(admit=admission("r_full"), events=[event("c_1", 1)]))
        assert store.last_commit_failed is True
        assert await store.head_seq("c_1") == 0  # nothing of it stands
        await store.write(WriteTx(meta=[("readyz_probe", "2.0")]))  # room again
        assert store.last_commit_failed is False
    finally:
        await store.close()
