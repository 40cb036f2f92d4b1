"""The AG-UI endpoint (DESIGN §9, docs/protocol.md §19).

- ``POST /v1/agui`` takes AG-UI's ``RunAgentInput`` and answers the run as
  AG-UI events over SSE. ``threadId`` is the conversation (a conversation id,
  or any other name, bound to a conversation created on first use through
  the request registry); ``runId`` is the chat's ``request_id``, so a retried
  POST is admitted once (I5) and streams the same run; the last user message
  is the chat. A POST with ``resume`` answers the interrupts (pending
  approvals) of the thread's waiting chat and follows that chat on.
- ``GET /v1/agui?threadId=…[&runId=…]`` rejoins the thread's active run;
  with ``Last-Event-ID`` (an event's ``id:``) it resumes exactly there.

The route only moves frames: the run is one ``face.subscribe`` of an
:class:`~halfpi.gateway.http.sse_stream.SseStream` (the bounded queue, the
heartbeat, revocation and drain of any SSE stream) whose frames the pure
:class:`~halfpi.core.agui.RunTranslator` turns into AG-UI events, encoded by
``ag_ui.encoder.EventEncoder``; each event's ``id:`` is a resume token sealed
as §17's (``core/sse.py``), bound to the principal, the conversation and the
run. Commands (chat, approval decisions, conversation creation) go through
the Mind API for a one-shot ``HttpCaller``, as HTTP commands do.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
import pydantic
from ag_ui.core import RunAgentInput, TextPart, UserMessage
from ag_ui.encoder import EventEncoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from halfpi.core import wire
from halfpi.core.agui import Mark, RunTranslator
from halfpi.core.events import Accepted, Pong, Result, Snapshot
from halfpi.core.sse import Sealer, open_token, position_of, type_of
from halfpi.errors import (
    ErrorCode,
    HalfpiError,
    InternalError,
    InvalidRequest,
    NotFound,
)
from halfpi.gateway.http import spec
from halfpi.gateway.http.commands import decode, one_shot, read_body
from halfpi.gateway.http.door import Door, cors_headers, error_response, preflight
from halfpi.gateway.http.sse_stream import SseStream
from halfpi.mind import api

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.agui")

PATH = "/v1/agui"
SUBSCRIBE_REQUEST_ID = "agui-subscribe"
THREAD_PREFIX = "agui-thread:"  # the request_id that binds a foreign threadId
_encoder = EventEncoder()


# -- the stream ---------------------------------------------------------------------------


class AguiRun:
    """One run's stream: frames in, AG-UI events (with their ids) out."""

    def __init__(self, stream: SseStream, translator: RunTranslator, sealer: Sealer,
                 conversation_id: str) -> None:
        self.stream = stream
        self.translator = translator
        self.sealer = sealer
        self.conversation_id = conversation_id
        self.scope = sealer.conversations[1]
        stream.encode = self.encode  # type: ignore[method-assign]  # AG-UI events instead
        stream.kind = "agui"

    def token(self, mark: Mark) -> str:
        cursors = {self.scope: mark.slot()}
        if mark.cursor is not None:
            cursors[self.conversation_id] = mark.cursor
        return self.sealer.seal(cursors, None)

    def events(self, pairs: list[tuple[Any, Mark]]) -> bytes:
        out = []
        for event, mark in pairs:
            text = _encoder.encode(event)  # "data: {…}\n\n"
            out.append(f"{text[:-1]}id: {self.token(mark)}\n\n".encode())
        return b"".join(out)

    def opening(self) -> None:
        self.stream.response.write(self.events(self.translator.opening()))

    def encode(self, frames: list[bytes]) -> bytes:
        pairs = []
        for frame in frames:
            type_ = type_of(frame)
            if type_ not in ("face.event", "face.chat.delta", "face.snapshot", "face.reset"):
                continue
            position = position_of(frame, type_)
            cursor = position[1] if position and position[0] == self.conversation_id else None
            payload = msgspec.json.decode(frame)["payload"]
            pairs.extend(self.translator.frame(type_, payload, cursor))
        if self.translator.finished and not self.stream.closed:
            # The run ended (or waits on an interrupt): the response ends.
            self.stream.loop.call_soon(self.stream.conn.close, 1000, "run ended")
        return self.events(pairs)


# -- helpers --------------------------------------------------------------------------------


async def one(mind: Mind, credential: Credential, type_: str, raw: dict[str, Any]
              ) -> Accepted | Result | Snapshot | Pong:
    """Run one command for a one-shot caller: its final reply or its
    ``face.accepted``, typed; its error raised as the HalfpiError it names."""
    api.authorize(credential.scopes, type_)
    with one_shot(mind, credential) as caller:
        return await api.call(mind, caller.conn, type_, decode(type_, raw))


async def conversation_of(mind: Mind, credential: Credential, thread_id: str) -> str:
    """The conversation of ``threadId``: the conversation of that id, else the
    one created for it on first use (admitted once, I5: the request registry
    keeps the binding, ``agui-thread:<threadId>``)."""
    try:
        await snapshot_of(mind, credential, thread_id)  # through the Mind API, as any read
        return thread_id
    except HalfpiError as exc:
        if exc.code is not ErrorCode.CONVERSATION_NOT_FOUND:
            raise
    if len(THREAD_PREFIX) + len(thread_id) > 128:
        raise InvalidRequest("a threadId that is not a conversation id has at most "
                             f"{128 - len(THREAD_PREFIX)} characters", field="threadId")
    reply = await one(mind, credential, "face.conversation.create",
                      {"request_id": THREAD_PREFIX + thread_id, "name": thread_id[:200]})
    assert isinstance(reply, Result)
    return str(msgspec.to_builtins(reply.data)["conversation_id"])


async def snapshot_of(mind: Mind, credential: Credential, cid: str) -> dict[str, Any]:
    reply = await one(mind, credential, "face.conversation.snapshot",
                      {"request_id": "agui-snapshot", "conversation_id": cid})
    return msgspec.to_builtins(reply)  # type: ignore[no-any-return]  # the translator's input


def active_chat(snapshot: dict[str, Any]) -> str | None:
    pending = snapshot.get("pending_chats") or []
    return str(pending[0]["request_id"]) if pending else None


def last_user_text(run: RunAgentInput) -> str:
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                return content
            texts = [part.text for part in content if isinstance(part, TextPart)]
            if len(texts) != len(content):
                raise InvalidRequest("only text parts can be sent to the Mind",
                                     field="messages")
            return "".join(texts)
    raise InvalidRequest("send a user message (or resume entries)", field="messages")


def detail_of(request: Request) -> str | None:
    detail = request.query_params.get("detail")
    if detail is not None and detail not in ("summary", "transparent"):
        raise InvalidRequest("detail is summary or transparent", field="detail")
    return detail


def parse_input(body: bytes) -> RunAgentInput:
    try:
        run = RunAgentInput.model_validate_json(body or b"{}")
    except pydantic.ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid"}
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"RunAgentInput: {where}: {first['msg']}"[:300],
                             field=where[:64]) from None
    if not 1 <= len(run.run_id) <= 128:
        raise InvalidRequest("runId has 1 to 128 characters", field="runId")
    if not 1 <= len(run.thread_id) <= 128:
        raise InvalidRequest("threadId has 1 to 128 characters", field="threadId")
    return run


async def resolve(mind: Mind, credential: Credential, run: RunAgentInput) -> None:
    """``resume``: each answer is a decision on the approval it names (the
    interrupt's id), admitted once per run (``<runId>:<interruptId>``)."""
    for i, entry in enumerate(run.resume or []):
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        if entry.status == "cancelled":
            decision = "deny_once"
        else:
            decision = str(payload.get("decision"))
            if decision not in ("allow_once", "deny_once"):
                raise InvalidRequest('a resolved interrupt answers {"decision": '
                                     '"allow_once" | "deny_once"}', field=f"resume.{i}.payload")
        raw: dict[str, Any] = {"request_id": f"{run.run_id}:{entry.interrupt_id}"[:128],
                               "approval_id": entry.interrupt_id, "decision": decision}
        if isinstance(payload.get("reason"), str):
            raw["reason"] = payload["reason"][:1000]
        await one(mind, credential, "face.approval.resolve", raw)


# -- the routes ---------------------------------------------------------------------------


async def agui(door: Door, request: Request) -> Response:
    if request.method == "OPTIONS":
        return preflight(door, request, "GET, POST")
    try:
        return await (_post(door, request) if request.method == "POST" else _get(door, request))
    except HalfpiError as exc:
        return error_response(exc)
    except Exception:
        log.exception("AG-UI request failed")
        return error_response(InternalError("internal error"))


async def _post(door: Door, request: Request) -> Response:
    credential = await door.credential(request)
    mind = door.mind()
    detail = detail_of(request)
    for name in request.query_params:
        if name != "detail":
            raise InvalidRequest(f"unknown query parameter {name[:64]!r}", field=name[:64])
    run = parse_input(await read_body(request, mind.config.max_frame_bytes))
    content = None if run.resume else last_user_text(run)
    cid = await conversation_of(mind, credential, run.thread_id)
    if run.resume:
        await resolve(mind, credential, run)
        chat_id = active_chat(await snapshot_of(mind, credential, cid))
    else:
        chat_id = run.run_id
    stream = await _open(door, request, credential, cid,
                         RunTranslator(run.thread_id, run.run_id, chat_id), detail, None)
    if content is not None:
        try:
            await one(mind, credential, "face.chat",
                      {"request_id": run.run_id, "conversation_id": cid, "content": content})
        except BaseException:
            stream.on_closed()
            raise
    return stream.response


async def _get(door: Door, request: Request) -> Response:
    credential = await door.credential(request)
    mind = door.mind()
    detail = detail_of(request)
    thread_id = request.query_params.get("threadId")
    if not thread_id:
        raise InvalidRequest("name the thread: ?threadId=", field="threadId")
    cid = await conversation_of(mind, credential, thread_id)
    chat_id = active_chat(await snapshot_of(mind, credential, cid))
    run_id = request.query_params.get("runId") or chat_id
    if run_id is None:
        raise NotFound(ErrorCode.RUN_NOT_FOUND, "this thread has no active run", field="threadId")
    if chat_id is None:
        chat_id = run_id  # a run that has ended: its end, again
    token = request.headers.get("last-event-id") or None
    stream = await _open(door, request, credential, cid,
                         RunTranslator(thread_id, run_id[:128], chat_id), detail, token)
    return stream.response


async def _open(door: Door, request: Request, credential: Credential, cid: str,
                fresh: RunTranslator, detail: str | None, token: str | None) -> SseStream:
    """The run's stream, subscribed: from the token's mark when it opens for
    this principal, conversation and run; else from a snapshot of the thread."""
    mind = door.mind()
    api.authorize(credential.scopes, "face.subscribe")
    scope = (cid, f"agui:{fresh.run_id}")
    opened = open_token(mind.tickets.key, token, scope, credential.principal_id) if token \
        else None
    translator = fresh
    if opened is not None:  # else (none, or one that does not open here): a snapshot
        mark = Mark.of(opened.cursors.get(cid), opened.cursors.get(scope[1]))
        translator = RunTranslator(fresh.thread_id, fresh.run_id, fresh.chat_id, mark)
    stream = SseStream(mind, credential, (cid,), {}, None)
    run = AguiRun(stream, translator, Sealer(mind.tickets.key, credential.principal_id, scope),
                  cid)
    conn = stream.open()
    since = translator.mark.cursor
    subscribe = wire.Subscribe(
        request_id=SUBSCRIBE_REQUEST_ID,
        conversation_ids=[cid],
        since={cid: since} if since else None,
        detail_mode=detail,  # type: ignore[arg-type]  # checked: summary | transparent | None
        snapshot=since is None,
    )
    try:
        run.opening()
        await api.handle(mind, conn, "face.subscribe", subscribe)
    except BaseException:
        conn.gone()
        raise
    stream.response.add_headers(cors_headers(request))
    return stream


def routes(door: Door) -> list[BaseRoute]:
    return [Route(PATH, partial(agui, door), methods=["GET", "POST", "OPTIONS"])]


# -- the OpenAPI description -------------------------------------------------------------

_STREAM = {200: spec.Body({"type": "string"}, "AG-UI events (docs/protocol.md §19)",
                          "text/event-stream")}
_DETAIL = spec.Parameter("detail", "query", {"enum": ["summary", "transparent"]},
                         description="the detail mode (default: the profile's)")
_RUN_INPUT = {
    "type": "object",
    "description": "AG-UI RunAgentInput (ag-ui-protocol 1.0)",
    "required": ["threadId", "runId", "messages"],
    "properties": {
        "threadId": {"type": "string"},
        "runId": {"type": "string", "maxLength": 128},
        "messages": {"type": "array", "items": {"type": "object"}},
        "resume": {"type": "array", "items": {"type": "object"}},
    },
}


def describe() -> list[spec.Operation]:
    return [
        spec.Operation(
            method="post", path=PATH, operation_id="post_v1_agui",
            summary="Run a chat as an AG-UI run (Server-Sent Events)", tag="agui",
            description="threadId is the conversation, runId the chat's request_id (a retry "
                        "is admitted once); every event's id: resumes it (GET).",
            parameters=(_DETAIL,), body=spec.Body(_RUN_INPUT, "AG-UI RunAgentInput"),
            body_required=True, responses=_STREAM,
            errors=frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.TOO_LARGE, ErrorCode.BUSY,
                              ErrorCode.REQUEST_CONFLICT, ErrorCode.CONVERSATION_NOT_FOUND,
                              ErrorCode.APPROVAL_NOT_FOUND, ErrorCode.APPROVAL_EXPIRED}),
        ),
        spec.Operation(
            method="get", path=PATH, operation_id="get_v1_agui",
            summary="Rejoin a thread's active AG-UI run (Last-Event-ID resumes exactly)",
            tag="agui",
            parameters=(
                spec.Parameter("threadId", "query", {"type": "string"}, required=True),
                spec.Parameter("runId", "query", {"type": "string"},
                               description="the run (default: the thread's active chat)"),
                _DETAIL,
                spec.Parameter("Last-Event-ID", "header", {"type": "string", "maxLength": 4096},
                               description="an event's id: where to resume"),
            ),
            responses=_STREAM,
            errors=frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.RUN_NOT_FOUND,
                              ErrorCode.CONVERSATION_NOT_FOUND}),
        ),
        spec.Operation(
            method="options", path=PATH, operation_id="options_v1_agui",
            summary="A browser's CORS preflight (an allowed Origin only)", tag="agui",
            public=True, responses={204: spec.Body({}, "allowed: Access-Control-Allow-* headers",
                                                   "")},
            errors=frozenset({ErrorCode.FORBIDDEN}),
        ),
    ]
