"""What the headless face reads and says in words: a stdin line as a
command, a failed connection attempt as a reason. Plain functions, so the
sentences a person reads are tested without a Mind."""

from __future__ import annotations

import errno
import json
import socket
from typing import Any

from halfpi.face.transport import ConnectionLost

COMMAND_SHAPE = '{"type": "face.chat", "payload": {"content": "hi"}}'


def parse_command(line: str) -> tuple[str, dict[str, Any]]:
    """One stdin line as (type, payload); ValueError: one sentence for a
    person saying what is wrong (never Python's own words)."""
    try:
        frame = json.loads(line)
    except ValueError:
        raise ValueError(f"not JSON (one command per line, e.g. {COMMAND_SHAPE})") from None
    if not isinstance(frame, dict):
        raise ValueError(f"not a JSON object (a command is e.g. {COMMAND_SHAPE})")
    type_, payload = frame.get("type"), frame.get("payload") or {}
    if not isinstance(type_, str) or not type_:
        raise ValueError(f'no "type" naming the command (e.g. {COMMAND_SHAPE})')
    if not isinstance(payload, dict):
        raise ValueError('its "payload" is not a JSON object')
    extra = sorted(set(frame) - {"type", "payload"})
    if extra:
        raise ValueError(f'unknown field "{extra[0]}": a command has only "type" and "payload"')
    return type_, dict(payload)


def describe_failure(exc: ConnectionLost) -> str:
    """Why a connection attempt failed, for a person (the underlying error
    is kept as the exception's context by the transport)."""
    cause = exc.__context__
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host ({cause.strerror or cause})"
    refused = f"[Errno {errno.ECONNREFUSED}]"
    if isinstance(cause, ConnectionRefusedError) or (
        isinstance(cause, OSError) and refused in str(cause)
    ):
        return "connection refused: nothing listens there (is `halfpi mind` running?)"
    if isinstance(cause, TimeoutError):
        return "no answer in time"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return exc.reason or str(exc)
