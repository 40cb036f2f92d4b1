"""The SQLite Store's schema: its tables, its version and the upgrades from
every earlier version (docs/operations.md, "Schema versions").

A database records its version in ``PRAGMA user_version``. Opening one
creates the schema, or upgrades an older one in a single transaction (all
or nothing), or refuses one written by a newer halfpi untouched. Every
released schema is frozen in ``tests/store/schema_vN.py`` and a test
upgrades a database built from each to the current one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from halfpi.errors import StoreError
from halfpi.store import outbox
from halfpi.store.base import TERMINAL_EVENT_TYPES, StoredEvent, terminal_of

log = logging.getLogger("halfpi.store")

# Schema versions (``PRAGMA user_version``):
#   0  before versioning (no constraint on outcomes)
#   1  one outcome per run: events.terminal_of under a UNIQUE index, and
#      triggers that keep an ended row's terminal status (I10, DESIGN §12)
#   2  a reply keeps its error code and its reason (messages.error_code,
#      messages.reason)
#   3  a reply keeps the tokens its model used (messages.usage, JSON)
#   4  each conversation's journal epoch is the Store's (conversations.epoch,
#      NULL until a Mind first loads the conversation)
#   5  the background tasks' outbox (tasks), its states guarded by triggers
#      drawn from core.states.OUTBOX
# A new version: change SCHEMA, append its upgrade to UPGRADES, freeze the
# new schema as tests/store/schema_vN.py, and add a row to the table in
# docs/operations.md.
SCHEMA_VERSION = 5

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

# The background tasks' outbox (DESIGN §8; store/outbox.py): one row per
# task, created with its admission, its state moved only as the outbox's
# table allows, the first terminal state standing (I10).
TASKS = f"""
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    delivery_id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL,
    hand_id TEXT NOT NULL,
    hand_label TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT,
    timeout_s REAL,
    digest TEXT NOT NULL,
    detail_mode TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({outbox.STATES})),
    approved INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    delivered_at REAL,
    hand_task_id TEXT,
    answer TEXT,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    error TEXT,
    log_bytes INTEGER,
    log_truncated INTEGER
);
CREATE INDEX IF NOT EXISTS tasks_by_time ON tasks (created_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_conversation ON tasks (conversation_id, created_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_hand ON tasks (hand_id, created_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (next_attempt_at, created_at, task_id)
    WHERE delivered_at IS NULL AND state IN ({outbox.OPEN_STATES});
CREATE TRIGGER IF NOT EXISTS tasks_first_outcome_stands
    BEFORE UPDATE ON tasks
    WHEN OLD.state IN ({outbox.TERMINAL_STATES}) AND NEW.state IS NOT OLD.state
    BEGIN SELECT RAISE(ABORT, '{TERMINAL_REFUSAL}'); END;
CREATE TRIGGER IF NOT EXISTS tasks_move_by_their_table
    BEFORE UPDATE ON tasks
    WHEN OLD.state NOT IN ({outbox.TERMINAL_STATES}) AND NEW.state IS NOT OLD.state
    AND (OLD.state || '>' || NEW.state NOT IN ({outbox.ALLOWED_MOVES})
        OR (NEW.state = '{outbox.DEAD}' AND NEW.delivered_at IS NOT NULL))
    BEGIN SELECT RAISE(ABORT, '{outbox.MOVE_REFUSAL}'); END;
"""

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
    seq_reserved INTEGER NOT NULL DEFAULT 0,
    epoch TEXT  -- the journal epoch its cursors carry (DESIGN §3), NULL until first loaded
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
    usage TEXT,
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
""" + "\n".join(f"{statement};" for statement in ONE_OUTCOME_PER_RUN) + TASKS


def connect(path: Path, *, synchronous: str = "FULL") -> sqlite3.Connection:
    """A connection in autocommit mode (we issue BEGIN/COMMIT ourselves)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def prepare_private(path: Path, *, own_folder: bool = True) -> None:
    """The database holds every message and stored tool output: its files
    (database, WAL, shared memory) are 0600 and its folder 0700, whatever
    the umask. SQLite gives the WAL and -shm files the database file's mode.
    A folder that is not the database's own (``own_folder=False``: one named
    by a store URL, maybe ``/srv`` or ``/tmp``) keeps its mode if it exists."""
    existed = path.parent.is_dir()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if own_folder or not existed:
        with contextlib.suppress(PermissionError):
            os.chmod(path.parent, 0o700)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.chmod(name, 0o600)


def open_database(
    path: Path, *, synchronous: str = "FULL", own_folder: bool = True
) -> sqlite3.Connection:
    """A connection to the database at ``path``, created private if missing,
    its schema current. Any failure is one :class:`StoreError` line naming
    the file (``cannot open the database PATH: why``)."""
    conn: sqlite3.Connection | None = None
    try:
        prepare_private(path, own_folder=own_folder)
        conn = connect(path, synchronous=synchronous)
        upgraded_from = init_schema(conn)
    except (OSError, sqlite3.Error, StoreError) as exc:
        if conn is not None:
            conn.close()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise StoreError(f"cannot open the database {path}: {why}") from exc
    if upgraded_from is not None:
        log.info(
            "upgraded the database %s from schema %d to %d", path, upgraded_from, SCHEMA_VERSION
        )
    return conn


# Columns added after a table first shipped: a database made by an older
# version gets them on open (SQLite's ADD COLUMN is instant and keeps rows).
ADDED_COLUMNS = (
    ("messages", "error_code", "TEXT"),
    ("messages", "reason", "TEXT"),
    ("messages", "usage", "TEXT"),
)


def init_schema(conn: sqlite3.Connection) -> int | None:
    """Create the schema, or upgrade an older one to :data:`SCHEMA_VERSION`
    (one transaction: all or nothing). A database written by a newer halfpi
    is refused untouched. Returns the version upgraded from (None: nothing
    was upgraded, the database was current or new)."""
    if user_version(conn) == SCHEMA_VERSION:
        return None  # the usual start: nothing to write
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = user_version(conn)  # another process may have just upgraded it
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"its schema version {found} is newer than this halfpi understands"
                f" ({SCHEMA_VERSION}): upgrade halfpi"
            )
        upgraded_from = None
        if found < SCHEMA_VERSION:
            if found == 0 and not _has_table(conn, "events"):
                for statement in _statements(SCHEMA):
                    conn.execute(statement)
            else:
                for upgrade in UPGRADES[found:]:
                    upgrade(conn)
                upgraded_from = found
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return upgraded_from


def user_version(conn: sqlite3.Connection) -> int:
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
    log.debug("upgrade step: schema 0 to 1")


def _add_columns(conn: sqlite3.Connection, columns: tuple[tuple[str, str, str], ...]) -> None:
    for table, column, kind in columns:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _upgrade_1_to_2(conn: sqlite3.Connection) -> None:
    """A reply keeps its error code and its reason (every end is a message)."""
    _add_columns(conn, ADDED_COLUMNS[:2])
    log.debug("upgrade step: schema 1 to 2")


def _upgrade_2_to_3(conn: sqlite3.Connection) -> None:
    """A reply keeps the tokens its model used."""
    _add_columns(conn, ADDED_COLUMNS[2:3])
    log.debug("upgrade step: schema 2 to 3")


def _upgrade_3_to_4(conn: sqlite3.Connection) -> None:
    """Each conversation's epoch is stored (none yet: the first Mind to load
    a conversation writes one, as a restarted Mind always did in memory)."""
    conn.execute("ALTER TABLE conversations ADD COLUMN epoch TEXT")
    log.debug("upgrade step: schema 3 to 4")


def _upgrade_4_to_5(conn: sqlite3.Connection) -> None:
    """The background tasks' outbox: a new table (empty), its indexes and
    the triggers that move its states by their table."""
    for statement in _statements(TASKS):
        conn.execute(statement)
    log.debug("upgrade step: schema 4 to 5")


# UPGRADES[n] takes a database from version n to n + 1.
UPGRADES: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _upgrade_0_to_1,
    _upgrade_1_to_2,
    _upgrade_2_to_3,
    _upgrade_3_to_4,
    _upgrade_4_to_5,
)
assert len(UPGRADES) == SCHEMA_VERSION
