"""The Hand's book of background tasks (DESIGN §8): the authority for their state.

One SQLite file in the Hand's state folder (``tasks.db``, 0600) and one log
file per task (``tasks/<task_id>.log``, 0600, at most ``LOG_BYTES``):

- every delivery id the Hand accepted, with the digest of what it asked for
  and the receipt it was given, so a redelivery — after a lost answer, a
  Mind restart, a Hand restart — gets the same receipt back
  (``deduplicated``) and never a second task, and another payload under the
  same id is ``delivery_conflict`` (rules: ``core/tasks.py``);
- every task's state, moved only as ``core.states.TASK`` allows, the first
  terminal state winning (a cancel racing a completion converges);
- on opening, every task that had not finished is marked ``lost``: whatever
  ran it died with the previous process, and a task is never re-run.

Every write is one transaction, committed before the call returns: what a
receipt says is on disk before the Mind hears it.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from halfpi.core.states import TASK
from halfpi.core.tasks import LOG_BYTES, Receipt, judge_delivery, settle, task_digest
from halfpi.errors import DeliveryConflict, ErrorCode, NotFound

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    task_id TEXT NOT NULL UNIQUE,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    delivery_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT NOT NULL,
    timeout_s REAL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    error TEXT,
    log_bytes INTEGER NOT NULL DEFAULT 0,
    log_truncated INTEGER NOT NULL DEFAULT 0
);
"""
LOG_DIR = "tasks"
TRUNCATED = (b"\n[halfpi: the log reached its limit; the task runs on, "
             b"its output is no longer kept]\n")


@dataclass(frozen=True, slots=True)
class TaskRecord:
    task_id: str
    delivery_id: str
    tool: str
    args: Any
    timeout_s: float | None
    state: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    error: str | None
    log_bytes: int
    log_truncated: bool


@dataclass(frozen=True, slots=True)
class LogPage:
    data: bytes
    next_offset: int
    truncated: bool  # the log stopped keeping output at LOG_BYTES


class TaskBook:
    def __init__(self, state_dir: Path, *, log_limit: int = LOG_BYTES) -> None:
        self.state_dir = state_dir
        self.log_limit = log_limit
        self.logs = state_dir / LOG_DIR
        self.db: sqlite3.Connection | None = None

    # -- lifecycle --------------------------------------------------------------------

    def open(self, now: float) -> list[str]:
        """Open (or create) the book; mark what was unfinished ``lost`` and
        return those task ids (the Hand tells the Mind)."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.logs.mkdir(exist_ok=True, mode=0o700)
        path = self.state_dir / "tasks.db"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        unfinished = [
            row[0] for row in self.db.execute(
                "SELECT task_id FROM tasks WHERE state IN ('queued', 'running') ORDER BY created_at"
            )
        ]
        with self._tx() as db:
            for task_id in unfinished:
                db.execute(
                    "UPDATE tasks SET state = 'lost', ended_at = ?, error = ? WHERE task_id = ?",
                    (now, "the Hand restarted while the task was unfinished", task_id),
                )
        return unfinished

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    # -- deliveries -------------------------------------------------------------------

    def deliver(
        self, delivery_id: str, tool: str, args: Any, timeout_s: float | None, now: float
    ) -> Receipt:
        """Accept a delivery: a new task (``queued``), or the original receipt
        for a redelivery; ``DeliveryConflict`` for another payload."""
        digest = task_digest(tool, args, timeout_s)
        with self._tx() as db:
            known = db.execute(
                "SELECT digest, task_id, received_at FROM deliveries WHERE delivery_id = ?",
                (delivery_id,),
            ).fetchone()
            judged = judge_delivery(known[0] if known else None, digest)
            if judged == "conflict":
                raise DeliveryConflict(
                    f"delivery {delivery_id[:64]} was already given with another payload",
                    field="delivery_id",
                )
            if judged == "duplicate":
                task_id, received_at = known[1], known[2]
                state = db.execute("SELECT state FROM tasks WHERE task_id = ?",
                                   (task_id,)).fetchone()[0]
                return Receipt(delivery_id, task_id, state, True, received_at)
            task_id = "t_" + secrets.token_hex(12)
            db.execute(
                "INSERT INTO deliveries (delivery_id, digest, task_id, received_at) "
                "VALUES (?, ?, ?, ?)",
                (delivery_id, digest, task_id, now),
            )
            db.execute(
                "INSERT INTO tasks (task_id, delivery_id, tool, args, timeout_s, state, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (task_id, delivery_id, tool, msgspec.json.encode(args).decode(), timeout_s,
                 TASK.initial, now),
            )
        return Receipt(delivery_id, task_id, TASK.initial, False, now)

    # -- state --------------------------------------------------------------------------

    def move(
        self, task_id: str, state: str, now: float, *, exit_code: int | None = None,
        error: str | None = None,
    ) -> bool:
        """Move a task to ``state``; False when it had already ended (the
        first terminal state stands); IllegalTransition for a move the
        table does not have."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if row is None:
                raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")
            if not settle(row[0], state):
                return False
            if state == "running":
                db.execute("UPDATE tasks SET state = ?, started_at = ? WHERE task_id = ?",
                           (state, now, task_id))
            else:
                db.execute(
                    "UPDATE tasks SET state = ?, ended_at = ?, exit_code = ?, error = ? "
                    "WHERE task_id = ?",
                    (state, now, exit_code, error, task_id),
                )
        return True

    def get(self, task_id: str) -> TaskRecord | None:
        row = self._db().execute(f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ?",
                                 (task_id,)).fetchone()
        return None if row is None else _record(row)

    def tasks(self) -> list[TaskRecord]:
        """Every task, oldest first."""
        rows = self._db().execute(f"SELECT {_COLUMNS} FROM tasks ORDER BY created_at, task_id")
        return [_record(row) for row in rows]

    # -- the log ------------------------------------------------------------------------

    def append_log(self, task_id: str, data: bytes) -> int:
        """Keep ``data`` in the task's log up to the limit; returns the bytes
        kept. Past the limit one marker says so, and nothing more is kept."""
        record = self.get(task_id)
        if record is None:
            raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")
        if record.log_truncated or not data:
            return 0
        room = self.log_limit - record.log_bytes
        kept = data[: max(0, room)]
        truncated = len(kept) < len(data)
        fd = os.open(self._log_path(task_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, kept + (TRUNCATED if truncated else b""))
        finally:
            os.close(fd)
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET log_bytes = log_bytes + ?, log_truncated = ? WHERE task_id = ?",
                (len(kept), int(truncated), task_id),
            )
        return len(kept)

    def read_log(self, task_id: str, offset: int, limit: int) -> LogPage:
        record = self.get(task_id)
        if record is None:
            raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")
        path = self._log_path(task_id)
        if not path.exists():
            return LogPage(b"", offset, record.log_truncated)
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(limit)
        return LogPage(data, offset + len(data), record.log_truncated)

    # -- helpers ------------------------------------------------------------------------

    def _log_path(self, task_id: str) -> Path:
        if not task_id.startswith("t_") or not task_id[2:].isalnum():
            raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")
        return self.logs / f"{task_id}.log"

    def _db(self) -> sqlite3.Connection:
        if self.db is None:
            raise RuntimeError("the task book is not open")
        return self.db

    def _tx(self) -> _Transaction:
        return _Transaction(self._db())


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on an error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


_COLUMNS = ("task_id, delivery_id, tool, args, timeout_s, state, created_at, started_at, "
            "ended_at, exit_code, error, log_bytes, log_truncated")


def _record(row: tuple[Any, ...]) -> TaskRecord:
    return TaskRecord(
        task_id=row[0], delivery_id=row[1], tool=row[2], args=msgspec.json.decode(row[3]),
        timeout_s=row[4], state=row[5], created_at=row[6], started_at=row[7], ended_at=row[8],
        exit_code=row[9], error=row[10], log_bytes=row[11], log_truncated=bool(row[12]),
    )
