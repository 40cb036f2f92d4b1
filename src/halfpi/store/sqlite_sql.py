"""SQLite statements, schema and row mapping for the SQLite Store.

Synchronous functions: the Store's writer and reader threads call them, and
so does the CLI (credentials) directly. Nothing here knows about asyncio.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.errors import StoreError
from halfpi.store.base import (
    COMMITTED,
    TERMINAL_EVENT_TYPES,
    Credential,
    StoredEvent,
    TxOutcome,
    WriteTx,
    terminal_of,
)

log = logging.getLogger("halfpi.store")

# Schema versions (``PRAGMA user_version``):
#   0  before versioning (no constraint on outcomes)
#   1  one outcome per run: events.terminal_of under a UNIQUE index, and
#      triggers that keep an ended row's terminal status (I10, DESIGN §12)
SCHEMA_VERSION = 2

# The refusal raised by the triggers; the Store maps it (and the unique
# index's violation) to TerminalExists.
TERMINAL_REFUSAL = "halfpi: this run already has its outcome"

ONE_OUTCOME_PER_RUN = (
    "CREATE UNIQUE INDEX IF NOT EXISTS events_terminal_of"
    " ON events (terminal_of) WHERE terminal_of IS NOT NULL",
    *(
        f"CREATE TRIGGER IF NOT EXISTS {table}_first_outcome_stands"
        f" BEFORE UPDATE ON {table}"
        f" WHEN OLD.{ended} IS NOT NULL AND NEW.status IS NOT OLD.status"
        f" BEGIN SELECT RAISE(ABORT, '{TERMINAL_REFUSAL}'); END"
        for table, ended in (
            ("runs", "finished_at"),
            ("tool_runs", "finished_at"),
            ("tool_calls", "finished_at"),
            ("approvals", "decided_at"),
        )
    ),
)

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
    terminal_of TEXT,  -- the run this event ends (store.base.terminal_of), else NULL
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
    error_code TEXT,
    reason TEXT,
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
""" + "\n".join(f"{statement};" for statement in ONE_OUTCOME_PER_RUN)

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


# Columns added after a table first shipped: a database made by an older
# version gets them on open (SQLite's ADD COLUMN is instant and keeps rows).
ADDED_COLUMNS = (
    ("messages", "error_code", "TEXT"),
    ("messages", "reason", "TEXT"),
)


def init_schema(conn: sqlite3.Connection) -> None:
    """Create the schema, or upgrade an older one to :data:`SCHEMA_VERSION`
    (one transaction: all or nothing). A database written by a newer halfpi
    is refused untouched."""
    if _user_version(conn) == SCHEMA_VERSION:
        return  # the usual start: nothing to write
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = _user_version(conn)  # another process may have just upgraded it
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {found}, newer than this halfpi"
                f" understands ({SCHEMA_VERSION}): upgrade halfpi"
            )
        if found < SCHEMA_VERSION:
            if found == 0 and not _has_table(conn, "events"):
                for statement in _statements(SCHEMA):
                    conn.execute(statement)
            else:
                for upgrade in _UPGRADES[found:]:
                    upgrade(conn)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None


def _statements(script: str) -> list[str]:
    """Split a script into statements (``executescript`` would commit)."""
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    return statements


def _upgrade_0_to_1(conn: sqlite3.Connection) -> None:
    """Mark every event that ends a run; when an old log holds two outcomes
    for one run (two Minds once shared a home), the first written keeps the
    mark and stands, the later one stays in the log unmarked."""
    conn.execute("ALTER TABLE events ADD COLUMN terminal_of TEXT")
    seen: set[str] = set()
    marks: list[tuple[str, str, int]] = []
    duplicates = 0
    types = tuple(TERMINAL_EVENT_TYPES)
    rows = conn.execute(
        f"SELECT conversation_id, seq, type, data, ts FROM events"
        f" WHERE type IN ({', '.join('?' for _ in types)}) ORDER BY rowid",
        types,
    )
    for conversation_id, seq, type_, data, ts in rows:
        key = terminal_of(StoredEvent(conversation_id, seq, type_, data.encode(), ts))
        if key is None:
            continue
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        marks.append((key, conversation_id, seq))
    conn.executemany(
        "UPDATE events SET terminal_of = ? WHERE conversation_id = ? AND seq = ?", marks
    )
    if duplicates:
        log.warning(
            "the log holds %d second outcome(s) for runs that had one already;"
            " the first of each stands",
            duplicates,
        )
    for statement in ONE_OUTCOME_PER_RUN:
        conn.execute(statement)
    log.info("upgraded the database schema from version 0 to 1")


def _upgrade_1_to_2(conn: sqlite3.Connection) -> None:
    """A reply keeps its error code and its reason (every end is a message)."""
    for table, column, kind in ADDED_COLUMNS:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    log.info("upgraded the database schema from version 1 to 2")


# _UPGRADES[n] takes a database from version n to n + 1.
_UPGRADES: tuple[Callable[[sqlite3.Connection], None], ...] = (_upgrade_0_to_1, _upgrade_1_to_2)
assert len(_UPGRADES) == SCHEMA_VERSION


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
    if tx.conversation_names:
        conn.executemany(
            "UPDATE conversations SET name = ? WHERE conversation_id = ?",
            [(name, conversation_id) for conversation_id, name in tx.conversation_names],
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
            "INSERT INTO messages (conversation_id, seq, role, content, request_id, status, ts,"
            " error_code, reason) VALUES (?,?,?,?,?,?,?,?,?)",
            [
                (
                    m.conversation_id,
                    m.seq,
                    m.role,
                    m.content,
                    m.request_id,
                    m.status,
                    m.ts,
                    m.error_code,
                    m.reason,
                )
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
        "INSERT INTO events (conversation_id, seq, type, data, ts, terminal_of)"
        " VALUES (?,?,?,?,?,?)",
        [
            (
                e.conversation_id,
                e.seq,
                e.type,
                e.data.decode(),
                e.ts,
                terminal_of(e) if e.type in TERMINAL_EVENT_TYPES else None,
            )
            for e in events
        ],
    )


def is_terminal_refusal(exc: sqlite3.Error) -> bool:
    """True if ``exc`` is the database refusing a second outcome for a run."""
    text = str(exc)
    return isinstance(exc, sqlite3.IntegrityError) and (
        "events.terminal_of" in text or TERMINAL_REFUSAL in text
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
