"""How a routes module of the HTTP door describes its routes for the OpenAPI
document (``openapi.py``): plain values, no I/O.

Each routes module exposes ``describe() -> list[Operation]``; the document
is made from every module's list, so a new route is documented where it is
declared. Schemas are the wire's own msgspec types (``core/wire.py``,
``core/events.py``) wherever one exists; a raw JSON Schema ``dict`` is
allowed for what has no struct (an event stream, a comma-separated list).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from halfpi.errors import ErrorCode

# A msgspec-describable type, or a raw JSON Schema.
Schema = Any

# Every route that authenticates can answer these (door.py): a missing or
# dead token, an Origin or a scope refused, a throttled address, a Mind
# that is starting or draining, and a bug.
AUTHENTICATED_ERRORS = frozenset(
    {
        ErrorCode.UNAUTHORIZED,
        ErrorCode.FORBIDDEN,
        ErrorCode.RATE_LIMITED,
        ErrorCode.UNAVAILABLE,
        ErrorCode.INTERNAL_ERROR,
    }
)


@dataclass(frozen=True)
class Parameter:
    name: str
    where: str  # "path" | "query" | "header"
    schema: Schema
    required: bool = False
    description: str = ""


@dataclass(frozen=True)
class Body:
    """A request or response body: a media type and its schema (an empty
    media type: no body, as a 204 has)."""

    schema: Schema
    description: str = ""
    media_type: str = "application/json"


@dataclass(frozen=True)
class Operation:
    method: str  # "get" | "post" | "options"
    path: str
    operation_id: str
    summary: str
    tag: str
    description: str = ""
    parameters: tuple[Parameter, ...] = ()
    body: Body | None = None
    body_required: bool = False
    responses: dict[int, Body] = field(default_factory=dict)
    # Stable codes this route may answer (each documented under the status
    # door.STATUS gives it), besides AUTHENTICATED_ERRORS for a non-public one.
    errors: frozenset[ErrorCode] = frozenset()
    # An error whose status is not door.STATUS's (e.g. 404 for an unknown command).
    extra_errors: tuple[tuple[int, ErrorCode], ...] = ()
    public: bool = False  # served without a bearer token


def preflight(path: str, operation_id: str, tag: str,
              parameters: tuple[Parameter, ...] = ()) -> Operation:
    """The CORS preflight of ``path`` (docs/protocol.md §17.5)."""
    return Operation(
        method="options", path=path, operation_id=operation_id,
        summary="A browser's CORS preflight (an allowed Origin only)", tag=tag,
        parameters=parameters, public=True,
        responses={204: Body({}, "allowed: Access-Control-Allow-* headers", "")},
        errors=frozenset({ErrorCode.FORBIDDEN}),
    )
