"""REST reads (DESIGN §9, docs/protocol.md §18): GET routes over the read commands.

Each route is one read command of the Face protocol, run through the Mind
API for a one-shot caller, as ``POST /v1/commands/{type}`` runs it; only
the shape differs: query parameters instead of a JSON body, and the
answer is the result's ``data`` (or the snapshot) itself. So the rules are
the WebSocket's: the same scope per command (I8), the same paging, the
same detail mode — an observer sees summaries and may not ask for
``transparent`` (I9, ``commands.detail_mode_for``).

:data:`READS` is the table of routes (path, command, query parameters):
the routes and the OpenAPI document are made from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

import msgspec
from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from halfpi.core import wire
from halfpi.core.events import (
    ApprovalPage,
    ConversationPage,
    Error,
    HandPage,
    MessagePage,
    Outbound,
    Result,
    Snapshot,
    Welcome,
)
from halfpi.errors import ErrorCode, HalfpiError, InternalError, InvalidRequest
from halfpi.gateway.http import spec
from halfpi.gateway.http.commands import (
    NO_STORE,
    answer,
    decode,
    fresh_request_id,
    guarded,
    one_shot,
)
from halfpi.gateway.http.door import Door, preflight
from halfpi.mind import api
from halfpi.mind.connection import Final

if TYPE_CHECKING:
    pass

log = logging.getLogger("halfpi.gateway.http")


@dataclass(frozen=True)
class Param:
    """A query parameter: its name, the payload field it fills, its kind."""

    name: str
    field: str
    integer: bool = False
    description: str = ""


@dataclass(frozen=True)
class Read:
    path: str
    type: str  # the read command it runs
    summary: str
    params: tuple[Param, ...] = ()
    path_field: dict[str, str] = field(default_factory=dict)  # {id} → payload field


READS: tuple[Read, ...] = (
    Read(
        "/v1/conversations",
        "face.conversation.list",
        "Conversations, newest first, a page at a time",
        (
            Param("limit", "limit", True, "page size, 1 to 200 (default 50)"),
            Param("before", "before", False, "the last conversation id of the previous page"),
        ),
    ),
    Read(
        "/v1/conversations/{conversation_id}",
        "face.conversation.snapshot",
        "A conversation's snapshot (DESIGN §4.1)",
        (
            Param("detail", "detail_mode", False,
                  "transparent or summary; observers: summary only (default: the profile's)"),
            Param("messages_limit", "messages_limit", True, "the last N messages, 1 to 500"),
        ),
        {"conversation_id": "conversation_id"},
    ),
    Read(
        "/v1/conversations/{conversation_id}/messages",
        "face.conversation.messages",
        "A page of a conversation's messages, older than a seq",
        (
            Param("before", "before_seq", True, "only messages with a smaller seq"),
            Param("limit", "limit", True, "page size, 1 to 500 (default 50)"),
        ),
        {"conversation_id": "conversation_id"},
    ),
    Read("/v1/approvals", "face.approval.list",
         "Approvals waiting for a decision, across conversations (summaries)"),
    Read("/v1/hands", "face.hand.list", "Hands connected to this Mind"),
)

# A whole number in a query string: at most 2**53 - 1 (what every JSON
# reader holds exactly); a field's own bounds (core/wire.py) apply within.
MAX_QUERY_INT = 2**53 - 1
MAX_QUERY_DIGITS = len(str(MAX_QUERY_INT))

DEFAULTS = {"face.conversation.messages": {"limit": 50}}


class ReadRoute:
    def __init__(self, door: Door, read: Read) -> None:
        self.door = door
        self.read = read

    def payload(self, request: Request) -> dict[str, object]:
        """The read command's payload from the path and the query."""
        raw: dict[str, object] = dict(DEFAULTS.get(self.read.type, {}))
        known = {p.name: p for p in self.read.params}
        for name, value in request.query_params.items():
            param = known.get(name)
            if param is None:
                raise InvalidRequest(f"unknown query parameter {name[:64]!r}", field=name[:64])
            if param.integer:
                # Digits first, then at most MAX_QUERY_DIGITS of them: int() of
                # thousands of digits raises (Python's int_max_str_digits).
                if not (value.isascii() and value.isdigit() and len(value) <= MAX_QUERY_DIGITS
                        and int(value) <= MAX_QUERY_INT):
                    raise InvalidRequest(
                        f"{name} is a whole number up to {MAX_QUERY_INT}", field=name
                    )
                raw[param.field] = int(value)
            else:
                raw[param.field] = value
        for name, payload_field in self.read.path_field.items():
            raw[payload_field] = request.path_params[name]
        raw["request_id"] = fresh_request_id()
        return raw

    def field_name(self, payload_field: str | None) -> str | None:
        """A payload field as the client named it (a query parameter)."""
        for param in self.read.params:
            if param.field == payload_field:
                return param.name
        return payload_field

    async def get(self, request: Request) -> Response:
        if request.method == "OPTIONS":  # a page on another Origin asks first (§17.5)
            return preflight(self.door, request, "GET")
        response = await guarded(f"read {self.read.type}", lambda: self.run(request))
        response.headers.update(self.door.cors(request))
        return response

    async def run(self, request: Request) -> Response:
        type_ = self.read.type
        mind = self.door.mind()
        credential = await self.door.credential(request)
        api.authorize(credential.scopes, type_)  # I8: as the credential is now
        try:
            payload = decode(type_, self.payload(request))
        except InvalidRequest as exc:
            raise InvalidRequest(exc.message, field=self.field_name(exc.field)) from None
        with one_shot(mind, credential) as caller:
            try:
                await api.handle(mind, caller.conn, type_, payload)
            except HalfpiError as exc:
                exc.field = self.field_name(exc.field)
                raise
            reply = caller.final()
            if reply is None:
                raise InternalError(f"{type_} sent no reply")
            return self.answer(reply)

    @staticmethod
    def answer(reply: Final) -> Response:
        """A result's ``data``, or the snapshot without the request_id it answered."""
        value: object
        if isinstance(reply, Error):
            return answer(reply)
        if isinstance(reply, Result):
            value = {} if reply.data is UNSET else reply.data
        elif isinstance(reply, Snapshot):
            value = msgspec.structs.replace(reply, request_id=UNSET)
        else:
            value = reply
        return Response(msgspec.json.encode(value), media_type="application/json",
                        headers=NO_STORE)


WELCOME_PATH = "/v1/welcome"


def welcome_route(door: Door) -> Route:
    """``GET /v1/welcome``: what a WebSocket's ``face.welcome`` tells its
    Face — who this bearer is (profile, scopes), which commands are
    replay-safe, the limits and the heartbeat — for a client that speaks
    only HTTP (the web face reads it at sign-in)."""

    async def welcome(request: Request) -> Response:
        if request.query_params:
            name = next(iter(request.query_params))[:64]
            raise InvalidRequest(f"unknown query parameter {name!r}", field=name)
        credential = await door.credential(request)
        body = msgspec.json.encode(api.welcome(door.mind(), credential))
        return Response(body, media_type="application/json", headers=NO_STORE)

    async def get(request: Request) -> Response:
        if request.method == "OPTIONS":
            return preflight(door, request, "GET")
        response = await guarded("welcome", lambda: welcome(request))
        response.headers.update(door.cors(request))
        return response

    return Route(WELCOME_PATH, get, methods=["GET", "OPTIONS"])


def routes(door: Door) -> list[BaseRoute]:
    return [*(Route(r.path, ReadRoute(door, r).get, methods=["GET", "OPTIONS"]) for r in READS),
            welcome_route(door)]


# -- the OpenAPI description (openapi.py) ---------------------------------------------------

ANSWERS: dict[str, type[Outbound]] = {
    "face.conversation.list": ConversationPage,
    "face.conversation.snapshot": Snapshot,
    "face.conversation.messages": MessagePage,
    "face.approval.list": ApprovalPage,
    "face.hand.list": HandPage,
}
# Ids the Mind makes: letters, digits, "_" and "-" (a path segment as is).
ID_PATTERN = "^[A-Za-z0-9_-]{1,128}$"


def field_type(type_: str, name: str) -> Any:
    """The wire struct's type of one payload field, without its ``None``."""
    for f in msgspec.structs.fields(wire.COMMANDS[type_]):
        if f.name == name:
            args = [a for a in get_args(f.type) if a is not type(None)]
            return args[0] if get_origin(f.type) in (Union, UnionType) else f.type
    raise KeyError(name)


def query_schema(type_: Any) -> dict[str, Any]:
    """The field's schema (made from the wire's type), bounded as a query
    string is (:data:`MAX_QUERY_INT`)."""
    schema: dict[str, Any] = msgspec.json.schema(type_)
    if schema.get("type") == "integer":
        schema.setdefault("maximum", MAX_QUERY_INT)
    return schema


def describe() -> list[spec.Operation]:
    operations = []
    for read in READS:
        params = [
            spec.Parameter(name, "path", {"type": "string", "pattern": ID_PATTERN},
                           required=True, description="an id the Mind made")
            for name in read.path_field
        ]
        params += [
            spec.Parameter(p.name, "query", query_schema(field_type(read.type, p.field)),
                           description=p.description)
            for p in read.params
        ]
        errors = {ErrorCode.INVALID_REQUEST}
        if read.path_field:
            errors.add(ErrorCode.CONVERSATION_NOT_FOUND)
        operations.append(spec.Operation(
            method="get",
            path=read.path,
            operation_id="get_" + read.path.strip("/").replace("/", "_").replace("{", "")
            .replace("}", ""),
            summary=read.summary,
            tag="reads",
            description=f"Runs {read.type} (docs/protocol.md §4) and answers its data.",
            parameters=tuple(params),
            responses={200: spec.Body(ANSWERS[read.type])},
            errors=frozenset(errors),
        ))
        operations.append(spec.preflight(
            read.path, "options_" + operations[-1].operation_id.removeprefix("get_"), "reads",
            # A preflight is about the Origin: any id is answered alike.
            tuple(spec.Parameter(name, "path", {"type": "string"}, required=True)
                  for name in read.path_field),
        ))
    operations.append(spec.Operation(
        method="get", path=WELCOME_PATH, operation_id="get_v1_welcome",
        summary="Who this bearer is and how the Mind speaks to it (face.welcome)",
        tag="reads",
        description="Profile, scopes, replay-safe commands, limits, heartbeat: what a "
                    "WebSocket's face.welcome says (docs/protocol.md §3).",
        responses={200: spec.Body(Welcome)},
        errors=frozenset({ErrorCode.INVALID_REQUEST}),
    ))
    operations.append(spec.preflight(WELCOME_PATH, "options_v1_welcome", "reads"))
    return operations
