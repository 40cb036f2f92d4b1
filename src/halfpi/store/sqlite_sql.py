"""Every SQL statement of the SQLite Store, and the mapping between rows and
the Store's values.

Synchronous functions of a connection, called on the Store's writer and
reader threads; nothing here knows about asyncio or threads. This module's
public functions are the whole surface the Store uses (``__all__``); column
lists and row mapping stay private to it. The schema and its upgrades live
in :mod:`halfpi.store.sqlite_schema`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import msgspec

from halfpi.core.limits import RequestRetention
from halfpi.core.requests import Finished, RequestRecord, Tombstone, prunable
from halfpi.errors import LabelInUse
from halfpi.store import outbox
from halfpi.store.base import (
    COMMITTED,
    TERMINAL_EVENT_TYPES,
    ApprovalRow,
    ChatRunRow,
    ConversationRow,
    Credential,
    MessagePage,
    MessageRow,
    StoredEvent,
    TaskRow,
    ToolCallRow,
    ToolRunRow,
    TxOutcome,
    WriteTx,
    terminal_of,
)
from halfpi.store.sqlite_schema import TERMINAL_REFUSAL

__all__ = [
    "add_credential",
    "apply_tx",
    "approval",
    "chat_run_for_request",
    "conversation",
    "conversations",
    "credentials",
    "credentials_version",
    "due_tasks",
    "events",
    "head_seq",
    "insert_events",
    "is_terminal_refusal",
    "list_tasks",
    "lookup_request",
    "message_page",
    "open_approvals",
    "open_chat_runs",
    "open_requests",
    "open_tool_calls",
    "open_tool_runs",
    "prune_requests",
    "revoke_credential",
    "task",
    "task_for_delivery",
    "tool_history",
    "tool_run",
]

_encode = msgspec.json.encode
_decode = msgspec.json.decode

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


_CHAT_RUN_COLUMNS = (
    "run_id, conversation_id, request_id, principal_id, status, started_at,"
    " finished_at, content, error_code"
)

_CREDENTIAL_COLUMNS = (
    "principal_id, label, kind, profile, scopes, token_hash, created_at, revoked_at"
)


# -- writes (the writer thread) ----------------------------------------------


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
            "INSERT INTO conversations (conversation_id, name, created_at, created_by, epoch)"
            " VALUES (?,?,?,?,?)",
            [
                (c.conversation_id, c.name, c.created_at, c.created_by, c.epoch)
                for c in tx.conversations
            ],
        )
    if tx.conversation_names:
        conn.executemany(
            "UPDATE conversations SET name = ? WHERE conversation_id = ?",
            [(name, conversation_id) for conversation_id, name in tx.conversation_names],
        )
    if tx.epochs:
        conn.executemany(
            "UPDATE conversations SET epoch = ? WHERE conversation_id = ?",
            [(epoch, conversation_id) for conversation_id, epoch in tx.epochs],
        )
    if tx.meta:
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            list(tx.meta),
        )
    if tx.seq_reservations:
        conn.executemany(
            "UPDATE conversations SET seq_reserved = MAX(seq_reserved, ?)"
            " WHERE conversation_id = ?",
            [(upto, conversation_id) for conversation_id, upto in tx.seq_reservations],
        )
    if tx.chat_runs:
        conn.executemany(
            f"INSERT INTO runs ({_CHAT_RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)"
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
                for r in tx.chat_runs
            ],
        )
    if tx.run_text:
        conn.executemany(
            "UPDATE runs SET content = coalesce(content, '') || ? WHERE run_id = ?",
            [(t.text, t.run_id) for t in tx.run_text],
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
            " error_code, reason, usage) VALUES (?,?,?,?,?,?,?,?,?,?)",
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
                    None if m.usage is None else _encode(m.usage).decode(),
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
    if tx.tasks:
        conn.executemany(_INSERT_TASK, [outbox.row_params(t) for t in tx.tasks])
    if tx.task_updates:
        conn.executemany(_UPDATE_TASK, [outbox.update_params(u) for u in tx.task_updates])
    if tx.events:
        insert_events(conn, tx.events)
    return COMMITTED


_TASK_COLUMNS = ", ".join(outbox.FIELDS)
_INSERT_TASK = (
    f"INSERT INTO tasks ({_TASK_COLUMNS}) VALUES ({', '.join('?' for _ in outbox.FIELDS)})"
)
_UPDATE_TASK = (
    f"UPDATE tasks SET {outbox.set_clause(lambda name: f':{name}')} WHERE task_id = :task_id"
)


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
    # (a task's second outcome is refused with the same words as a run's)
    """True if ``exc`` is the database refusing a second outcome for a run."""
    text = str(exc)
    return isinstance(exc, sqlite3.IntegrityError) and (
        "events.terminal_of" in text or TERMINAL_REFUSAL in text
    )


# -- credentials (reader threads: rare writes with their own transaction) -----


def _bump_credentials_version(conn: sqlite3.Connection) -> None:
    conn.execute(
        "UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)"
        " WHERE key = 'credentials_version'"
    )


def add_credential(conn: sqlite3.Connection, c: Credential) -> None:
    """Insert ``c`` and bump the version; :class:`LabelInUse` if a live
    credential of its kind has its label (the partial unique index)."""
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
        _bump_credentials_version(conn)
        conn.execute("COMMIT")
    except BaseException as exc:
        conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.IntegrityError) and _LIVE_LABEL in str(exc):
            raise LabelInUse(
                f"a live {c.kind} credential labelled {c.label!r} already exists", field="label"
            ) from None
        raise


# How SQLite names the live-label index (kind, label) when it refuses a row.
_LIVE_LABEL = "credentials.kind, credentials.label"


def credentials(conn: sqlite3.Connection) -> list[Credential]:
    rows = conn.execute(
        f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials ORDER BY created_at"
    ).fetchall()
    return [_credential_from_row(r) for r in rows]


def revoke_credential(conn: sqlite3.Connection, kind: str, label: str, now: float) -> bool:
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute(
            "UPDATE credentials SET revoked_at = ? WHERE kind = ? AND label = ?"
            " AND revoked_at IS NULL",
            (now, kind, label),
        )
        if cur.rowcount:
            _bump_credentials_version(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return cur.rowcount > 0


def credentials_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = 'credentials_version'").fetchone()
    return int(row[0]) if row else 0


# -- reads (reader threads) ---------------------------------------------------


def prune_requests(conn: sqlite3.Connection, now: float, retention: RequestRetention) -> int:
    """Move terminal records past retention to tombstones; expire old tombstones."""
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


_CONVERSATION_COLUMNS = "conversation_id, name, created_at, created_by, epoch"


def conversation(conn: sqlite3.Connection, conversation_id: str) -> ConversationRow | None:
    row = conn.execute(
        f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()
    return ConversationRow(*row) if row else None


def conversations(
    conn: sqlite3.Connection, limit: int, before: str | None
) -> list[ConversationRow]:
    if before is None:
        rows = conn.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations"
            " ORDER BY conversation_id DESC LIMIT ?",
            (limit,),
        ).fetchall()
    else:
        rows = conn.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations"
            " WHERE conversation_id < ? ORDER BY conversation_id DESC LIMIT ?",
            (before, limit),
        ).fetchall()
    return [ConversationRow(*r) for r in rows]


def head_seq(conn: sqlite3.Connection, conversation_id: str) -> int:
    row = conn.execute(
        "SELECT MAX(COALESCE((SELECT MAX(seq) FROM events WHERE conversation_id = ?), 0),"
        " COALESCE((SELECT seq_reserved FROM conversations WHERE conversation_id = ?), 0))",
        (conversation_id, conversation_id),
    ).fetchone()
    return int(row[0] or 0)


_MESSAGE_COLUMNS = (
    "conversation_id, seq, role, content, request_id, status, ts, error_code, reason, usage"
)


def message_page(
    conn: sqlite3.Connection, conversation_id: str, limit: int, upper: int | None
) -> MessagePage:
    """The newest ``limit`` messages below seq ``upper`` (if given), oldest first."""
    if upper is None:
        rows = conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ?"
            " ORDER BY seq DESC LIMIT ?",
            (conversation_id, limit + 1),
        ).fetchall()
    else:
        rows = conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? AND seq < ?"
            " ORDER BY seq DESC LIMIT ?",
            (conversation_id, upper, limit + 1),
        ).fetchall()
    more = len(rows) > limit
    return MessagePage([_message_from_row(r) for r in reversed(rows[:limit])], more)


def _message_from_row(row: tuple[Any, ...]) -> MessageRow:
    conversation_id, seq, role, content, request_id, status, ts, error_code, reason, usage = row
    return MessageRow(
        conversation_id,
        seq,
        role,
        content,
        request_id,
        status,
        ts,
        error_code,
        reason,
        None if usage is None else _decode(usage),
    )


def chat_run_for_request(
    conn: sqlite3.Connection, conversation_id: str, request_id: str, principal_id: str | None
) -> ChatRunRow | None:
    row = conn.execute(
        f"SELECT {_CHAT_RUN_COLUMNS} FROM runs WHERE conversation_id = ? AND request_id = ?"
        " AND (? IS NULL OR principal_id = ?) ORDER BY started_at DESC LIMIT 1",
        (conversation_id, request_id, principal_id, principal_id),
    ).fetchone()
    return ChatRunRow(*row) if row else None


def tool_history(
    conn: sqlite3.Connection, conversation_id: str, max_seq: int, limit: int
) -> list[ToolCallRow]:
    rows = conn.execute(
        f"SELECT {', '.join(_TOOL_CALL_FIELDS)} FROM tool_calls"
        " WHERE conversation_id = ? AND called_seq <= ?"
        " ORDER BY called_seq DESC LIMIT ?",
        (conversation_id, max_seq, limit),
    ).fetchall()
    return [_from_row(ToolCallRow, _TOOL_CALL_FIELDS, r) for r in reversed(rows)]


def approval(conn: sqlite3.Connection, approval_id: str) -> ApprovalRow | None:
    row = conn.execute(
        f"SELECT {', '.join(_APPROVAL_FIELDS)} FROM approvals WHERE approval_id = ?",
        (approval_id,),
    ).fetchone()
    return _from_row(ApprovalRow, _APPROVAL_FIELDS, row) if row else None


def tool_run(conn: sqlite3.Connection, run_id: str) -> ToolRunRow | None:
    row = conn.execute(
        f"SELECT {', '.join(_TOOL_RUN_FIELDS)} FROM tool_runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    return _from_row(ToolRunRow, _TOOL_RUN_FIELDS, row) if row else None


def _unfinished(
    conn: sqlite3.Connection, cls: Any, table: str, fields: tuple[str, ...], done: str
) -> list[Any]:
    rows = conn.execute(f"SELECT {', '.join(fields)} FROM {table} WHERE {done} IS NULL")
    return [_from_row(cls, fields, r) for r in rows.fetchall()]


def open_approvals(conn: sqlite3.Connection) -> list[ApprovalRow]:
    return _unfinished(conn, ApprovalRow, "approvals", _APPROVAL_FIELDS, "decided_at")


def open_tool_calls(conn: sqlite3.Connection) -> list[ToolCallRow]:
    return _unfinished(conn, ToolCallRow, "tool_calls", _TOOL_CALL_FIELDS, "finished_at")


def open_tool_runs(conn: sqlite3.Connection) -> list[ToolRunRow]:
    return _unfinished(conn, ToolRunRow, "tool_runs", _TOOL_RUN_FIELDS, "finished_at")


def open_chat_runs(conn: sqlite3.Connection) -> list[ChatRunRow]:
    rows = conn.execute(
        f"SELECT {_CHAT_RUN_COLUMNS} FROM runs WHERE finished_at IS NULL ORDER BY started_at"
    ).fetchall()
    return [ChatRunRow(*r) for r in rows]


def open_requests(conn: sqlite3.Connection) -> list[RequestRecord]:
    rows = conn.execute(
        f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE finished_at IS NULL"
    ).fetchall()
    return [_request_from_row(r) for r in rows]


def events(
    conn: sqlite3.Connection, conversation_id: str, after_seq: int, limit: int
) -> list[StoredEvent]:
    rows = conn.execute(
        "SELECT conversation_id, seq, type, data, ts FROM events"
        " WHERE conversation_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (conversation_id, after_seq, limit),
    ).fetchall()
    return [StoredEvent(r[0], r[1], r[2], r[3].encode(), r[4]) for r in rows]


# -- the background tasks' outbox -------------------------------------------------


def task(conn: sqlite3.Connection, task_id: str) -> TaskRow | None:
    row = conn.execute(
        f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,)
    ).fetchone()
    return outbox.task_from_row(row) if row else None


def task_for_delivery(conn: sqlite3.Connection, delivery_id: str) -> TaskRow | None:
    row = conn.execute(
        f"SELECT {_TASK_COLUMNS} FROM tasks WHERE delivery_id = ?", (delivery_id,)
    ).fetchone()
    return outbox.task_from_row(row) if row else None


def list_tasks(
    conn: sqlite3.Connection,
    limit: int,
    before: str | None,
    conversation_id: str | None,
    hand_id: str | None,
    states: Sequence[str] | None,
) -> list[TaskRow]:
    """Newest first; ``before`` is the last task of the previous page."""
    if states is not None and not states:
        return []
    where: list[str] = []
    params: list[Any] = []
    if conversation_id is not None:
        where.append("conversation_id = ?")
        params.append(conversation_id)
    if hand_id is not None:
        where.append("hand_id = ?")
        params.append(hand_id)
    if states is not None:
        where.append(f"state IN ({', '.join('?' for _ in states)})")
        params.extend(states)
    if before is not None:
        where.append(
            "(created_at, task_id) < (SELECT created_at, task_id FROM tasks WHERE task_id = ?)"
        )
        params.append(before)
    rows = conn.execute(
        f"SELECT {_TASK_COLUMNS} FROM tasks"
        f"{' WHERE ' + ' AND '.join(where) if where else ''}"
        " ORDER BY created_at DESC, task_id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [outbox.task_from_row(r) for r in rows]


def due_tasks(conn: sqlite3.Connection, now: float, limit: int) -> list[TaskRow]:
    """Undelivered, open, due at ``now``: the most overdue first (the
    conditions are the ``tasks_due`` index's)."""
    rows = conn.execute(
        f"SELECT {_TASK_COLUMNS} FROM tasks"
        f" WHERE delivered_at IS NULL AND state IN ({outbox.OPEN_STATES})"
        " AND next_attempt_at <= ?"
        " ORDER BY next_attempt_at, created_at, task_id LIMIT ?",
        (now, limit),
    ).fetchall()
    return [outbox.task_from_row(r) for r in rows]
