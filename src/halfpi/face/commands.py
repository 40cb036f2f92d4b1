"""The commands a Face sends, as the Mind reads them (``core/wire.py``).

The SDK never builds a command dict by hand: every command is one of the
Mind's own frozen structs (``wire.Chat``, ``wire.Subscribe`` …), so a field
the Mind would refuse is a type error here, and both sides agree on names
by construction (h11 shares its events between client and server).

On the wire a field at its default is left out, as msgspec's
``omit_defaults`` does: a resubscribe carries ``since`` and no
``snapshot: false``, a ping is ``{}`` — what the Mind reads as the default
anyway (docs/protocol.md §5).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

import msgspec

from halfpi.core import wire
from halfpi.core.events import Error
from halfpi.errors import InvalidRequest
from halfpi.face.errors import CommandError

# A command's struct → its ``type`` on the wire (one struct per type).
TYPE_OF: dict[type[wire.Strict], str] = {cls: name for name, cls in wire.COMMANDS.items()}

_counter = itertools.count(1)

# Every command that carries a ``request_id`` (all but the hello; a ping's is optional).
Body = wire.Command | wire.Ping


def type_of(body: wire.Strict) -> str:
    """The ``type`` a command struct is sent as."""
    return TYPE_OF[type(body)]


def payload_of(body: wire.Strict) -> dict[str, Any]:
    """The command's ``payload``: every field, except those at their default."""
    payload: dict[str, Any] = {}
    for f in msgspec.structs.fields(body):
        value = getattr(body, f.name)
        if f.default is not msgspec.NODEFAULT and _same(value, f.default):
            continue
        payload[f.encode_name] = msgspec.to_builtins(value)
    return payload


def encode(body: wire.Strict) -> str:
    """The frame that carries ``body``: ``{"type": …, "payload": …}``."""
    frame = {"type": type_of(body), "payload": payload_of(body)}
    return msgspec.json.encode(frame).decode()


def command_of(type_: str, payload: Mapping[str, Any]) -> Body:
    """A command given as plain data (a script's line, ``FaceClient.request``)
    as its struct, checked as the Mind checks it: a command the Mind would
    refuse raises the :class:`~halfpi.face.errors.CommandError` it would
    answer (``invalid_request``, naming the field), and is never sent."""
    rid = payload.get("request_id")
    try:
        _, body = wire.decode_command(msgspec.json.encode({"type": type_, "payload": payload}))
    except InvalidRequest as exc:
        raise _invalid(exc.message, exc.field, rid) from None
    if not isinstance(body, Body):
        raise _invalid(f"{type_} is not a command a Face sends", "type", rid)
    return body


def _invalid(message: str, field: str | None, request_id: Any) -> CommandError:
    return CommandError(
        Error(
            code="invalid_request",
            message=message,
            retryable=False,
            request_id=request_id if isinstance(request_id, str) else msgspec.UNSET,
            field=msgspec.UNSET if field is None else field,
        )
    )


def new_request_id(prefix: str = "q") -> str:
    """A fresh ``request_id``: random (no two Faces collide) and counted."""
    return f"{prefix}-{os.urandom(6).hex()}-{next(_counter)}"


def new_id_for(type_: str) -> str:
    """A fresh request_id named after its command (``chat-…``, ``list-…``)."""
    return new_request_id(type_.rsplit(".", 1)[-1][:4])


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and bool(value == default)
