"""Every SQL statement of the PostgreSQL Store, and the mapping between rows
and the Store's values.

Coroutines of one asyncpg connection, called by the Store's writer (inside
its group-commit transaction) and on pooled connections for reads; nothing
here opens, pools or retries connections. The schema lives in
:mod:`halfpi.store.postgres_schema`.
"""

from __future__ import annotations

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
    Fence,
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

__all__ = [
    "add_credential",
    "apply_tx",
    "approval",
    "chat_run_for_request",
    "check_fences",
    "conversation",
    "conversations",
    "credentials",
    "credentials_version",
    "due_tasks",
    "events",
    "fence_of",
    "head_seq",
    "insert_events",
    "insert_fenced",
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

Conn = Any  # an asyncpg Connection (asyncpg ships no type hints)

_encode = msgspec.json.encode
_decode = msgspec.json.decode


def _json(value: Any) -> str | None:
    return None if value is None else _encode(value).decode()


# -- row mapping -------------------------------------------------------------

_REQUEST_COLUMNS = (
    "principal_id, request_id, type, digest, status, conversation_id, run_id,"
    " accepted, result, created_at, finished_at"
)


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
    columns = ", ".join(fields)
    marks = ", ".join(f"${i}" for i in range(1, len(fields) + 1))
    updates = ", ".join(f"{f} = EXCLUDED.{f}" for f in fields[1:])
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({marks})"
        f" ON CONFLICT ({fields[0]}) DO UPDATE SET {updates}"
    )


def _params(row: Any, fields: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(
        _json(getattr(row, name)) if name in _JSON_FIELDS else getattr(row, name) for name in fields
    )


def _from_row(cls: Any, fields: tuple[str, ...], row: Sequence[Any]) -> Any:
    values = {}
    for name, value in zip(fields, row, strict=True):
        if name in _JSON_FIELDS and value is not None:
            value = _decode(value)
            if name == "scan_warnings":
                value = tuple(value)
        values[name] = value
    return cls(**values)


_CHAT_RUN_COLUMNS = (
    "run_id, conversation_id, request_id, principal_id, status, started_at,"
    " finished_at, content, error_code"
)
_CREDENTIAL_COLUMNS = (
    "principal_id, label, kind, profile, scopes, token_hash, created_at, revoked_at"
)
_CONVERSATION_COLUMNS = "conversation_id, name, created_at, created_by, epoch"
_MESSAGE_COLUMNS = (
    "conversation_id, seq, role, content, request_id, status, ts, error_code, reason, usage"
)


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


def _message_from_row(row: Sequence[Any]) -> MessageRow:
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


# -- writes (the writer's transaction) -----------------------------------------


async def lookup_request(
    conn: Conn, principal_id: str, request_id: str
) -> RequestRecord | Tombstone | None:
    row = await conn.fetchrow(
        f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE principal_id = $1 AND request_id = $2",
        principal_id,
        request_id,
    )
    if row is not None:
        return _request_from_row(row)
    row = await conn.fetchrow(
        "SELECT digest, result, expires_at FROM tombstones"
        " WHERE principal_id = $1 AND request_id = $2",
        principal_id,
        request_id,
    )
    if row is not None:
        return Tombstone(principal_id, request_id, row[0], _decode(row[1]), row[2])
    return None


async def check_fences(conn: Conn, fences: Sequence[Fence]) -> None:
    """Check and raise each conversation's fence in the database, in order
    (the ``halfpi_fence`` function raises SQLSTATE ``HPFEN`` for a stale one).
    Called in the transaction that writes, so a take-over that raises the
    fence waits on the row lock until this transaction ends, and is seen by
    every later one."""
    if len(fences) == 1:
        await conn.execute(
            "SELECT halfpi_fence($1, $2)", fences[0].conversation_id, fences[0].token
        )
    elif fences:
        await conn.execute(
            "SELECT halfpi_fence(c, t) FROM unnest($1::text[], $2::bigint[])"
            " WITH ORDINALITY AS f(c, t, n) ORDER BY n",
            [f.conversation_id for f in fences],
            [f.token for f in fences],
        )


async def apply_tx(conn: Conn, tx: WriteTx) -> TxOutcome:
    """Apply one transaction's writes inside an open transaction (savepoint)."""
    if tx.fence is not None:
        await check_fences(conn, [tx.fence])
    if tx.admit is not None:
        existing = await lookup_request(conn, tx.admit.principal_id, tx.admit.request_id)
        if existing is not None:
            return TxOutcome(existing)
        a = tx.admit
        inserted = await conn.fetchval(
            f"INSERT INTO requests ({_REQUEST_COLUMNS})"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)"
            " ON CONFLICT (principal_id, request_id) DO NOTHING RETURNING 1",
            a.principal_id,
            a.request_id,
            a.type,
            a.digest,
            a.status,
            a.conversation_id,
            a.run_id,
            _json(a.accepted),
            _json(a.result),
            a.created_at,
            a.finished_at,
        )
        if inserted is None:
            # Another node admitted the same key and committed meanwhile (I5).
            existing = await lookup_request(conn, a.principal_id, a.request_id)
            assert existing is not None
            return TxOutcome(existing)
    if tx.conversations:
        await conn.executemany(
            "INSERT INTO conversations (conversation_id, name, created_at, created_by, epoch)"
            " VALUES ($1,$2,$3,$4,$5)",
            [
                (c.conversation_id, c.name, c.created_at, c.created_by, c.epoch)
                for c in tx.conversations
            ],
        )
    if tx.conversation_names:
        await conn.executemany(
            "UPDATE conversations SET name = $1 WHERE conversation_id = $2",
            [(name, conversation_id) for conversation_id, name in tx.conversation_names],
        )
    if tx.epochs:
        await conn.executemany(
            "UPDATE conversations SET epoch = $1 WHERE conversation_id = $2",
            [(epoch, conversation_id) for conversation_id, epoch in tx.epochs],
        )
    if tx.meta:
        await conn.executemany(
            "INSERT INTO meta (key, value) VALUES ($1, $2)"
            " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            list(tx.meta),
        )
    if tx.seq_reservations:
        await conn.executemany(
            "UPDATE conversations SET seq_reserved = GREATEST(seq_reserved, $1)"
            " WHERE conversation_id = $2",
            [(upto, conversation_id) for conversation_id, upto in tx.seq_reservations],
        )
    if tx.chat_runs:
        await conn.executemany(
            f"INSERT INTO runs ({_CHAT_RUN_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)"
            " ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status,"
            " finished_at = EXCLUDED.finished_at, content = EXCLUDED.content,"
            " error_code = EXCLUDED.error_code",
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
        await conn.executemany(
            "UPDATE runs SET content = coalesce(content, '') || $1 WHERE run_id = $2",
            [(t.text, t.run_id) for t in tx.run_text],
        )
    if tx.finished:
        await conn.executemany(
            "UPDATE requests SET status = $1, result = $2, finished_at = $3"
            " WHERE principal_id = $4 AND request_id = $5 AND finished_at IS NULL",
            [
                (f.status, _json(f.result), f.finished_at, f.principal_id, f.request_id)
                for f in tx.finished
            ],
        )
    if tx.messages:
        await conn.executemany(
            f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)",
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
                    _json(m.usage),
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
            await conn.executemany(_upsert_sql(table, fields), [_params(r, fields) for r in rows])
    if tx.tasks:
        await conn.executemany(_INSERT_TASK, [outbox.row_params(t) for t in tx.tasks])
    if tx.task_updates:
        await conn.executemany(
            _UPDATE_TASK,
            [tuple(outbox.update_params(u).values()) for u in tx.task_updates],
        )
    if tx.events:
        await insert_events(conn, tx.events)
    return COMMITTED


_TASK_COLUMNS = ", ".join(outbox.FIELDS)
_INSERT_TASK = (
    f"INSERT INTO tasks ({_TASK_COLUMNS})"
    f" VALUES ({', '.join(f'${i}' for i in range(1, len(outbox.FIELDS) + 1))})"
)
# update_params' keys, in order, are the parameters $1, $2, …
_UPDATE_ORDER = ("task_id", "at", *(name for name, _ in outbox.UPDATED_FIELDS))
_UPDATE_TASK = (
    f"UPDATE tasks SET {outbox.set_clause(lambda name: f'${_UPDATE_ORDER.index(name) + 1}')}"
    " WHERE task_id = $1"
)


def _event_columns(events: Sequence[StoredEvent]) -> tuple[list[Any], ...]:
    return (
        [e.conversation_id for e in events],
        [e.seq for e in events],
        [e.type for e in events],
        [e.data.decode() for e in events],
        [e.ts for e in events],
        [terminal_of(e) if e.type in TERMINAL_EVENT_TYPES else None for e in events],
    )


async def insert_events(conn: Conn, events: Sequence[StoredEvent]) -> None:
    """One INSERT for any number of events (columns passed as arrays)."""
    await conn.execute(
        "INSERT INTO events (conversation_id, seq, type, data, ts, terminal_of)"
        " SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[],"
        " $5::float8[], $6::text[])",
        *_event_columns(events),
    )


# The fenced append's usual case in one statement (one round trip): every
# fence of the batch is the one its conversation's row holds now, so the
# events go in. ``held`` locks each fence row FOR SHARE: a take-over's
# raise (halfpi_fence, an UPDATE of the row) waits until this transaction
# ends, and a raise committed while this one waited is what ``held`` reads
# (READ COMMITTED re-reads a row it had to wait for). Anything else — a
# missing row (a first claim), a newer token (a claim), an older one (a
# stale owner) — inserts nothing and answers false: the caller then runs
# check_fences, which claims or refuses (FencedOut).
_FENCED_INSERT = (
    "WITH held AS (SELECT conversation_id, fence FROM conversation_fences"
    " WHERE conversation_id = ANY($7::text[]) FOR SHARE),"
    " ok AS (SELECT count(*) = cardinality($7::text[]) AS ok FROM held"
    " JOIN unnest($7::text[], $8::bigint[]) AS u(c, t)"
    " ON held.conversation_id = u.c AND held.fence = u.t),"
    " ins AS (INSERT INTO events (conversation_id, seq, type, data, ts, terminal_of)"
    " SELECT e.* FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[],"
    " $5::float8[], $6::text[]) AS e, ok WHERE ok.ok)"
    " SELECT ok FROM ok"
)


async def insert_fenced(
    conn: Conn, events: Sequence[StoredEvent], fences: Sequence[Fence]
) -> bool:
    """Insert ``events`` if every one of ``fences`` (one per conversation
    and token) is its conversation's fence now; False, inserting nothing,
    if not. One statement: atomic on its own, outside a transaction too."""
    return bool(
        await conn.fetchval(
            _FENCED_INSERT,
            *_event_columns(events),
            [f.conversation_id for f in fences],
            [f.token for f in fences],
        )
    )


# -- credentials (rare writes, each in its own transaction) ---------------------

_BUMP = "UPDATE meta SET value = (value::bigint + 1)::text WHERE key = 'credentials_version'"


async def add_credential(conn: Conn, c: Credential) -> None:
    """Insert ``c`` and bump the version; :class:`LabelInUse` if a live
    credential of its kind has its label (the partial unique index)."""
    import asyncpg

    try:
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO credentials ({_CREDENTIAL_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8)",
                c.principal_id,
                c.label,
                c.kind,
                c.profile,
                _json(sorted(c.scopes)),
                c.token_hash,
                c.created_at,
                c.revoked_at,
            )
            await conn.execute(_BUMP)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == "credentials_live_label":
            raise LabelInUse(
                f"a live {c.kind} credential labelled {c.label!r} already exists", field="label"
            ) from None
        raise


async def credentials(conn: Conn) -> list[Credential]:
    rows = await conn.fetch(f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials ORDER BY created_at")
    return [_credential_from_row(r) for r in rows]


async def revoke_credential(conn: Conn, kind: str, label: str, now: float) -> bool:
    async with conn.transaction():
        revoked = await conn.fetch(
            "UPDATE credentials SET revoked_at = $1 WHERE kind = $2 AND label = $3"
            " AND revoked_at IS NULL RETURNING principal_id",
            now,
            kind,
            label,
        )
        if revoked:
            await conn.execute(_BUMP)
    return bool(revoked)


async def credentials_version(conn: Conn) -> int:
    value = await conn.fetchval("SELECT value FROM meta WHERE key = 'credentials_version'")
    return 0 if value is None else int(value)


# -- pruning ------------------------------------------------------------------------


async def prune_requests(conn: Conn, now: float, retention: RequestRetention) -> int:
    """Move terminal records past retention to tombstones; expire old tombstones."""
    pruned = 0
    async with conn.transaction():
        principals = [
            r[0]
            for r in await conn.fetch(
                "SELECT principal_id FROM requests WHERE finished_at IS NOT NULL"
                " GROUP BY principal_id HAVING COUNT(*) > $1",
                retention.max_per_principal,
            )
        ]
        for principal in principals:
            finished = [
                Finished(r[0], r[1])
                for r in await conn.fetch(
                    "SELECT request_id, finished_at FROM requests"
                    " WHERE principal_id = $1 AND finished_at IS NOT NULL",
                    principal,
                )
            ]
            for request_id in prunable(finished, now, retention):
                await conn.execute(
                    "INSERT INTO tombstones"
                    " (principal_id, request_id, digest, result, expires_at)"
                    " SELECT principal_id, request_id, digest, result, $1"
                    " FROM requests WHERE principal_id = $2 AND request_id = $3"
                    " ON CONFLICT (principal_id, request_id) DO UPDATE SET"
                    " digest = EXCLUDED.digest, result = EXCLUDED.result,"
                    " expires_at = EXCLUDED.expires_at",
                    now + retention.tombstone_seconds,
                    principal,
                    request_id,
                )
                await conn.execute(
                    "DELETE FROM requests WHERE principal_id = $1 AND request_id = $2",
                    principal,
                    request_id,
                )
                pruned += 1
        await conn.execute("DELETE FROM tombstones WHERE expires_at < $1", now)
    return pruned


# -- reads ---------------------------------------------------------------------------


async def conversation(conn: Conn, conversation_id: str) -> ConversationRow | None:
    row = await conn.fetchrow(
        f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE conversation_id = $1",
        conversation_id,
    )
    return ConversationRow(*row) if row else None


async def conversations(conn: Conn, limit: int, before: str | None) -> list[ConversationRow]:
    rows = await conn.fetch(
        f"SELECT {_CONVERSATION_COLUMNS} FROM conversations"
        " WHERE $1::text IS NULL OR conversation_id < $1"
        " ORDER BY conversation_id DESC LIMIT $2",
        before,
        limit,
    )
    return [ConversationRow(*r) for r in rows]


async def head_seq(conn: Conn, conversation_id: str) -> int:
    value = await conn.fetchval(
        "SELECT GREATEST("
        " COALESCE((SELECT MAX(seq) FROM events WHERE conversation_id = $1), 0),"
        " COALESCE((SELECT seq_reserved FROM conversations WHERE conversation_id = $1), 0))",
        conversation_id,
    )
    return int(value or 0)


async def fence_of(conn: Conn, conversation_id: str) -> int:
    value = await conn.fetchval(
        "SELECT fence FROM conversation_fences WHERE conversation_id = $1", conversation_id
    )
    return int(value or 0)


async def message_page(
    conn: Conn, conversation_id: str, limit: int, upper: int | None
) -> MessagePage:
    """The newest ``limit`` messages below seq ``upper`` (if given), oldest first."""
    rows = await conn.fetch(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = $1"
        " AND ($2::bigint IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3",
        conversation_id,
        upper,
        limit + 1,
    )
    more = len(rows) > limit
    return MessagePage([_message_from_row(r) for r in reversed(rows[:limit])], more)


async def chat_run_for_request(
    conn: Conn, conversation_id: str, request_id: str, principal_id: str | None
) -> ChatRunRow | None:
    row = await conn.fetchrow(
        f"SELECT {_CHAT_RUN_COLUMNS} FROM runs WHERE conversation_id = $1 AND request_id = $2"
        " AND ($3::text IS NULL OR principal_id = $3) ORDER BY started_at DESC LIMIT 1",
        conversation_id,
        request_id,
        principal_id,
    )
    return ChatRunRow(*row) if row else None


async def tool_history(
    conn: Conn, conversation_id: str, max_seq: int, limit: int
) -> list[ToolCallRow]:
    rows = await conn.fetch(
        f"SELECT {', '.join(_TOOL_CALL_FIELDS)} FROM tool_calls"
        " WHERE conversation_id = $1 AND called_seq <= $2"
        " ORDER BY called_seq DESC LIMIT $3",
        conversation_id,
        max_seq,
        limit,
    )
    return [_from_row(ToolCallRow, _TOOL_CALL_FIELDS, r) for r in reversed(rows)]


async def approval(conn: Conn, approval_id: str) -> ApprovalRow | None:
    row = await conn.fetchrow(
        f"SELECT {', '.join(_APPROVAL_FIELDS)} FROM approvals WHERE approval_id = $1",
        approval_id,
    )
    return _from_row(ApprovalRow, _APPROVAL_FIELDS, row) if row else None


async def tool_run(conn: Conn, run_id: str) -> ToolRunRow | None:
    row = await conn.fetchrow(
        f"SELECT {', '.join(_TOOL_RUN_FIELDS)} FROM tool_runs WHERE run_id = $1", run_id
    )
    return _from_row(ToolRunRow, _TOOL_RUN_FIELDS, row) if row else None


async def _unfinished(
    conn: Conn, cls: Any, table: str, fields: tuple[str, ...], done: str
) -> list[Any]:
    rows = await conn.fetch(f"SELECT {', '.join(fields)} FROM {table} WHERE {done} IS NULL")
    return [_from_row(cls, fields, r) for r in rows]


async def open_approvals(conn: Conn) -> list[ApprovalRow]:
    return await _unfinished(conn, ApprovalRow, "approvals", _APPROVAL_FIELDS, "decided_at")


async def open_tool_calls(conn: Conn) -> list[ToolCallRow]:
    return await _unfinished(conn, ToolCallRow, "tool_calls", _TOOL_CALL_FIELDS, "finished_at")


async def open_tool_runs(conn: Conn) -> list[ToolRunRow]:
    return await _unfinished(conn, ToolRunRow, "tool_runs", _TOOL_RUN_FIELDS, "finished_at")


async def open_chat_runs(conn: Conn) -> list[ChatRunRow]:
    rows = await conn.fetch(
        f"SELECT {_CHAT_RUN_COLUMNS} FROM runs WHERE finished_at IS NULL ORDER BY started_at"
    )
    return [ChatRunRow(*r) for r in rows]


async def open_requests(conn: Conn) -> list[RequestRecord]:
    rows = await conn.fetch(f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE finished_at IS NULL")
    return [_request_from_row(r) for r in rows]


async def events(conn: Conn, conversation_id: str, after_seq: int, limit: int) -> list[StoredEvent]:
    rows = await conn.fetch(
        "SELECT conversation_id, seq, type, data, ts FROM events"
        " WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        conversation_id,
        after_seq,
        limit,
    )
    return [StoredEvent(r[0], r[1], r[2], r[3].encode(), r[4]) for r in rows]


# -- the background tasks' outbox -----------------------------------------------------


async def task(conn: Conn, task_id: str) -> TaskRow | None:
    row = await conn.fetchrow(f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = $1", task_id)
    return outbox.task_from_row(row) if row else None


async def task_for_delivery(conn: Conn, delivery_id: str) -> TaskRow | None:
    row = await conn.fetchrow(
        f"SELECT {_TASK_COLUMNS} FROM tasks WHERE delivery_id = $1", delivery_id
    )
    return outbox.task_from_row(row) if row else None


async def list_tasks(
    conn: Conn,
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

    def given(value: Any) -> str:
        params.append(value)
        return f"${len(params)}"

    if conversation_id is not None:
        where.append(f"conversation_id = {given(conversation_id)}")
    if hand_id is not None:
        where.append(f"hand_id = {given(hand_id)}")
    if states is not None:
        where.append(f"state = ANY({given(list(states))}::text[])")
    if before is not None:
        where.append(
            "(created_at, task_id) <"
            f" (SELECT created_at, task_id FROM tasks WHERE task_id = {given(before)})"
        )
    rows = await conn.fetch(
        f"SELECT {_TASK_COLUMNS} FROM tasks"
        f"{' WHERE ' + ' AND '.join(where) if where else ''}"
        f" ORDER BY created_at DESC, task_id DESC LIMIT {given(limit)}",
        *params,
    )
    return [outbox.task_from_row(r) for r in rows]


async def due_tasks(conn: Conn, now: float, limit: int) -> list[TaskRow]:
    """Undelivered, open, due at ``now``: the most overdue first (the
    conditions are the ``tasks_due`` index's)."""
    rows = await conn.fetch(
        f"SELECT {_TASK_COLUMNS} FROM tasks"
        f" WHERE delivered_at IS NULL AND state IN ({outbox.OPEN_STATES})"
        " AND next_attempt_at <= $1"
        " ORDER BY next_attempt_at, created_at, task_id LIMIT $2",
        now,
        limit,
    )
    return [outbox.task_from_row(r) for r in rows]
