"""HTTP commands (DESIGN §9, docs/protocol.md §18): ``POST /v1/commands/{type}``.

One request carries one Face command: the JSON body is its payload,
``Idempotency-Key`` its ``request_id`` (required for mutations, so that a
retried POST is admitted once, I5). The route only moves the command:

1. the Mind is serving (503 ``unavailable`` otherwise), the bearer token is
   live (401), the type is an HTTP command (404 ``invalid_request``,
   ``field: type``) and the credential's scopes allow it *now* (403, I8);
2. the body is decoded by the wire's own structs (``core/wire.py``): the
   same validation, the same field paths as a WebSocket frame;
3. the command runs through the Mind API (``mind/api.py``) for a one-shot
   :class:`HttpCaller` whose sink collects its replies — the same request
   registry, so a command sent here and retried over the WebSocket (or the
   reverse) is admitted once;
4. the replies become one HTTP answer: 200 with the final message's
   payload (``face.result``, ``face.snapshot``, ``face.pong``), 202 with
   ``face.accepted`` while the command still runs, an error with the
   status of its stable code (``door.error_response``). ``?wait=S``
   (0 ≤ S ≤ :data:`MAX_WAIT_S`) holds the answer up to S seconds for the
   final result.

When the HTTP request ends — answered, or the client went away while it
waited — the caller is disconnected (its connection is gone): it waits for
nothing any more, and what it started runs on (I1); a retry with the same
key re-attaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from halfpi.core import wire
from halfpi.core.events import Accepted, Error, Pong, Reply, Result, Snapshot
from halfpi.errors import (
    ErrorCode,
    HalfpiError,
    InternalError,
    InvalidRequest,
    TooLarge,
    Unauthorized,
)
from halfpi.gateway.http import spec
from halfpi.gateway.http.door import Door, error_response, preflight
from halfpi.mind import api
from halfpi.mind.connection import Final, Replies
from halfpi.mind.connection import refusal as refused

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.scheduler import Scheduler
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.http")

# Commands that only make sense on a connection: the handshake, and
# following conversations (an SSE stream does that over HTTP).
NOT_HTTP = frozenset({"face.hello", "face.subscribe", "face.unsubscribe"})
HTTP_COMMANDS = tuple(sorted(set(wire.COMMANDS) - NOT_HTTP))
MAX_WAIT_S = 60.0
KEY_HEADER = "Idempotency-Key"
MAX_KEY = 128  # a request_id's bound (core/wire.py)
# What a header carries unchanged: visible ASCII, no space (a request_id with
# other characters can be used over the WebSocket only).
KEY_PATTERN = "^[!-~]{1,128}$"
KEY = re.compile(KEY_PATTERN)
NO_STORE = {"Cache-Control": "no-store"}


class HttpCaller:
    """A one-shot caller: the connection (kind ``http``) of one HTTP
    request, whose replies to its one command are kept as typed values (a
    few: it follows no conversation, so nothing else is sent to it)."""

    kind = "http"
    budget = 0

    def __init__(self, mind: Mind, credential: Credential) -> None:
        self.replies = Replies()
        self.arrived = asyncio.Event()
        self.replies.on_reply = self.arrived.set
        self.conn = mind.connect(credential, self, mind.liveness("once"), capped=False,
                                 collect=self.replies)

    # -- the Framing: nothing is framed for a one-shot caller ----------------------------

    def write(self, frames: list[bytes]) -> None:
        """Never called: replies are collected typed."""

    def ping(self) -> None:
        """A request is answered within its wait: nothing to keep alive."""

    def close(self, code: int, reason: str) -> None:
        """Revoked or drained meanwhile: the replies so far are the answer."""
        self.arrived.set()

    def final(self) -> Final | None:
        """The reply that ends the command (a result, a snapshot, a pong, an error)."""
        return self.replies.final()

    def accepted(self) -> Accepted | None:
        return self.replies.accepted()

    async def wait_final(self, timeout: float, gone: asyncio.Future[Any],
                         scheduler: Scheduler) -> None:
        """Until the final reply, ``timeout`` seconds of the Mind's monotonic
        clock (its scheduler: a step of the wall clock changes nothing), or
        the client is ``gone``."""
        deadline = scheduler.now() + timeout
        while self.final() is None and not gone.done():
            remaining = deadline - scheduler.now()
            if remaining <= 0:
                return
            self.arrived.clear()
            waiter = asyncio.ensure_future(self.arrived.wait())
            try:
                await scheduler.wait_first((waiter, gone), remaining)
            finally:
                waiter.cancel()


def answer(reply: Reply) -> Response:
    """One reply as the HTTP answer: its payload, with the status of its kind."""
    if isinstance(reply, Error):
        return refusal(refused(reply))
    status = 202 if isinstance(reply, Accepted) else 200
    return Response(msgspec.json.encode(reply), status_code=status,
                    media_type="application/json", headers=NO_STORE)


def refusal(exc: HalfpiError, status: int | None = None) -> Response:
    response = error_response(exc)
    if status is not None:
        response.status_code = status
    response.headers.update(NO_STORE)
    return response


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413 ``too_large``) past ``limit`` bytes
    without reading more than that."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"a command body is at most {limit} bytes", field="body")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"a command body is at most {limit} bytes", field="body")
        chunks.append(chunk)
    return b"".join(chunks)


def wait_of(request: Request) -> float:
    """``?wait=S``: 0 when absent; a number of seconds within [0, MAX_WAIT_S]."""
    for name in request.query_params:
        if name != "wait":
            raise InvalidRequest(f"unknown query parameter {name[:64]!r}", field=name[:64])
    raw = request.query_params.get("wait")
    if raw is None:
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= MAX_WAIT_S:  # NaN fails too
        raise InvalidRequest(f"wait is a number of seconds from 0 to {MAX_WAIT_S:g}", field="wait")
    return wait


def key_of(request: Request, type_: str) -> str | None:
    """``Idempotency-Key``: the request_id, required for mutations (I5)."""
    key = request.headers.get(KEY_HEADER)
    if key is None:
        if type_ in wire.MUTATIONS:
            raise InvalidRequest(
                f"{type_} is a mutation: send {KEY_HEADER} (its request_id) so a retry "
                "is admitted once",
                field=KEY_HEADER,
            )
        return None
    if not KEY.fullmatch(key):
        raise InvalidRequest(
            f"{KEY_HEADER} is 1 to {MAX_KEY} visible ASCII characters", field=KEY_HEADER
        )
    return key


def payload_of(type_: str, body: bytes, key: str | None) -> Any:
    """The command's payload struct, decoded as the WebSocket decodes a frame
    (``wire.decode_command``: same rules, same field paths); ``request_id``
    is the key (a body may repeat it, never differ)."""
    if body.strip():
        try:
            raw = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError, UnicodeError):
            raise InvalidRequest("the body is not a decodable JSON object", field="body") from None
    else:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidRequest("the body is a JSON object: the command's payload", field="body")
    for name, value in raw.items():
        # JSON does not tell 1.0 from 1 (JSON Schema neither): a whole number
        # written with a fraction is that number. Payload fields are flat.
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            raw[name] = int(value)
    given = raw.get("request_id")
    if key is not None:
        if given is not None and given != key:
            raise InvalidRequest(
                f"request_id differs from {KEY_HEADER}: send one or make them equal",
                field="request_id",
            )
        raw["request_id"] = key
    elif given is None and type_ != "face.ping":
        raw["request_id"] = fresh_request_id()
    return decode(type_, raw)


def fresh_request_id() -> str:
    """A read without a key gets a name of its own (reads are not registered)."""
    return "http-" + secrets.token_hex(8)


def decode(type_: str, raw: dict[str, Any]) -> Any:
    """``raw`` as the payload struct of ``type_``, or ``InvalidRequest`` naming
    the field: the WebSocket's own decoder (``wire.decode_command``) on the
    frame ``{"type", "payload"}`` made of it."""
    frame = msgspec.json.encode({"type": type_, "payload": raw})
    return wire.decode_command(frame)[1]


async def disconnect(request: Request) -> None:
    """Returns when the client has gone (after its body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def guarded(what: str, work: Callable[[], Awaitable[Response]]) -> Response:
    """A route's work: a HalfpiError is its refusal (a stable code), anything
    else a bug — logged, and answered 500 ``internal_error``."""
    try:
        return await work()
    except HalfpiError as exc:
        return refusal(exc)
    except Exception:
        log.exception("HTTP %s failed", what)
        return refusal(InternalError("internal error"))


@contextlib.contextmanager
def one_shot(mind: Mind, credential: Credential) -> Iterator[HttpCaller]:
    """A caller for one request, gone from the Mind when the request is
    (what it started runs on, I1)."""
    caller = HttpCaller(mind, credential)
    try:
        yield caller
    finally:
        caller.conn.gone()


class Commands:
    """``POST /v1/commands/{type}``."""

    def __init__(self, door: Door) -> None:
        self.door = door

    async def post(self, request: Request) -> Response:
        if request.method == "OPTIONS":  # a page on another Origin asks first (§17.5)
            return preflight(self.door, request, "POST")
        type_ = request.path_params["type"]
        response = await guarded(f"command {type_[:64]}", lambda: self.run(request, type_))
        response.headers.update(self.door.cors(request))
        return response

    async def run(self, request: Request, type_: str) -> Response:
        mind = self.door.mind()
        credential = await self.door.credential(request)
        if type_ not in HTTP_COMMANDS:
            return refusal(self.not_a_command(type_), 404)
        api.authorize(credential.scopes, type_)  # I8: as the credential is now
        wait = wait_of(request)
        key = key_of(request, type_)
        payload = payload_of(type_, await read_body(request, mind.config.max_frame_bytes), key)
        with one_shot(mind, credential) as caller:
            await api.handle(mind, caller.conn, type_, payload)
            final = caller.final()
            if final is None and wait > 0:
                gone = asyncio.ensure_future(disconnect(request))
                try:
                    await caller.wait_final(wait, gone, mind.scheduler)
                finally:
                    gone.cancel()
                final = caller.final()
                if mind.credential(credential.principal_id) is None:
                    # Revoked while it waited (I8): the command runs on (I1),
                    # its answer is no longer this bearer's to read.
                    raise Unauthorized("the credential was revoked while the command waited")
            reply = final or caller.accepted()
            if reply is None:  # every command answers; a bug otherwise
                raise InternalError(f"{type_} sent no reply")
            return answer(reply)

    @staticmethod
    def not_a_command(type_: str) -> InvalidRequest:
        if type_ in NOT_HTTP:
            return InvalidRequest(
                f"{type_} belongs to a connection: use the WebSocket or an SSE stream",
                field="type",
            )
        return InvalidRequest(f"unknown command type {type_[:64]!r}", field="type")


def routes(door: Door) -> list[BaseRoute]:
    return [Route("/v1/commands/{type}", Commands(door).post, methods=["POST", "OPTIONS"])]



# -- the OpenAPI description (openapi.py) ---------------------------------------------------

# What each command may refuse with, besides what every authenticated
# request may (spec.AUTHENTICATED_ERRORS) and what every command may
# (invalid_request, too_large; request_conflict and request_in_progress for
# mutations).
COMMAND_ERRORS: dict[str, frozenset[ErrorCode]] = {
    "face.conversation.rename": frozenset({ErrorCode.CONVERSATION_NOT_FOUND}),
    "face.conversation.snapshot": frozenset({ErrorCode.CONVERSATION_NOT_FOUND}),
    "face.conversation.messages": frozenset({ErrorCode.CONVERSATION_NOT_FOUND}),
    "face.chat": frozenset({ErrorCode.CONVERSATION_NOT_FOUND, ErrorCode.BUSY}),
    "face.chat.cancel": frozenset({ErrorCode.CONVERSATION_NOT_FOUND, ErrorCode.RUN_NOT_FOUND}),
    "face.approval.resolve": frozenset(
        {ErrorCode.APPROVAL_NOT_FOUND, ErrorCode.APPROVAL_EXPIRED}
    ),
    "face.run.cancel": frozenset({ErrorCode.RUN_NOT_FOUND}),
    "face.task.cancel": frozenset({ErrorCode.TASK_NOT_FOUND}),
    "face.task.get": frozenset({ErrorCode.TASK_NOT_FOUND}),
    "face.task.log": frozenset({ErrorCode.TASK_NOT_FOUND}),
}


def replies(type_: str) -> dict[int, spec.Body]:
    """The success answers of one command."""
    if type_ == "face.conversation.snapshot":
        return {200: spec.Body(Snapshot, "the snapshot (face.snapshot)")}
    if type_ == "face.ping":
        return {200: spec.Body(Pong, "face.pong")}
    ok = {200: spec.Body(Result, "the command's face.result")}
    if type_ in wire.MUTATIONS:
        ok[202] = spec.Body(Accepted, "face.accepted: admitted, still running (no result "
                                      "within ?wait=)")
    return ok


def describe() -> list[spec.Operation]:
    key_schema = {"type": "string", "pattern": KEY_PATTERN}
    wait = spec.Parameter(
        "wait", "query", {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
        description=f"hold the answer up to this many seconds (at most {MAX_WAIT_S:g}) for "
                    "the final result; 0 (the default) answers at once",
    )
    operations = []
    for type_ in HTTP_COMMANDS:
        mutation = type_ in wire.MUTATIONS
        key = spec.Parameter(
            KEY_HEADER, "header", key_schema, required=mutation,
            description="the command's request_id: a retry with the same key is admitted "
                        "once (I5)" if mutation else "the command's request_id (optional)",
        )
        errors = {ErrorCode.INVALID_REQUEST, ErrorCode.TOO_LARGE, *COMMAND_ERRORS.get(type_, ())}
        if mutation:
            errors |= {ErrorCode.REQUEST_CONFLICT, ErrorCode.REQUEST_IN_PROGRESS}
        operations.append(spec.Operation(
            method="post",
            path=f"/v1/commands/{type_}",
            operation_id=type_.replace(".", "_"),
            summary=f"{type_} ({'mutation' if mutation else 'read'})",
            tag="commands",
            description="The JSON body is the command's payload (docs/protocol.md §4); its "
                        f"request_id is {KEY_HEADER}'s (the body may repeat it, never differ).",
            parameters=(key, wait) if mutation else (key,),
            body=spec.Body(wire.COMMANDS[type_], "the command's payload"),
            body_required=any(f.required for f in msgspec.structs.fields(wire.COMMANDS[type_])
                              if f.name != "request_id"),
            responses=replies(type_),
            errors=frozenset(errors),
        ))
        operations.append(spec.preflight(f"/v1/commands/{type_}",
                                         "options_" + type_.replace(".", "_"), "commands"))
    return operations
