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
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from halfpi.config import RequestRetention
from halfpi.core.requests import Finished, RequestRecord, Tombstone, prunable
from halfpi.errors import StoreError
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

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS credentials (
    principal_id TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    kind TEXT NOT NULL,
    profile TEXT NOT NULL,
    scopes TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS credentials_live_label
    ON credentials (kind, label) WHERE revoked_at IS NULL;
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    name TEXT,
    created_at REAL NOT NULL,
    created_by TEXT,
    seq_reserved INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    ts REAL NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    request_id TEXT,
    status TEXT,
    ts REAL NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    content TEXT,
    error_code TEXT
);
CREATE INDEX IF NOT EXISTS runs_open ON runs (status) WHERE finished_at IS NULL;
CREATE TABLE IF NOT EXISTS requests (
    principal_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    type TEXT NOT NULL,
    digest TEXT NOT NULL,
    status TEXT NOT NULL,
    conversation_id TEXT,
    run_id TEXT,
    accepted TEXT NOT NULL,
    result TEXT,
    created_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (principal_id, request_id)
);
CREATE INDEX IF NOT EXISTS requests_open ON requests (status) WHERE finished_at IS NULL;
CREATE INDEX IF NOT EXISTS requests_finished
    ON requests (principal_id, finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS tombstones (
    principal_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    result TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (principal_id, request_id)
);
CREATE TABLE IF NOT EXISTS tool_calls (
    tool_call_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    chat_run_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    detail_mode TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    args TEXT,
    scan_warnings TEXT NOT NULL,
    called_seq INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    hand_id TEXT,
    run_id TEXT,
    success INTEGER,
    output_bytes INTEGER,
    digest TEXT,
    truncated INTEGER,
    error_category TEXT,
    result TEXT,
    completed_seq INTEGER,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS tool_calls_by_conversation ON tool_calls (conversation_id, called_seq);
CREATE INDEX IF NOT EXISTS tool_calls_open ON tool_calls (status) WHERE finished_at IS NULL;
CREATE TABLE IF NOT EXISTS approvals (
    approval_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    reason TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    args TEXT,
    detail_mode TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    decision TEXT,
    decided_by TEXT,
    decision_reason TEXT,
    decided_at REAL
);
CREATE INDEX IF NOT EXISTS approvals_open ON approvals (status) WHERE decided_at IS NULL;
CREATE TABLE IF NOT EXISTS tool_runs (
    run_id TEXT PRIMARY KEY,
    tool_call_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    hand_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    exit_code INTEGER,
    output_bytes INTEGER,
    digest TEXT
);
CREATE INDEX IF NOT EXISTS tool_runs_open ON tool_runs (status) WHERE finished_at IS NULL;
INSERT OR IGNORE INTO meta (key, value) VALUES ('credentials_version', '0');
"""

_encode = msgspec.json.encode
_decode = msgspec.json.decode

MAX_BATCH = 4096


def connect(path: Path, *, synchronous: str = "FULL") -> sqlite3.Connection:
    """A connection in autocommit mode (we issue BEGIN/COMMIT ourselves)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def init_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)


# -- row mapping -------------------------------------------------------------


def _request_from_row(row: Sequence[Any]) -> RequestRecord:
    return RequestRecord(
        principal_id=row[0],
        request_id=row[1],
        type=row[2],
        digest=row[3],
        status=row[4],
        conversation_id=row[5],
        run_id=row[6],
        accepted=_decode(row[7]),
        result=_decode(row[8]) if row[8] is not None else None,
        created_at=row[9],
        finished_at=row[10],
    )


_REQUEST_COLUMNS = (
    "principal_id, request_id, type, digest, status, conversation_id, run_id,"
    " accepted, result, created_at, finished_at"
)


def _request_params(r: RequestRecord) -> tuple[Any, ...]:
    return (
        r.principal_id,
        r.request_id,
        r.type,
        r.digest,
        r.status,
        r.conversation_id,
        r.run_id,
        _encode(r.accepted).decode(),
        _encode(r.result).decode() if r.result is not None else None,
        r.created_at,
        r.finished_at,
    )


_TOOL_CALL_FIELDS = (
    "tool_call_id",
    "conversation_id",
    "chat_run_id",
    "request_id",
    "tool",
    "detail_mode",
    "args_digest",
    "args",
    "scan_warnings",
    "called_seq",
    "status",
    "created_at",
    "hand_id",
    "run_id",
    "success",
    "output_bytes",
    "digest",
    "truncated",
    "error_category",
    "result",
    "completed_seq",
    "finished_at",
)
_APPROVAL_FIELDS = (
    "approval_id",
    "conversation_id",
    "request_id",
    "tool_call_id",
    "tool",
    "reason",
    "args_digest",
    "args",
    "detail_mode",
    "status",
    "created_at",
    "expires_at",
    "decision",
    "decided_by",
    "decision_reason",
    "decided_at",
)
_TOOL_RUN_FIELDS = (
    "run_id",
    "tool_call_id",
    "conversation_id",
    "hand_id",
    "tool",
    "status",
    "created_at",
    "finished_at",
    "exit_code",
    "output_bytes",
    "digest",
)
_JSON_FIELDS = frozenset({"args", "result", "scan_warnings"})


def _upsert_sql(table: str, fields: tuple[str, ...]) -> str:
    """Portable upsert: insert, or overwrite every column of the existing row."""
    columns = ", ".join(fields)
    marks = ", ".join("?" for _ in fields)
    updates = ", ".join(f"{f} = excluded.{f}" for f in fields[1:])
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({marks})"
        f" ON CONFLICT ({fields[0]}) DO UPDATE SET {updates}"
    )


def _params(row: Any, fields: tuple[str, ...]) -> tuple[Any, ...]:
    values = []
    for name in fields:
        value = getattr(row, name)
        if name in _JSON_FIELDS:
            value = None if value is None else _encode(value).decode()
        values.append(value)
    return tuple(values)


def _from_row(cls: Any, fields: tuple[str, ...], row: Sequence[Any]) -> Any:
    values = {}
    for name, value in zip(fields, row, strict=True):
        if name in _JSON_FIELDS and value is not None:
            value = _decode(value)
            if name == "scan_warnings":
                value = tuple(value)
        elif name in ("success", "truncated") and value is not None:
            value = bool(value)
        values[name] = value
    return cls(**values)


def _credential_from_row(row: Sequence[Any]) -> Credential:
    return Credential(
        principal_id=row[0],
        label=row[1],
        kind=row[2],
        profile=row[3],
        scopes=frozenset(_decode(row[4])),
        token_hash=row[5],
        created_at=row[6],
        revoked_at=row[7],
    )


_RUN_COLUMNS = (
    "run_id, conversation_id, request_id, principal_id, status, started_at,"
    " finished_at, content, error_code"
)

_CREDENTIAL_COLUMNS = (
    "principal_id, label, kind, profile, scopes, token_hash, created_at, revoked_at"
)


# -- synchronous operations (writer/reader threads and the CLI) --------------


def lookup_request(
    conn: sqlite3.Connection, principal_id: str, request_id: str
) -> RequestRecord | Tombstone | None:
    row = conn.execute(
        f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE principal_id = ? AND request_id = ?",
        (principal_id, request_id),
    ).fetchone()
    if row is not None:
        return _request_from_row(row)
    row = conn.execute(
        "SELECT digest, result, expires_at FROM tombstones"
        " WHERE principal_id = ? AND request_id = ?",
        (principal_id, request_id),
    ).fetchone()
    if row is not None:
        return Tombstone(principal_id, request_id, row[0], _decode(row[1]), row[2])
    return None


def apply_tx(conn: sqlite3.Connection, tx: WriteTx) -> TxOutcome:
    """Apply one transaction's writes inside an open SQLite transaction."""
    if tx.admit is not None:
        existing = lookup_request(conn, tx.admit.principal_id, tx.admit.request_id)
        if existing is not None:
            return TxOutcome(existing)
        conn.execute(
            f"INSERT INTO requests ({_REQUEST_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            _request_params(tx.admit),
        )
    if tx.conversations:
        conn.executemany(
            "INSERT INTO conversations (conversation_id, name, created_at, created_by)"
            " VALUES (?,?,?,?)",
            [(c.conversation_id, c.name, c.created_at, c.created_by) for c in tx.conversations],
        )
    if tx.seq_reservations:
        conn.executemany(
            "UPDATE conversations SET seq_reserved = MAX(seq_reserved, ?)"
            " WHERE conversation_id = ?",
            [(upto, conversation_id) for conversation_id, upto in tx.seq_reservations],
        )
    if tx.runs:
        conn.executemany(
            f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (run_id) DO UPDATE SET status = excluded.status,"
            " finished_at = excluded.finished_at, content = excluded.content,"
            " error_code = excluded.error_code",
            [
                (
                    r.run_id,
                    r.conversation_id,
                    r.request_id,
                    r.principal_id,
                    r.status,
                    r.started_at,
                    r.finished_at,
                    r.content,
                    r.error_code,
                )
                for r in tx.runs
            ],
        )
    if tx.finished:
        conn.executemany(
            "UPDATE requests SET status = ?, result = ?, finished_at = ?"
            " WHERE principal_id = ? AND request_id = ? AND finished_at IS NULL",
            [
                (f.status, _encode(f.result).decode(), f.finished_at, f.principal_id, f.request_id)
                for f in tx.finished
            ],
        )
    if tx.messages:
        conn.executemany(
            "INSERT INTO messages (conversation_id, seq, role, content, request_id, status, ts)"
            " VALUES (?,?,?,?,?,?,?)",
            [
                (m.conversation_id, m.seq, m.role, m.content, m.request_id, m.status, m.ts)
                for m in tx.messages
            ],
        )
    for table, fields, rows in (
        ("tool_calls", _TOOL_CALL_FIELDS, tx.tool_calls),
        ("approvals", _APPROVAL_FIELDS, tx.approvals),
        ("tool_runs", _TOOL_RUN_FIELDS, tx.tool_runs),
    ):
        if rows:
            conn.executemany(_upsert_sql(table, fields), [_params(r, fields) for r in rows])
    if tx.events:
        insert_events(conn, tx.events)
    return COMMITTED


def insert_events(conn: sqlite3.Connection, events: Sequence[StoredEvent]) -> None:
    conn.executemany(
        "INSERT INTO events (conversation_id, seq, type, data, ts) VALUES (?,?,?,?,?)",
        [(e.conversation_id, e.seq, e.type, e.data.decode(), e.ts) for e in events],
    )


def bump_credentials_version(conn: sqlite3.Connection) -> None:
    conn.execute(
        "UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)"
        " WHERE key = 'credentials_version'"
    )


def insert_credential(conn: sqlite3.Connection, c: Credential) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            f"INSERT INTO credentials ({_CREDENTIAL_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
            (
                c.principal_id,
                c.label,
                c.kind,
                c.profile,
                _encode(sorted(c.scopes)).decode(),
                c.token_hash,
                c.created_at,
                c.revoked_at,
            ),
        )
        bump_credentials_version(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def select_credentials(conn: sqlite3.Connection) -> list[Credential]:
    rows = conn.execute(
        f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials ORDER BY created_at"
    ).fetchall()
    return [_credential_from_row(r) for r in rows]


def revoke_credential(conn: sqlite3.Connection, kind: str, label: str, now: float) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute(
            "UPDATE credentials SET revoked_at = ? WHERE kind = ? AND label = ?"
            " AND revoked_at IS NULL",
            (now, kind, label),
        )
        if cur.rowcount:
            bump_credentials_version(conn)
        conn.execute("COMMIT")
        return cur.rowcount
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def read_credentials_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = 'credentials_version'").fetchone()
    return int(row[0]) if row else 0


def prepare_private(path: Path) -> None:
    """The database holds every message and stored tool output: its folder is
    0700 and its files (database, WAL, shared memory) 0600, whatever the
    umask. SQLite gives the WAL and -shm files the database file's mode."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(PermissionError):
        os.chmod(path.parent, 0o700)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.chmod(name, 0o600)


def open_db(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the database for synchronous use by the CLI."""
    prepare_private(path)
    conn = connect(path)
    init_schema(conn)
    return conn


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
                    "SELECT conversation_id, seq, role, content, request_id, status, ts"
                    " FROM messages WHERE conversation_id = ? ORDER BY seq DESC LIMIT ?",
                    (conversation_id, limit + 1),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT conversation_id, seq, role, content, request_id, status, ts"
                    " FROM messages WHERE conversation_id = ? AND seq < ?"
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
