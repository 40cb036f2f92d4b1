"""PostgreSQL Store (cluster mode, DESIGN §10): group commit on asyncpg.

One writer task owns one connection. :meth:`PostgresStore.write` queues a
:class:`WriteTx`; the writer takes everything queued, applies it in one
transaction (plain event appends merged into one INSERT, every other write
in its own SAVEPOINT so that its failure undoes only itself), commits once,
and resolves every caller's future. A batch of plain appends only (the
usual one) is a single statement instead, fences checked in it: one round
trip, no BEGIN or COMMIT. Reads run on a small pool of their own.

Fencing: a write carrying a :class:`~halfpi.store.base.Fence` has it checked
and raised by the database (``halfpi_fence``) in the same transaction as the
write (in the usual batch, where every token is already its conversation's,
read with its row locked FOR SHARE by the appending statement itself), so
a stale owner's write fails in PostgreSQL with
:class:`~halfpi.errors.FencedOut` however late it arrives.

asyncpg is imported when the Store opens: the embedded default never needs it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import operator
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from halfpi.core.limits import RequestRetention
from halfpi.core.metrics import COMMIT_BUCKETS, Histogram
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.errors import FencedOut, HalfpiError, StoreError, TerminalExists
from halfpi.store import postgres_sql as sql
from halfpi.store.base import (
    COMMITTED,
    ApprovalRow,
    ChatRunRow,
    ConversationRow,
    Credential,
    Fence,
    MessagePage,
    StoredEvent,
    TaskRow,
    ToolCallRow,
    ToolRunRow,
    TxOutcome,
    WriteTx,
)
from halfpi.store.postgres_schema import FENCED_OUT, TERMINAL_REFUSAL, NewerSchema, init_schema

__all__ = ["MAX_BATCH", "PostgresStore", "dsn_of"]

T = TypeVar("T")

# The most writes one group commit takes.
MAX_BATCH = 4096

# Every field of WriteTx but ``events`` and ``fence``: a write with none of
# them is a (possibly fenced) plain append, merged with the others.
_ALL_BUT_EVENTS_AND_FENCE = operator.attrgetter(
    *(f.name for f in dataclasses.fields(WriteTx) if f.name not in ("events", "fence"))
)

_Outcomes = list[tuple[asyncio.Future[TxOutcome], TxOutcome | BaseException]]


def dsn_of(url: str) -> str:
    """The URL asyncpg takes: ``postgresql+driver://`` and ``postgres://``
    become ``postgresql://``; everything else stays as given."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, parts.fragment))


def _host_of(url: str) -> str:
    """Where the database is, for error lines: never the user or password."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    return f"{host}:{parts.port or 5432}{parts.path}"


def _plain_append(tx: WriteTx) -> bool:
    return not any(_ALL_BUT_EVENTS_AND_FENCE(tx))


class PostgresStore:
    """A :class:`~halfpi.store.base.Store` on PostgreSQL (``--store postgresql://…``)."""

    def __init__(self, url: str, *, readers: int = 4) -> None:
        self.url = url
        self.readers = readers
        self._pending: collections.deque[tuple[WriteTx, asyncio.Future[TxOutcome]]] = (
            collections.deque()
        )
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._conn: Any = None
        self._pool: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0  # commits made, for tests and metrics
        self.commit_seconds = Histogram(COMMIT_BUCKETS)  # each group commit, for /metrics
        # Did the last group commit fail as a whole? ``/readyz`` reads it.
        self.last_commit_failed = False
        self.closed = False

    # lifecycle

    async def open(self) -> None:
        """Connect, create or upgrade the schema, start the writer. Any
        failure is one StoreError line naming the database (no password)."""
        try:
            import asyncpg
        except ImportError:  # pragma: no cover - the extra is installed in CI
            raise StoreError(
                "the PostgreSQL store needs asyncpg: pip install 'halfpi[postgresql]'"
            ) from None
        self._loop = asyncio.get_running_loop()
        try:
            self._conn = await asyncpg.connect(dsn_of(self.url))
            await init_schema(self._conn)
            self._pool = await asyncpg.create_pool(
                dsn_of(self.url), min_size=1, max_size=self.readers
            )
        except (TimeoutError, OSError, asyncpg.PostgresError, NewerSchema) as exc:
            await self._disconnect()
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreError(f"cannot open the database {_host_of(self.url)}: {why}") from exc
        self._writer = asyncio.create_task(self._writer_main(), name="halfpi-postgres-writer")

    async def close(self) -> None:
        """Commit everything queued, then stop the writer and the readers."""
        if self.closed:
            return
        self.closed = True
        self._wake.set()
        if self._writer is not None:
            await self._writer
        await self._disconnect()

    async def _disconnect(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await self._pool.close()
            self._pool = None

    # writes

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        """Queue ``tx`` for the next group commit; the future resolves once durable."""
        assert self._loop is not None, "store not open"
        if self.closed:
            raise StoreError("store is closed")
        future: asyncio.Future[TxOutcome] = self._loop.create_future()
        self._pending.append((tx, future))
        self._wake.set()
        return future

    async def _writer_main(self) -> None:
        # Group commit: each round takes everything queued while the last
        # commit was in flight and commits it at once.
        pending = self._pending
        while True:
            if not pending:
                if self.closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [pending.popleft() for _ in range(min(len(pending), MAX_BATCH))]
            try:
                outcomes = await self._commit_batch(batch)
            except Exception as exc:  # the connection broke: fail this batch only
                failure = StoreError(f"commit failed: {_line(exc)}")
                outcomes = [(future, failure) for _, future in batch]
                self.last_commit_failed = True
                await self._reconnect()
            _resolve_all(outcomes)

    async def _reconnect(self) -> None:
        import asyncpg

        with contextlib.suppress(Exception):
            await self._conn.close()
        try:
            self._conn = await asyncpg.connect(dsn_of(self.url))
        except Exception:  # still down: the next batch tries again
            self._conn = _Broken()

    async def _commit_batch(self, batch: list[tuple[WriteTx, Any]]) -> _Outcomes:
        if isinstance(self._conn, _Broken):
            await self._reconnect()
        try:
            if all(_plain_append(tx) for tx, _ in batch):
                done = await self._append_at_once(batch)
                if done is not None:
                    return done
            return await self._apply_batch(batch, careful=False)
        except _RetryCarefully:
            # A merged append (or its fence) failed: redo the batch with
            # every write in its own savepoint, so only the offending ones fail.
            return await self._apply_batch(batch, careful=True)

    async def _append_at_once(self, batch: list[tuple[WriteTx, Any]]) -> _Outcomes | None:
        """The usual batch, (fenced) plain appends only, as one statement and
        so one round trip: a single statement is a transaction of its own,
        no BEGIN or COMMIT to wait for. None when a fence is not its
        conversation's fence now (nothing was written): the batch then goes
        the transactional way, which claims a new token or refuses a stale
        one. A refused row raises _RetryCarefully (write by write)."""
        import asyncpg

        events = [e for tx, _ in batch for e in tx.events]
        # A conversation's writes in one batch carry the same token: checked
        # once (dict: insertion order, no quadratic scan).
        fences = list(dict.fromkeys(tx.fence for tx, _ in batch if tx.fence is not None))
        started = time.perf_counter()
        try:
            if fences:
                if not await sql.insert_fenced(self._conn, events, fences):
                    return None
            elif events:
                await sql.insert_events(self._conn, events)
        except asyncpg.PostgresError as exc:
            raise _RetryCarefully from exc
        self.last_commit_failed = False
        self.batches += 1
        self.commit_seconds.observe(time.perf_counter() - started)
        return [(future, COMMITTED) for _, future in batch]

    async def _apply_batch(self, batch: list[tuple[WriteTx, Any]], *, careful: bool) -> _Outcomes:
        import asyncpg

        conn = self._conn
        outcomes: _Outcomes = []
        merged: list[StoredEvent] = []
        fences: dict[Fence, None] = {}
        started = time.perf_counter()
        tr = conn.transaction()
        await tr.start()
        try:
            for tx, future in batch:
                if not careful and _plain_append(tx):
                    merged.extend(tx.events)
                    # A conversation's writes in one batch carry the same
                    # token: checked once (the check is the fencing's cost).
                    if tx.fence is not None:
                        fences[tx.fence] = None
                    outcomes.append((future, COMMITTED))
                    continue
                await _insert_merged(conn, merged, fences)
                outcomes.append((future, await _in_savepoint(conn, tx)))
            await _insert_merged(conn, merged, fences)
        except _RetryCarefully:
            await tr.rollback()
            raise
        except asyncpg.PostgresError as exc:
            await tr.rollback()
            self.last_commit_failed = True
            failure = StoreError(f"commit failed: {_line(exc)}")
            return [(future, failure) for _, future in batch]
        except BaseException:
            with contextlib.suppress(Exception):
                await tr.rollback()
            raise
        try:
            await tr.commit()
        except asyncpg.PostgresError as exc:
            self.last_commit_failed = True
            failure = StoreError(f"commit failed: {_line(exc)}")
            return [(future, failure) for _, future in batch]
        self.last_commit_failed = False
        self.batches += 1
        self.commit_seconds.observe(time.perf_counter() - started)
        return outcomes

    # reads

    async def _read(self, fn: Callable[..., Awaitable[T]], *args: Any, doing: str = "read") -> T:
        """Run ``fn`` on a pooled connection; a driver error becomes a
        StoreError (our own errors, such as LabelInUse, pass as they are)."""
        import asyncpg

        if self._pool is None:
            raise StoreError("store is closed" if self.closed else "store not open")
        try:
            async with self._pool.acquire() as conn:
                return await fn(conn, *args)
        except HalfpiError:
            raise
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise StoreError(f"{doing} failed: {_line(exc)}") from exc

    async def get_request(
        self, principal_id: str, request_id: str
    ) -> RequestRecord | Tombstone | None:
        return await self._read(sql.lookup_request, principal_id, request_id)

    async def prune_requests(self, now: float, retention: RequestRetention) -> int:
        return await self._read(sql.prune_requests, now, retention, doing="pruning")

    async def get_conversation(self, conversation_id: str) -> ConversationRow | None:
        return await self._read(sql.conversation, conversation_id)

    async def list_conversations(self, limit: int, before: str | None) -> list[ConversationRow]:
        return await self._read(sql.conversations, limit, before)

    async def head_seq(self, conversation_id: str) -> int:
        return await self._read(sql.head_seq, conversation_id)

    async def fence_of(self, conversation_id: str) -> int:
        return await self._read(sql.fence_of, conversation_id)

    async def messages(
        self, conversation_id: str, *, limit: int, before_seq: int | None, max_seq: int | None
    ) -> MessagePage:
        bounds = [b for b in (before_seq, None if max_seq is None else max_seq + 1) if b]
        upper = min(bounds) if bounds else None
        return await self._read(sql.message_page, conversation_id, limit, upper)

    async def chat_run_for_request(
        self, conversation_id: str, request_id: str, principal_id: str | None = None
    ) -> ChatRunRow | None:
        return await self._read(sql.chat_run_for_request, conversation_id, request_id, principal_id)

    async def tool_history(
        self, conversation_id: str, *, max_seq: int, limit: int
    ) -> list[ToolCallRow]:
        return await self._read(sql.tool_history, conversation_id, max_seq, limit)

    async def get_approval(self, approval_id: str) -> ApprovalRow | None:
        return await self._read(sql.approval, approval_id)

    async def get_tool_run(self, run_id: str) -> ToolRunRow | None:
        return await self._read(sql.tool_run, run_id)

    async def get_task(self, task_id: str) -> TaskRow | None:
        return await self._read(sql.task, task_id)

    async def task_for_delivery(self, delivery_id: str) -> TaskRow | None:
        return await self._read(sql.task_for_delivery, delivery_id)

    async def list_tasks(
        self,
        *,
        limit: int,
        before: str | None = None,
        conversation_id: str | None = None,
        hand_id: str | None = None,
        states: Sequence[str] | None = None,
    ) -> list[TaskRow]:
        return await self._read(sql.list_tasks, limit, before, conversation_id, hand_id, states)

    async def due_tasks(self, now: float, limit: int) -> list[TaskRow]:
        return await self._read(sql.due_tasks, now, limit)

    async def open_approvals(self) -> list[ApprovalRow]:
        return await self._read(sql.open_approvals)

    async def open_tool_calls(self) -> list[ToolCallRow]:
        return await self._read(sql.open_tool_calls)

    async def open_tool_runs(self) -> list[ToolRunRow]:
        return await self._read(sql.open_tool_runs)

    async def open_chat_runs(self) -> list[ChatRunRow]:
        return await self._read(sql.open_chat_runs)

    async def open_requests(self) -> list[RequestRecord]:
        return await self._read(sql.open_requests)

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> list[StoredEvent]:
        return await self._read(sql.events, conversation_id, after_seq, limit)

    # credentials: rare writes, each in its own transaction on a pooled
    # connection; the version is a counter row every node and the CLI share.

    async def credentials(self) -> list[Credential]:
        return await self._read(sql.credentials)

    async def credentials_version(self) -> int:
        return await self._read(sql.credentials_version)

    async def add_credential(self, credential: Credential) -> None:
        await self._read(sql.add_credential, credential, doing="adding a credential")

    async def revoke_credential(self, kind: str, label: str, now: float) -> bool:
        return await self._read(
            sql.revoke_credential, kind, label, now, doing="revoking a credential"
        )


class _Broken:
    """Stands for the writer's connection while the database is unreachable."""


class _RetryCarefully(Exception):
    """A merged append failed; the batch must be redone write by write."""


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def _insert_merged(
    conn: Any, merged: list[StoredEvent], fences: dict[Fence, None]
) -> None:
    import asyncpg

    if not merged and not fences:
        return
    try:
        await sql.check_fences(conn, list(fences))
        if merged:
            await sql.insert_events(conn, merged)
    except asyncpg.PostgresError as exc:
        raise _RetryCarefully from exc
    merged.clear()
    fences.clear()


def _refusal(exc: Any) -> StoreError:
    """The StoreError a database refusal inside one write stands for."""
    import asyncpg

    state = getattr(exc, "sqlstate", None)
    if state == FENCED_OUT:
        return FencedOut(f"refused: {_line(exc)}; this node no longer owns the conversation")
    if state == TERMINAL_REFUSAL or (
        isinstance(exc, asyncpg.UniqueViolationError)
        and exc.constraint_name == "events_terminal_of"
    ):
        return TerminalExists("a second outcome for a run was refused; the first stands")
    return StoreError(f"write failed: {_line(exc)}")


# SQLSTATE classes of the database refusing to write at all, not of one
# write's own fault: insufficient resources (53: a full disk, "could not
# extend file"), operator intervention (57), system error (58: I/O), internal
# error (XX). Such a refusal fails the whole group commit (``/readyz`` then
# says the last commit failed), as it does with SQLite.
_THE_DATABASE_REFUSES = ("53", "57", "58", "XX")


async def _in_savepoint(conn: Any, tx: WriteTx) -> TxOutcome | BaseException:
    """Run ``tx`` so that its failure undoes only itself, not the batch,
    unless the database refuses to write at all (``_THE_DATABASE_REFUSES``)."""
    import asyncpg

    savepoint = conn.transaction()  # nested in the batch's: a SAVEPOINT
    await savepoint.start()
    try:
        outcome = await sql.apply_tx(conn, tx)
    except asyncpg.PostgresError as exc:
        await savepoint.rollback()
        if str(getattr(exc, "sqlstate", "") or "").startswith(_THE_DATABASE_REFUSES):
            raise
        return _refusal(exc)
    if outcome.committed:
        await savepoint.commit()
    else:
        await savepoint.rollback()  # an existing request: the write is dropped whole
    return outcome


def _resolve_all(outcomes: _Outcomes) -> None:
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
