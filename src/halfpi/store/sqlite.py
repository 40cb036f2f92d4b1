"""SQLite Store (the embedded default): WAL mode plus group commit.

One writer thread owns the write connection. Callers hand it
:class:`WriteTx` objects; it takes everything queued, applies it in one
transaction (each tx that can fail in its own SAVEPOINT, plain event appends
merged into one ``executemany``), commits once, and resolves every caller's
future in a single hop back to the event loop. Throughput stays near the raw
batched-insert limit while I3 holds: nothing is shown before its commit.

Reads run on a small pool of reader threads, each with its own connection;
WAL lets them proceed while the writer commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from halfpi.config import RequestRetention
from halfpi.core.requests import Finished, RequestRecord, Tombstone, prunable
from halfpi.errors import StoreError, TerminalExists
from halfpi.store.base import (
    COMMITTED,
    ApprovalRow,
    ConversationRow,
    Credential,
    MessagePage,
    MessageRow,
    RunRow,
    StoredEvent,
    ToolCallRow,
    ToolRunRow,
    TxOutcome,
    WriteTx,
)
from halfpi.store.sqlite_sql import (
    _APPROVAL_FIELDS,
    _REQUEST_COLUMNS,
    _RUN_COLUMNS,
    _TOOL_CALL_FIELDS,
    _TOOL_RUN_FIELDS,
    MAX_BATCH,
    SCHEMA,
    _from_row,
    _request_from_row,
    apply_tx,
    connect,
    init_schema,
    insert_credential,
    insert_events,
    is_terminal_refusal,
    lookup_request,
    open_db,
    prepare_private,
    read_credentials_version,
    revoke_credential,
    select_credentials,
)

__all__ = [
    "SCHEMA",
    "SQLiteStore",
    "connect",
    "init_schema",
    "insert_credential",
    "open_db",
    "read_credentials_version",
    "revoke_credential",
    "select_credentials",
]

T = TypeVar("T")


# -- the async Store ---------------------------------------------------------

_STOP = object()


class SQLiteStore:
    """The default :class:`~halfpi.store.base.Store`."""

    def __init__(self, path: Path, *, synchronous: str = "FULL", readers: int = 2) -> None:
        self.path = path
        self.synchronous = synchronous
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="halfpi-sqlite-read")
        self._local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.batches = 0  # commits made, for tests and metrics
        self.closed = False

    # lifecycle

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        prepare_private(self.path)
        conn = connect(self.path, synchronous=self.synchronous)
        init_schema(conn)
        self._writer = threading.Thread(
            target=self._writer_main, args=(conn,), name="halfpi-sqlite-writer", daemon=True
        )
        self._writer.start()

    async def close(self) -> None:
        """Commit everything queued, then stop the writer and readers."""
        if self.closed:
            return
        self.closed = True
        self._queue.put(_STOP)
        if self._writer is not None:
            await asyncio.to_thread(self._writer.join)
        self._readers.shutdown(wait=True)
        with self._lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()

    # writes

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        """Queue ``tx`` for the next group commit; the future resolves once durable."""
        assert self._loop is not None, "store not open"
        if self.closed:
            raise StoreError("store is closed")
        future: asyncio.Future[TxOutcome] = self._loop.create_future()
        self._queue.put((tx, future))
        return future

    def _writer_main(self, conn: sqlite3.Connection) -> None:
        # Group commit: each round takes everything queued and commits it at
        # once. No lingering for more: measured, waiting for writers just
        # woken by the previous commit costs more than the fsync it saves.
        q = self._queue
        stopping = False
        while not stopping:
            item = q.get()
            if item is _STOP:
                break
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                batch.append(nxt)
            self._commit_batch(conn, batch)
        conn.close()

    def _commit_batch(self, conn: sqlite3.Connection, batch: list[Any]) -> None:
        try:
            outcomes = self._apply_batch(conn, batch, careful=False)
        except _RetryCarefully:
            # A merged append failed: redo the batch with every write in its
            # own savepoint, so only the offending writes fail.
            outcomes = self._apply_batch(conn, batch, careful=True)
        assert self._loop is not None
        # If the loop is already closed nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_resolve_all, outcomes)

    def _apply_batch(
        self, conn: sqlite3.Connection, batch: list[Any], *, careful: bool
    ) -> list[tuple[asyncio.Future[TxOutcome], TxOutcome | BaseException]]:
        """One transaction for the whole batch. Plain event appends (the
        common case) are merged into one ``executemany`` with no savepoint;
        writes that can fail on their own (admissions) get a savepoint."""
        outcomes: list[tuple[asyncio.Future[TxOutcome], TxOutcome | BaseException]] = []
        merged: list[StoredEvent] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for tx, future in batch:
                if not careful and tx.only_events:
                    merged.extend(tx.events)
                    outcomes.append((future, COMMITTED))
                    continue
                _insert_merged(conn, merged)
                outcomes.append((future, _in_savepoint(conn, partial(apply_tx, conn, tx))))
            _insert_merged(conn, merged)
            conn.execute("COMMIT")
            self.batches += 1
        except _RetryCarefully:
            conn.execute("ROLLBACK")
            raise
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            failure = StoreError(f"commit failed: {exc}")
            outcomes = [(future, failure) for _, future in batch]
        return outcomes

    # reads

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path, synchronous=self.synchronous)
            self._local.conn = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            try:
                return fn(self._reader())
            except sqlite3.Error as exc:
                raise StoreError(f"read failed: {exc}") from exc

        assert self._loop is not None
        return await self._loop.run_in_executor(self._readers, run)

    async def get_request(
        self, principal_id: str, request_id: str
    ) -> RequestRecord | Tombstone | None:
        return await self._read(lambda c: lookup_request(c, principal_id, request_id))

    async def prune_requests(self, now: float, retention: RequestRetention) -> int:
        """Move terminal records past retention to tombstones; expire old tombstones."""

        def run(conn: sqlite3.Connection) -> int:
            pruned = 0
            principals = [
                r[0]
                for r in conn.execute(
                    "SELECT principal_id FROM requests WHERE finished_at IS NOT NULL"
                    " GROUP BY principal_id HAVING COUNT(*) > ?",
                    (retention.max_per_principal,),
                )
            ]
            conn.execute("BEGIN IMMEDIATE")
            try:
                for principal in principals:
                    finished = [
                        Finished(r[0], r[1])
                        for r in conn.execute(
                            "SELECT request_id, finished_at FROM requests"
                            " WHERE principal_id = ? AND finished_at IS NOT NULL",
                            (principal,),
                        )
                    ]
                    for request_id in prunable(finished, now, retention):
                        conn.execute(
                            "INSERT OR REPLACE INTO tombstones"
                            " (principal_id, request_id, digest, result, expires_at)"
                            " SELECT principal_id, request_id, digest, result, ?"
                            " FROM requests WHERE principal_id = ? AND request_id = ?",
                            (now + retention.tombstone_seconds, principal, request_id),
                        )
                        conn.execute(
                            "DELETE FROM requests WHERE principal_id = ? AND request_id = ?",
                            (principal, request_id),
                        )
                        pruned += 1
                conn.execute("DELETE FROM tombstones WHERE expires_at < ?", (now,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return pruned

        # Pruning writes, but rarely: it runs on a reader thread with its own
        # BEGIN IMMEDIATE so it never holds up the group-commit writer's queue.
        return await self._read(run)

    async def get_conversation(self, conversation_id: str) -> ConversationRow | None:
        def run(conn: sqlite3.Connection) -> ConversationRow | None:
            row = conn.execute(
                "SELECT conversation_id, name, created_at, created_by FROM conversations"
                " WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
            return ConversationRow(*row) if row else None

        return await self._read(run)

    async def list_conversations(self, limit: int, before: str | None) -> list[ConversationRow]:
        def run(conn: sqlite3.Connection) -> list[ConversationRow]:
            if before is None:
                rows = conn.execute(
                    "SELECT conversation_id, name, created_at, created_by FROM conversations"
                    " ORDER BY conversation_id DESC LIMIT ?",
                    (limit,),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT conversation_id, name, created_at, created_by FROM conversations"
                    " WHERE conversation_id < ? ORDER BY conversation_id DESC LIMIT ?",
                    (before, limit),
                ).fetchall()
            return [ConversationRow(*r) for r in rows]

        return await self._read(run)

    async def head_seq(self, conversation_id: str) -> int:
        def run(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT MAX(COALESCE((SELECT MAX(seq) FROM events WHERE conversation_id = ?), 0),"
                " COALESCE((SELECT seq_reserved FROM conversations WHERE conversation_id = ?), 0))",
                (conversation_id, conversation_id),
            ).fetchone()
            return int(row[0] or 0)

        return await self._read(run)

    async def messages(
        self, conversation_id: str, *, limit: int, before_seq: int | None, max_seq: int | None
    ) -> MessagePage:
        bounds = [b for b in (before_seq, None if max_seq is None else max_seq + 1) if b]
        upper = min(bounds) if bounds else None

        def run(conn: sqlite3.Connection) -> MessagePage:
            if upper is None:
                rows = conn.execute(
                    "SELECT conversation_id, seq, role, content, request_id, status, ts,"
                    " error_code, reason FROM messages WHERE conversation_id = ?"
                    " ORDER BY seq DESC LIMIT ?",
                    (conversation_id, limit + 1),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT conversation_id, seq, role, content, request_id, status, ts,"
                    " error_code, reason FROM messages WHERE conversation_id = ? AND seq < ?"
                    " ORDER BY seq DESC LIMIT ?",
                    (conversation_id, upper, limit + 1),
                ).fetchall()
            more = len(rows) > limit
            page = [MessageRow(*r) for r in reversed(rows[:limit])]
            return MessagePage(page, more)

        return await self._read(run)

    async def run_for_request(
        self, conversation_id: str, request_id: str, principal_id: str | None = None
    ) -> RunRow | None:
        def run(conn: sqlite3.Connection) -> RunRow | None:
            row = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE conversation_id = ? AND request_id = ?"
                " AND (? IS NULL OR principal_id = ?) ORDER BY started_at DESC LIMIT 1",
                (conversation_id, request_id, principal_id, principal_id),
            ).fetchone()
            return RunRow(*row) if row else None

        return await self._read(run)

    async def tool_history(
        self, conversation_id: str, *, max_seq: int, limit: int
    ) -> list[ToolCallRow]:
        def run(conn: sqlite3.Connection) -> list[ToolCallRow]:
            rows = conn.execute(
                f"SELECT {', '.join(_TOOL_CALL_FIELDS)} FROM tool_calls"
                " WHERE conversation_id = ? AND called_seq <= ?"
                " ORDER BY called_seq DESC LIMIT ?",
                (conversation_id, max_seq, limit),
            ).fetchall()
            return [_from_row(ToolCallRow, _TOOL_CALL_FIELDS, r) for r in reversed(rows)]

        return await self._read(run)

    async def get_approval(self, approval_id: str) -> ApprovalRow | None:
        def run(conn: sqlite3.Connection) -> ApprovalRow | None:
            row = conn.execute(
                f"SELECT {', '.join(_APPROVAL_FIELDS)} FROM approvals WHERE approval_id = ?",
                (approval_id,),
            ).fetchone()
            return _from_row(ApprovalRow, _APPROVAL_FIELDS, row) if row else None

        return await self._read(run)

    async def get_tool_run(self, run_id: str) -> ToolRunRow | None:
        def run(conn: sqlite3.Connection) -> ToolRunRow | None:
            row = conn.execute(
                f"SELECT {', '.join(_TOOL_RUN_FIELDS)} FROM tool_runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            return _from_row(ToolRunRow, _TOOL_RUN_FIELDS, row) if row else None

        return await self._read(run)

    async def _open(self, cls: Any, table: str, fields: tuple[str, ...], done: str) -> list[Any]:
        def run(conn: sqlite3.Connection) -> list[Any]:
            rows = conn.execute(
                f"SELECT {', '.join(fields)} FROM {table} WHERE {done} IS NULL"
            ).fetchall()
            return [_from_row(cls, fields, r) for r in rows]

        return await self._read(run)

    async def open_approvals(self) -> list[ApprovalRow]:
        return await self._open(ApprovalRow, "approvals", _APPROVAL_FIELDS, "decided_at")

    async def open_tool_calls(self) -> list[ToolCallRow]:
        return await self._open(ToolCallRow, "tool_calls", _TOOL_CALL_FIELDS, "finished_at")

    async def open_tool_runs(self) -> list[ToolRunRow]:
        return await self._open(ToolRunRow, "tool_runs", _TOOL_RUN_FIELDS, "finished_at")

    async def open_runs(self) -> list[RunRow]:
        def run(conn: sqlite3.Connection) -> list[RunRow]:
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE finished_at IS NULL ORDER BY started_at"
            ).fetchall()
            return [RunRow(*r) for r in rows]

        return await self._read(run)

    async def open_requests(self) -> list[RequestRecord]:
        def run(conn: sqlite3.Connection) -> list[RequestRecord]:
            rows = conn.execute(
                f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE finished_at IS NULL"
            ).fetchall()
            return [_request_from_row(r) for r in rows]

        return await self._read(run)

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> list[StoredEvent]:
        def run(conn: sqlite3.Connection) -> list[StoredEvent]:
            rows = conn.execute(
                "SELECT conversation_id, seq, type, data, ts FROM events"
                " WHERE conversation_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (conversation_id, after_seq, limit),
            ).fetchall()
            return [StoredEvent(r[0], r[1], r[2], r[3].encode(), r[4]) for r in rows]

        return await self._read(run)

    async def credentials(self) -> list[Credential]:
        return await self._read(select_credentials)

    async def credentials_version(self) -> int:
        return await self._read(read_credentials_version)

    async def add_credential(self, credential: Credential) -> None:
        await self._read(lambda c: insert_credential(c, credential))


class _RetryCarefully(Exception):
    """A merged append failed; the batch must be redone write by write."""


def _insert_merged(conn: sqlite3.Connection, merged: list[StoredEvent]) -> None:
    if merged:
        try:
            insert_events(conn, merged)
        except sqlite3.Error as exc:
            raise _RetryCarefully from exc
        merged.clear()


def _in_savepoint(
    conn: sqlite3.Connection, work: Callable[[], object]
) -> TxOutcome | BaseException:
    """Run ``work`` so that its failure undoes only itself, not the batch."""
    conn.execute("SAVEPOINT tx")
    try:
        result = work()
        conn.execute("RELEASE tx")
    except sqlite3.Error as exc:
        conn.execute("ROLLBACK TO tx")
        conn.execute("RELEASE tx")
        if is_terminal_refusal(exc):
            return TerminalExists("a second outcome for a run was refused; the first stands")
        return StoreError(f"write failed: {exc}")
    return result if isinstance(result, TxOutcome) else COMMITTED


def _resolve_all(
    outcomes: list[tuple[asyncio.Future[TxOutcome], TxOutcome | BaseException]],
) -> None:
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
