"""The PostgreSQL Store's schema: its tables, its version and the upgrades
from every earlier version (docs/cluster.md, "PostgreSQL").

The database records its version in ``meta`` (``schema_version``). Opening
one creates the schema, or upgrades an older one in a single transaction
(all or nothing), or refuses one written by a newer halfpi untouched. Nodes
starting together serialise on an advisory lock, so exactly one of them
creates or upgrades and the others find it done.

The tables mirror the SQLite Store's (``sqlite_schema.py``), with two things
only a shared database needs: ``conversation_fences``, the highest fencing
token each conversation has seen (checked by :data:`FENCE_FUNCTION` in the
transaction that writes), and the rules that keep one outcome per run as
PostgreSQL triggers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from halfpi.store import outbox

log = logging.getLogger("halfpi.store")

# Schema versions (meta.schema_version), this backend's own sequence:
#   1  the first: the SQLite schema at its version 4, plus conversation_fences
#   2  the background tasks' outbox (tasks; SQLite's version 5), its states
#      guarded by a trigger drawn from core.states.OUTBOX
# A new version: change SCHEMA, append its upgrade to UPGRADES and add a test
# that upgrades a database made by the previous one.
SCHEMA_VERSION = 2

# SQLSTATEs our own functions raise (class "HP": halfpi), mapped by the Store
# to TerminalExists and FencedOut.
TERMINAL_REFUSAL = "HPI10"
FENCED_OUT = "HPFEN"
# A task's move its table does not allow: a plain write failure.
TASK_MOVE_REFUSAL = "HPSTM"

# Any fixed number: the advisory lock nodes take while creating or upgrading.
SCHEMA_LOCK = 0x68616C66

FENCE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION halfpi_fence(conv TEXT, token BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conversation_fences AS f (conversation_id, fence) VALUES (conv, token)
    ON CONFLICT (conversation_id) DO UPDATE SET fence = EXCLUDED.fence
        WHERE f.fence <= EXCLUDED.fence;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'halfpi: fencing token % of conversation % is stale', token, conv
            USING ERRCODE = '{FENCED_OUT}';
    END IF;
END $$
"""

FIRST_OUTCOME_FUNCTION = f"""
CREATE OR REPLACE FUNCTION halfpi_first_outcome_stands() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'halfpi: this run already has its outcome' USING ERRCODE = '{TERMINAL_REFUSAL}';
END $$
"""

# The background tasks' outbox (DESIGN §8; store/outbox.py): one row per
# task, created with its admission, its state moved only as the outbox's
# table allows, the first terminal state standing (I10).
TASKS: tuple[str, ...] = (
    f"""CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY,
        delivery_id TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        hand_id TEXT NOT NULL,
        hand_label TEXT NOT NULL,
        tool TEXT NOT NULL,
        args TEXT,
        timeout_s DOUBLE PRECISION,
        digest TEXT NOT NULL,
        detail_mode TEXT NOT NULL,
        principal_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        next_attempt_at DOUBLE PRECISION NOT NULL,
        state TEXT NOT NULL CONSTRAINT tasks_state CHECK (state IN ({outbox.STATES})),
        approved BOOLEAN NOT NULL,
        attempts BIGINT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        delivered_at DOUBLE PRECISION,
        hand_task_id TEXT,
        answer TEXT,
        started_at DOUBLE PRECISION,
        ended_at DOUBLE PRECISION,
        exit_code BIGINT,
        error TEXT,
        log_bytes BIGINT,
        log_truncated BOOLEAN,
        CONSTRAINT tasks_delivery_id UNIQUE (delivery_id)
    )""",
    "CREATE INDEX tasks_by_time ON tasks (created_at, task_id)",
    "CREATE INDEX tasks_by_conversation ON tasks (conversation_id, created_at, task_id)",
    "CREATE INDEX tasks_by_hand ON tasks (hand_id, created_at, task_id)",
    "CREATE INDEX tasks_due ON tasks (next_attempt_at, created_at, task_id)"
    f" WHERE delivered_at IS NULL AND state IN ({outbox.OPEN_STATES})",
    f"""CREATE OR REPLACE FUNCTION halfpi_task_moves() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ({outbox.TERMINAL_STATES}) THEN
        RAISE EXCEPTION 'halfpi: task % already has its outcome (%)', OLD.task_id, OLD.state
            USING ERRCODE = '{TERMINAL_REFUSAL}';
    END IF;
    IF OLD.state || '>' || NEW.state NOT IN ({outbox.ALLOWED_MOVES})
        OR (NEW.state = '{outbox.DEAD}' AND NEW.delivered_at IS NOT NULL) THEN
        RAISE EXCEPTION 'halfpi: task % cannot move from % to %', OLD.task_id, OLD.state,
            NEW.state USING ERRCODE = '{TASK_MOVE_REFUSAL}';
    END IF;
    RETURN NEW;
END $$""",
    "CREATE TRIGGER tasks_move_by_their_table BEFORE UPDATE ON tasks FOR EACH ROW"
    " WHEN (NEW.state IS DISTINCT FROM OLD.state) EXECUTE FUNCTION halfpi_task_moves()",
)

_ENDED = (
    ("runs", "finished_at"),
    ("tool_runs", "finished_at"),
    ("tool_calls", "finished_at"),
    ("approvals", "decided_at"),
)

SCHEMA: tuple[str, ...] = (
    """CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE credentials (
        principal_id TEXT PRIMARY KEY,
        label TEXT NOT NULL,
        kind TEXT NOT NULL,
        profile TEXT NOT NULL,
        scopes TEXT NOT NULL,
        token_hash TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        CONSTRAINT credentials_token_hash UNIQUE (token_hash)
    )""",
    "CREATE UNIQUE INDEX credentials_live_label ON credentials (kind, label)"
    " WHERE revoked_at IS NULL",
    """CREATE TABLE conversations (
        conversation_id TEXT PRIMARY KEY,
        name TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        created_by TEXT,
        seq_reserved BIGINT NOT NULL DEFAULT 0,
        epoch TEXT
    )""",
    """CREATE TABLE conversation_fences (
        conversation_id TEXT PRIMARY KEY,
        fence BIGINT NOT NULL
    )""",
    """CREATE TABLE events (
        conversation_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        ts DOUBLE PRECISION NOT NULL,
        terminal_of TEXT,
        PRIMARY KEY (conversation_id, seq)
    )""",
    "CREATE UNIQUE INDEX events_terminal_of ON events (terminal_of) WHERE terminal_of IS NOT NULL",
    """CREATE TABLE messages (
        conversation_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        request_id TEXT,
        status TEXT,
        ts DOUBLE PRECISION NOT NULL,
        error_code TEXT,
        reason TEXT,
        usage TEXT,
        PRIMARY KEY (conversation_id, seq)
    )""",
    """CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        principal_id TEXT NOT NULL,
        status TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        content TEXT,
        error_code TEXT
    )""",
    "CREATE INDEX runs_open ON runs (status) WHERE finished_at IS NULL",
    "CREATE INDEX runs_by_request ON runs (conversation_id, request_id)",
    """CREATE TABLE requests (
        principal_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        type TEXT NOT NULL,
        digest TEXT NOT NULL,
        status TEXT NOT NULL,
        conversation_id TEXT,
        run_id TEXT,
        accepted TEXT NOT NULL,
        result TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        PRIMARY KEY (principal_id, request_id)
    )""",
    "CREATE INDEX requests_open ON requests (status) WHERE finished_at IS NULL",
    "CREATE INDEX requests_finished ON requests (principal_id, finished_at)"
    " WHERE finished_at IS NOT NULL",
    """CREATE TABLE tombstones (
        principal_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        result TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (principal_id, request_id)
    )""",
    """CREATE TABLE tool_calls (
        tool_call_id TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        chat_run_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        detail_mode TEXT NOT NULL,
        args_digest TEXT NOT NULL,
        args TEXT,
        scan_warnings TEXT NOT NULL,
        called_seq BIGINT NOT NULL,
        status TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        hand_id TEXT,
        run_id TEXT,
        success BOOLEAN,
        output_bytes BIGINT,
        digest TEXT,
        truncated BOOLEAN,
        error_category TEXT,
        result TEXT,
        completed_seq BIGINT,
        finished_at DOUBLE PRECISION
    )""",
    "CREATE INDEX tool_calls_by_conversation ON tool_calls (conversation_id, called_seq)",
    "CREATE INDEX tool_calls_open ON tool_calls (status) WHERE finished_at IS NULL",
    """CREATE TABLE approvals (
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
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        decision TEXT,
        decided_by TEXT,
        decision_reason TEXT,
        decided_at DOUBLE PRECISION
    )""",
    "CREATE INDEX approvals_open ON approvals (status) WHERE decided_at IS NULL",
    """CREATE TABLE tool_runs (
        run_id TEXT PRIMARY KEY,
        tool_call_id TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        hand_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        exit_code BIGINT,
        output_bytes BIGINT,
        digest TEXT
    )""",
    "CREATE INDEX tool_runs_open ON tool_runs (status) WHERE finished_at IS NULL",
    "INSERT INTO meta (key, value) VALUES ('credentials_version', '0')",
    FENCE_FUNCTION,
    FIRST_OUTCOME_FUNCTION,
    *(
        f"CREATE TRIGGER {table}_first_outcome_stands BEFORE UPDATE ON {table}"
        f" FOR EACH ROW WHEN (OLD.{ended} IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status)"
        " EXECUTE FUNCTION halfpi_first_outcome_stands()"
        for table, ended in _ENDED
    ),
    *TASKS,
)


async def _upgrade_1_to_2(conn: Any) -> None:
    """The background tasks' outbox: a new table (empty), its indexes and
    the trigger that moves its states by their table."""
    for statement in TASKS:
        await conn.execute(statement)


# UPGRADES[n - 1] takes a database from version n to n + 1.
UPGRADES: tuple[Callable[[Any], Awaitable[None]], ...] = (_upgrade_1_to_2,)
assert len(UPGRADES) == SCHEMA_VERSION - 1


class NewerSchema(Exception):
    """The database was written by a newer halfpi (its version is ``found``)."""

    def __init__(self, found: int) -> None:
        super().__init__(
            f"its schema version {found} is newer than this halfpi understands"
            f" ({SCHEMA_VERSION}): upgrade halfpi"
        )
        self.found = found


async def schema_version(conn: Any) -> int:
    """The database's schema version; 0 for an empty database."""
    # Read from pg_tables (an MVCC read that sees a table another node has
    # just created), not to_regclass (which can answer from a stale cache).
    if not await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_tables"
        " WHERE schemaname = current_schema() AND tablename = 'meta')"
    ):
        return 0
    value = await conn.fetchval("SELECT value FROM meta WHERE key = 'schema_version'")
    return 0 if value is None else int(value)


async def init_schema(conn: Any) -> None:
    """Create the schema, or upgrade an older one to :data:`SCHEMA_VERSION`
    (one transaction: all or nothing). Raises :class:`NewerSchema`, touching
    nothing, for a database written by a newer halfpi."""
    found = await schema_version(conn)
    if found == SCHEMA_VERSION:
        return  # the usual start: nothing to write
    if found > SCHEMA_VERSION:
        raise NewerSchema(found)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        found = await schema_version(conn)  # another node may have just done it
        if found > SCHEMA_VERSION:
            raise NewerSchema(found)
        if found == SCHEMA_VERSION:
            return
        if found == 0:
            for statement in SCHEMA:
                await conn.execute(statement)
        else:
            for upgrade in UPGRADES[found - 1 :]:
                await upgrade(conn)
            log.info("upgraded the PostgreSQL database from schema %d to %d",
                     found, SCHEMA_VERSION)
        await conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', $1)"
            " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            str(SCHEMA_VERSION),
        )
