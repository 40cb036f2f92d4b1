"""The processes' logs: plain lines or JSON lines (``--log-format``).

A JSON line carries ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
``message``, and, when known, ``conversation_id``, ``request_id`` and
``run_id``: from the record's ``extra``, else from the context a command
runs in (:func:`bind`, set by ``mind/api.py`` for each command and by the
chat driver for its run; a task started there inherits it).

What is never logged (docs/operations.md, "Logs"): a token, a stream
ticket, a key, a tool call's arguments or output. halfpi's own lines say
none of these; the libraries underneath would at DEBUG (a WebSocket
library prints frames, hello tokens included; an HTTP client prints
request bodies), so they stay at WARNING whatever ``--log-level`` says.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime

FORMATS = ("text", "json")
IDS = ("conversation_id", "request_id", "run_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Libraries whose DEBUG lines may carry frames, headers or bodies.
QUIET = ("websockets", "uvicorn", "httpx", "httpcore", "openai", "asyncpg", "redis", "hpack")

_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "halfpi_log_context", default=None
)


def bind(**ids: str | None) -> contextvars.Token[dict[str, str] | None]:
    """Name the ids of what runs from here in this context (and in tasks
    started from it); ``unbind`` with the token returned."""
    current = _context.get()
    merged = dict(current) if current else {}
    merged.update({key: value for key, value in ids.items() if isinstance(value, str)})
    return _context.set(merged)


def unbind(token: contextvars.Token[dict[str, str] | None]) -> None:
    _context.reset(token)


def context() -> dict[str, str]:
    return dict(_context.get() or {})


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_context.get() or {})
        for key in IDS:
            value = getattr(record, key, None)
            if isinstance(value, str):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level`` (``debug``…``critical``) as ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    floor = max(root.level, logging.WARNING)
    for name in QUIET:
        logging.getLogger(name).setLevel(floor)
