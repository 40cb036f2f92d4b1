"""SQLite Store (the embedded default): WAL mode plus group commit.

One writer thread owns the write connection. Callers hand it
:class:`WriteTx` objects; it takes everything queued, applies it in one
transaction (each tx that can fail in its own SAVEPOINT, plain event appends
merged into one ``executemany``), commits once, and resolves every caller's
future in a single hop back to the event loop. Writes reach it a turn of the
loop at a time, so what one turn admits commits together. Throughput stays near the raw
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
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from halfpi.core.limits import RequestRetention
from halfpi.core.metrics import COMMIT_BUCKETS, Histogram
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.errors import StoreError, TerminalExists
from halfpi.store import sqlite_sql as sql
from halfpi.store.base import (
    COMMITTED,
    ApprovalRow,
    ChatRunRow,
    ConversationRow,
    Credential,
    MessagePage,
    StoredEvent,
    TaskRow,
    ToolCallRow,
    ToolRunRow,
    TxOutcome,
    WriteTx,
)
from halfpi.store.sqlite_schema import SCHEMA, connect, open_database

__all__ = ["SCHEMA", "SQLiteStore"]

T = TypeVar("T")

# The most writes one group commit takes.
MAX_BATCH = 4096

_STOP = object()


class SQLiteStore:
    """The default :class:`~halfpi.store.base.Store`. ``own_folder``: the
    database's folder is its own (the home) and is made 0700; otherwise an
    existing folder keeps its mode (see ``prepare_private``)."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "FULL",
        readers: int = 2,
        own_folder: bool = True,
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self.own_folder = own_folder
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Writes of this turn of the loop, handed to the writer together at
        # its end (one queue item, one wake-up): see ``write``.
        self._turn: list[tuple[WriteTx, asyncio.Future[TxOutcome]]] = []
        self._writer: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="halfpi-sqlite-read")
        self._local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        # The loop thread's own connection, for point reads on the hot path
        # (the registry's lookup of a request key): see ``get_request``.
        self._here: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.batches = 0  # commits made, for tests and metrics
        # Time of each group commit (written by the writer thread only).
        self.commit_seconds = Histogram(COMMIT_BUCKETS)
        # Did the database refuse the last group commit (a full disk, an I/O
        # error)? Written by the writer thread; ``/readyz`` reads it.
        self.last_commit_failed = False
        self.closed = False

    # lifecycle

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        conn = open_database(self.path, synchronous=self.synchronous, own_folder=self.own_folder)
        self._writer = threading.Thread(
            target=self._writer_main, args=(conn,), name="halfpi-sqlite-writer", daemon=True
        )
        self._writer.start()
        here = connect(self.path, synchronous=self.synchronous)
        here.execute("PRAGMA busy_timeout=0")  # never wait on the loop: a thread does
        self._here = here

    async def close(self) -> None:
        """Commit everything queued, then stop the writer and readers."""
        if self.closed:
            return
        self.closed = True
        self._hand_over()
        self._queue.put(_STOP)
        if self._writer is not None:
            await asyncio.to_thread(self._writer.join)
        self._readers.shutdown(wait=True)
        if self._here is not None:
            self._here.close()
            self._here = None
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
        turn = self._turn
        turn.append((tx, future))
        if len(turn) == 1:
            # Handed over once this turn's callbacks ran: a hundred chats
            # admitted in one turn go into one commit, not a first commit of
            # one and a second of the rest (docs/performance.md, "Durable
            # chats"). Costs at most one turn of the loop.
            self._loop.call_soon(self._hand_over)
        return future

    def _hand_over(self) -> None:
        if self._turn:
            turn, self._turn = self._turn, []
            self._queue.put(turn)

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
            batch = list(item)  # one turn's writes
            while len(batch) < MAX_BATCH:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                batch.extend(nxt)
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
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            for tx, future in batch:
                if not careful and tx.only_events:
                    merged.extend(tx.events)
                    outcomes.append((future, COMMITTED))
                    continue
                _insert_merged(conn, merged)
                outcomes.append((future, _in_savepoint(conn, partial(sql.apply_tx, conn, tx))))
            _insert_merged(conn, merged)
            conn.execute("COMMIT")
            self.batches += 1
            self.commit_seconds.observe(time.perf_counter() - started)
            self.last_commit_failed = False
        except _RetryCarefully:
            conn.execute("ROLLBACK")
            raise
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            failure = StoreError(f"commit failed: {exc}")
            outcomes = [(future, failure) for _, future in batch]
            self.last_commit_failed = True
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

    async def _read(self, fn: Callable[[sqlite3.Connection], T], *, doing: str = "read") -> T:
        """Run ``fn`` on a reader thread's connection; a driver error becomes
        a StoreError (our own errors, such as LabelInUse, pass as they are)."""

        def run() -> T:
            try:
                return fn(self._reader())
            except sqlite3.Error as exc:
                raise StoreError(f"{doing} failed: {exc}") from exc

        assert self._loop is not None
        return await self._loop.run_in_executor(self._readers, run)

    async def _read_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A point read answered on the loop's thread from SQLite's page
        cache — a few µs, where a reader thread costs two hops and the GIL
        twice (docs/performance.md, "Durable chats"). Should the database
        be busy (WAL recovery), a reader thread waits for it instead."""
        here = self._here
        if here is not None:
            try:
                return fn(here)
            except sqlite3.OperationalError:
                pass  # busy: wait for it on a reader thread, not on the loop
            except sqlite3.Error as exc:
                raise StoreError(f"read failed: {exc}") from exc
        return await self._read(fn)

    async def get_request(
        self, principal_id: str, request_id: str
    ) -> RequestRecord | Tombstone | None:
        """Every command's first read (the registry, I5): two primary-key probes."""
        return await self._read_here(
            partial(sql.lookup_request, principal_id=principal_id, request_id=request_id)
        )

    async def prune_requests(self, now: float, retention: RequestRetention) -> int:
        """Move terminal records past retention to tombstones; expire old tombstones."""
        # Pruning writes, but rarely: it runs on a reader thread with its own
        # BEGIN IMMEDIATE so it never holds up the group-commit writer's queue.
        return await self._read(
            partial(sql.prune_requests, now=now, retention=retention), doing="pruning"
        )

    async def get_conversation(self, conversation_id: str) -> ConversationRow | None:
        return await self._read(partial(sql.conversation, conversation_id=conversation_id))

    async def list_conversations(self, limit: int, before: str | None) -> list[ConversationRow]:
        return await self._read(partial(sql.conversations, limit=limit, before=before))

    async def head_seq(self, conversation_id: str) -> int:
        return await self._read(partial(sql.head_seq, conversation_id=conversation_id))

    async def fence_of(self, conversation_id: str) -> int:
        return 0  # one Mind per home: nothing to fence

    async def messages(
        self, conversation_id: str, *, limit: int, before_seq: int | None, max_seq: int | None
    ) -> MessagePage:
        bounds = [b for b in (before_seq, None if max_seq is None else max_seq + 1) if b]
        upper = min(bounds) if bounds else None
        return await self._read(
            partial(sql.message_page, conversation_id=conversation_id, limit=limit, upper=upper)
        )

    async def chat_run_for_request(
        self, conversation_id: str, request_id: str, principal_id: str | None = None
    ) -> ChatRunRow | None:
        return await self._read(
            partial(
                sql.chat_run_for_request,
                conversation_id=conversation_id,
                request_id=request_id,
                principal_id=principal_id,
            )
        )

    async def tool_history(
        self, conversation_id: str, *, max_seq: int, limit: int
    ) -> list[ToolCallRow]:
        return await self._read(
            partial(
                sql.tool_history, conversation_id=conversation_id, max_seq=max_seq, limit=limit
            )
        )

    async def get_approval(self, approval_id: str) -> ApprovalRow | None:
        return await self._read(partial(sql.approval, approval_id=approval_id))

    async def get_tool_run(self, run_id: str) -> ToolRunRow | None:
        return await self._read(partial(sql.tool_run, run_id=run_id))

    async def get_task(self, task_id: str) -> TaskRow | None:
        return await self._read(partial(sql.task, task_id=task_id))

    async def task_for_delivery(self, delivery_id: str) -> TaskRow | None:
        return await self._read(partial(sql.task_for_delivery, delivery_id=delivery_id))

    async def list_tasks(
        self,
        *,
        limit: int,
        before: str | None = None,
        conversation_id: str | None = None,
        hand_id: str | None = None,
        states: Sequence[str] | None = None,
    ) -> list[TaskRow]:
        return await self._read(
            partial(
                sql.list_tasks,
                limit=limit,
                before=before,
                conversation_id=conversation_id,
                hand_id=hand_id,
                states=None if states is None else list(states),
            )
        )

    async def due_tasks(self, now: float, limit: int) -> list[TaskRow]:
        return await self._read(partial(sql.due_tasks, now=now, limit=limit))

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
        return await self._read(
            partial(
                sql.events, conversation_id=conversation_id, after_seq=after_seq, limit=limit
            )
        )

    # credentials: rare writes, each in its own transaction on a reader thread

    async def credentials(self) -> list[Credential]:
        return await self._read(sql.credentials)

    async def credentials_version(self) -> int:
        """Read four times a second by the maintenance round (I8) and by
        handshakes: one row, on the loop's thread (``_read_here``)."""
        return await self._read_here(sql.credentials_version)

    async def add_credential(self, credential: Credential) -> None:
        await self._read(partial(sql.add_credential, c=credential), doing="adding a credential")

    async def revoke_credential(self, kind: str, label: str, now: float) -> bool:
        return await self._read(
            partial(sql.revoke_credential, kind=kind, label=label, now=now),
            doing="revoking a credential",
        )


class _RetryCarefully(Exception):
    """A merged append failed; the batch must be redone write by write."""


# What a write can do wrong on its own (a constraint, a bad value): it fails
# alone. Anything else is the database refusing to write at all (a full disk,
# an I/O error, a lock held too long): the whole group commit fails.
_A_WRITES_OWN_FAULT = (
    sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError, sqlite3.InterfaceError
)


def _insert_merged(conn: sqlite3.Connection, merged: list[StoredEvent]) -> None:
    """Insert the merged appends; a write's own fault (a constraint) sends
    the batch to be redone carefully, a refusal of the database itself (a
    full disk) fails the whole batch."""
    if merged:
        try:
            sql.insert_events(conn, merged)
        except _A_WRITES_OWN_FAULT as exc:
            raise _RetryCarefully from exc
        merged.clear()


def _in_savepoint(
    conn: sqlite3.Connection, work: Callable[[], object]
) -> TxOutcome | BaseException:
    """Run ``work`` so that its failure undoes only itself, not the batch.
    Only a write's own fault (``_A_WRITES_OWN_FAULT``) is its alone: when the
    database refuses to write at all (a full disk, an I/O error) the batch fails."""
    conn.execute("SAVEPOINT tx")
    try:
        result = work()
        conn.execute("RELEASE tx")
    except _A_WRITES_OWN_FAULT as exc:
        conn.execute("ROLLBACK TO tx")
        conn.execute("RELEASE tx")
        if sql.is_terminal_refusal(exc):
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
