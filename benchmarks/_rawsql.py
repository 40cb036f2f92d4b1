"""Plain ``sqlite3`` writing the rows a halfpi chat writes: the durable baselines.

A chat's admission is one transaction (the request record, the user's
message, the run, ``chat.message`` and ``chat.started``; DESIGN §5) and its
end another (``chat.completed``, the assistant's message, the run's final
state, the request's result). halfpi applies each inside a SAVEPOINT of a
group commit; so does this, with the same schema (``SCHEMA`` from
``halfpi.store``), the same PRAGMAs and rows of the same sizes, and nothing
else: no futures, no threads, no event loop. Used by ``append.py`` (many
chats per commit) and by ``_raw_server.py`` (one chat, in the fan-out's
whole-chat baseline).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from halfpi.store.sqlite import SCHEMA

PRINCIPAL = "p_bench"
_LOOKUP = "SELECT status FROM requests WHERE principal_id = ? AND request_id = ?"
_REQUEST = (
    "INSERT INTO requests (principal_id, request_id, type, digest, status, conversation_id,"
    " run_id, accepted, result, created_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_MESSAGE = (
    "INSERT INTO messages (conversation_id, seq, role, content, request_id, status, ts)"
    " VALUES (?,?,?,?,?,?,?)"
)
_RUN = (
    "INSERT INTO runs (run_id, conversation_id, request_id, principal_id, status, started_at,"
    " finished_at, content, error_code) VALUES (?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT (run_id) DO UPDATE SET status = excluded.status,"
    " finished_at = excluded.finished_at, content = excluded.content,"
    " error_code = excluded.error_code"
)
_EVENT = "INSERT INTO events (conversation_id, seq, type, data, ts) VALUES (?,?,?,?,?)"
# A run's outcome carries the run it ends, under a unique index (I10), as halfpi stores it.
_END_EVENT = (
    "INSERT INTO events (conversation_id, seq, type, data, ts, terminal_of) VALUES (?,?,?,?,?,?)"
)
_FINISH = (
    "UPDATE requests SET status = ?, result = ?, finished_at = ?"
    " WHERE principal_id = ? AND request_id = ? AND finished_at IS NULL"
)
DIGEST = "0" * 64


def open_db(path: Path, synchronous: str = "FULL") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.executescript(SCHEMA)
    return conn


def add_conversation(conn: sqlite3.Connection, conversation_id: str, now: float) -> None:
    conn.execute(
        "INSERT INTO conversations (conversation_id, name, created_at, created_by)"
        " VALUES (?,?,?,?)",
        (conversation_id, "bench", now, PRINCIPAL),
    )


class Chat:
    """One chat's identifiers and its first seq (``chat.message``)."""

    __slots__ = ("content", "conversation_id", "request_id", "run_id", "seq")

    def __init__(
        self, conversation_id: str, request_id: str, run_id: str, seq: int, content: str
    ) -> None:
        self.conversation_id = conversation_id
        self.request_id = request_id
        self.run_id = run_id
        self.seq = seq
        self.content = content


def admit(conn: sqlite3.Connection, chat: Chat, now: float) -> None:
    """The admission rows (call inside a transaction)."""
    c, r = chat.conversation_id, chat.request_id
    conn.execute("SAVEPOINT admit")
    if conn.execute(_LOOKUP, (PRINCIPAL, r)).fetchone() is not None:
        raise RuntimeError(f"request {r} exists")
    accepted = json.dumps(
        {
            "request_id": r,
            "operation": "chat",
            "conversation_id": c,
            "run_id": chat.run_id,
            "cursor": f"e1.{chat.seq + 1}",
        }
    )
    conn.execute(
        _REQUEST, (PRINCIPAL, r, "face.chat", DIGEST, "accepted", c, chat.run_id, accepted, None,
                   now, None)
    )
    conn.execute(_MESSAGE, (c, chat.seq, "user", chat.content, r, None, now))
    conn.execute(_RUN, (chat.run_id, c, r, PRINCIPAL, "running", now, None, None, None))
    conn.executemany(
        _EVENT,
        [
            (c, chat.seq, "chat.message",
             json.dumps({"request_id": r, "role": "user", "content": chat.content}), now),
            (c, chat.seq + 1, "chat.started",
             json.dumps({"request_id": r, "run_id": chat.run_id}), now),
        ],
    )
    conn.execute("RELEASE admit")


def complete(conn: sqlite3.Connection, chat: Chat, end_seq: int, content: str,
             now: float) -> None:
    """The rows of a successful end (call inside a transaction)."""
    c, r = chat.conversation_id, chat.request_id
    conn.execute("SAVEPOINT finish")
    data: dict[str, Any] = {
        "request_id": r, "run_id": chat.run_id, "status": "succeeded", "content": content,
    }
    conn.execute(_END_EVENT, (c, end_seq, "chat.completed", json.dumps(data), now,
                              f"chat:{chat.run_id}"))
    conn.execute(_MESSAGE, (c, end_seq, "assistant", content, r, "succeeded", now))
    conn.execute(_RUN, (chat.run_id, c, r, PRINCIPAL, "succeeded", now, now, content, None))
    result = {
        "request_id": r,
        "status": "succeeded",
        "content": content,
        "data": {"conversation_id": c, "run_id": chat.run_id, "cursor": f"e1.{end_seq}"},
    }
    conn.execute(_FINISH, ("succeeded", json.dumps(result), now, PRINCIPAL, r))
    conn.execute("RELEASE finish")


def commit(conn: sqlite3.Connection, work: Any) -> None:
    """``work()`` inside ``BEGIN IMMEDIATE … COMMIT``."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        work()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
