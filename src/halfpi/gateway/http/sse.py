"""SSE streams and stream tickets (DESIGN §9, docs/protocol.md §17).

- ``GET /v1/events?conversations=a,b[&detail=summary|transparent]`` — one
  stream per browser tab, all its conversations (browsers allow six
  HTTP/1.1 connections per origin); ``GET /v1/conversations/{id}/events``
  — one conversation.
- ``POST /v1/stream-tickets`` — ``{conversations, detail_mode?}`` →
  ``{ticket, expires_in}``: a one-time ticket for ``?ticket=``, since a
  browser's EventSource cannot send ``Authorization``.

Who may open a stream, in this order: ``Authorization: Bearer`` (checked
as every request of the door is); else the *grant* sealed in the resume
token the reader sends back (``Last-Event-ID``, or ``?since=``) — how an
EventSource reconnects by itself, with the same URL and its spent ticket;
else a ticket, redeemed once. Anything else is 401 ``unauthorized``.

Where it resumes is the Mind's: the token's cursors go into one
``face.subscribe`` through the Mind API. A token that does not open for
this principal and these conversations (another's, malformed, altered) is
a cursor nobody can place: answered in-band with ``face.reset`` and a
snapshot, never an HTTP error (EventSource would stop reconnecting). A
stream with no token starts from a ``face.snapshot`` of each conversation.

CORS: a browser's request is served only from an allowed Origin (the
Mind's own and ``--allow-origin``; ``Door.check_origin``), which is named
back in ``Access-Control-Allow-Origin``; preflights are answered here.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from halfpi.core import wire
from halfpi.core.replay import UNPLACED_EPOCH
from halfpi.core.sse import Grant, Opened, open_token
from halfpi.errors import ErrorCode, HalfpiError, InvalidRequest, Unauthorized
from halfpi.gateway.guard import settle
from halfpi.gateway.http import spec
from halfpi.gateway.http.door import Door, cors_headers, error_response, preflight
from halfpi.gateway.http.sse_stream import SseStream
from halfpi.mind import api
from halfpi.mind.tickets import TICKET_TTL_S

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.service import Mind

EVENTS_PATH = "/v1/events"
CONVERSATION_EVENTS_PATH = "/v1/conversations/{conversation_id}/events"
TICKETS_PATH = "/v1/stream-tickets"
MAX_CONVERSATIONS = 100
SUBSCRIBE_REQUEST_ID = "sse-subscribe"


class TicketRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    conversations: Annotated[list[wire.Id], msgspec.Meta(min_length=1, max_length=100)]
    detail_mode: Literal["transparent", "summary"] | None = None


class Ticket(msgspec.Struct, frozen=True):
    """The answer to ``POST /v1/stream-tickets``."""

    ticket: str
    expires_in: int  # seconds
    conversations: list[str]
    detail_mode: Literal["transparent", "summary"]


_decode_ticket_request = msgspec.json.Decoder(TicketRequest).decode


def routes(door: Door) -> list[BaseRoute]:
    return [
        Route(EVENTS_PATH, partial(events, door), methods=["GET", "OPTIONS"]),
        Route(CONVERSATION_EVENTS_PATH, partial(events, door), methods=["GET", "OPTIONS"]),
        Route(TICKETS_PATH, partial(tickets, door), methods=["POST", "OPTIONS"]),
    ]


# -- the OpenAPI description ------------------------------------------------------------

_TOKEN = {"type": "string", "maxLength": 4096}
_STREAM = {200: spec.Body({"type": "string"}, "the event stream (docs/protocol.md §17)",
                          "text/event-stream")}
_STREAM_ERRORS = frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.CONVERSATION_NOT_FOUND})
_RESUME = (
    spec.Parameter("detail", "query", {"enum": ["summary", "transparent"]},
                   description="the detail mode (default: the profile's)"),
    spec.Parameter("since", "query", _TOKEN, description="a resume token: an event's id"),
    spec.Parameter("heartbeat", "query", {"enum": ["comment", "event"]},
                   description="event: every heartbeat is also an event face.heartbeat"),
    spec.Parameter("ticket", "query", {"type": "string"},
                   description="a one-time stream ticket instead of a bearer token"),
    spec.Parameter("Last-Event-ID", "header", _TOKEN,
                   description="a resume token, as EventSource sends it when it reconnects"),
)
_CONVERSATION = spec.Parameter("conversation_id", "path", {"type": "string"}, required=True)


def _preflight(path: str, name: str, parameters: tuple[spec.Parameter, ...] = ()) -> spec.Operation:
    return spec.Operation(
        method="options", path=path, operation_id=f"options_{name}",
        summary="A browser's CORS preflight (an allowed Origin only)", tag="streams",
        parameters=parameters, public=True,
        responses={204: spec.Body({}, "allowed: Access-Control-Allow-* headers", "")},
        errors=frozenset({ErrorCode.FORBIDDEN}),
    )


def describe() -> list[spec.Operation]:
    resumes = ("Every event has an id: that resumes the whole stream exactly (Last-Event-ID "
               "or ?since=); a token that cannot resume is answered in-band with event: "
               "face.reset and a snapshot, never an HTTP error.")
    return [
        spec.Operation(
            method="get", path=EVENTS_PATH, operation_id="get_v1_events",
            summary="One event stream for several conversations (Server-Sent Events)",
            tag="streams", description=resumes,
            parameters=(spec.Parameter("conversations", "query", {"type": "string"},
                                       required=True,
                                       description="conversation ids, comma-separated"),
                        *_RESUME),
            responses=_STREAM, errors=_STREAM_ERRORS,
        ),
        spec.Operation(
            method="get", path=CONVERSATION_EVENTS_PATH,
            operation_id="get_v1_conversation_events",
            summary="One conversation's event stream (Server-Sent Events)",
            tag="streams", description=resumes,
            parameters=(_CONVERSATION, *_RESUME), responses=_STREAM, errors=_STREAM_ERRORS,
        ),
        spec.Operation(
            method="post", path=TICKETS_PATH, operation_id="post_v1_stream_tickets",
            summary="A one-time ticket (60 s, single use) for an EventSource", tag="streams",
            body=spec.Body(TicketRequest, "the stream the ticket is for"), body_required=True,
            responses={200: spec.Body(Ticket)},
            errors=frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.TOO_LARGE}),
        ),
        _preflight(EVENTS_PATH, "v1_events"),
        _preflight(CONVERSATION_EVENTS_PATH, "v1_conversation_events", (_CONVERSATION,)),
        _preflight(TICKETS_PATH, "v1_stream_tickets"),
    ]


# -- tickets -----------------------------------------------------------------------------


async def tickets(door: Door, request: Request) -> Response:
    if request.method == "OPTIONS":
        return preflight(door, request, "POST")
    try:
        credential = await door.credential(request)
        try:
            ask = _decode_ticket_request(await request.body())
        except msgspec.ValidationError as exc:
            raise InvalidRequest(f"stream ticket request: {exc}", field="body") from None
        except msgspec.DecodeError:
            raise InvalidRequest(
                'send {"conversations": [...], "detail_mode"?: ...} as JSON', field="body"
            ) from None
        api.authorize(credential.scopes, "face.subscribe")
        conversations = tuple(sorted(set(ask.conversations)))
        ticket, mode = door.mind().tickets.issue_for(credential, conversations, ask.detail_mode)
    except HalfpiError as exc:
        return error_response(exc)
    body = Ticket(ticket, int(TICKET_TTL_S), list(conversations), mode)  # type: ignore[arg-type]
    headers = {**cors_headers(request), "Cache-Control": "no-store"}
    return Response(msgspec.json.encode(body), media_type="application/json", headers=headers)


# -- streams ------------------------------------------------------------------------------


async def events(door: Door, request: Request) -> Response:
    if request.method == "OPTIONS":
        return preflight(door, request, "GET")
    try:
        return await _open(door, request)
    except HalfpiError as exc:
        return error_response(exc)


async def _open(door: Door, request: Request) -> Response:
    conversations = _conversations(request)
    detail = request.query_params.get("detail")
    if detail is not None and detail not in ("summary", "transparent"):
        raise InvalidRequest("detail is summary or transparent", field="detail")
    heartbeat = request.query_params.get("heartbeat", "comment")
    if heartbeat not in ("comment", "event"):
        raise InvalidRequest("heartbeat is comment or event", field="heartbeat")
    credential, mode, opened, grant = await _authorise(door, request, conversations, detail)
    api.authorize(credential.scopes, "face.subscribe")
    mind = door.mind()
    cursors = dict(opened.cursors) if opened is not None else {}
    since: dict[str, str] = dict(cursors)
    if opened is None and _token(request) is not None:
        # A token that does not open here: every conversation resets (I4).
        since = {cid: f"{UNPLACED_EPOCH}.0" for cid in conversations}
    stream = SseStream(mind, credential, conversations, cursors, grant,
                       heartbeat_event=heartbeat == "event")
    conn = stream.open()
    subscribe = wire.Subscribe(
        request_id=SUBSCRIBE_REQUEST_ID,
        conversation_ids=list(conversations),
        since=since or None,
        detail_mode=mode,  # type: ignore[arg-type]  # checked: summary | transparent | None
        snapshot=True,
    )
    try:
        await api.handle(mind, conn, "face.subscribe", subscribe)
    except BaseException:
        conn.gone()
        raise
    stream.response.add_headers(cors_headers(request))
    return stream.response


def _conversations(request: Request) -> tuple[str, ...]:
    """The stream's conversations, as a set (in a canonical order: tokens
    and tickets bind the set, whatever order a URL names them in)."""
    one = request.path_params.get("conversation_id")
    names = [one] if one is not None else request.query_params.get("conversations", "").split(",")
    found = {n.strip() for n in names if n.strip()}
    if not found:
        raise InvalidRequest("name the conversations: ?conversations=a,b", field="conversations")
    if len(found) > MAX_CONVERSATIONS:
        raise InvalidRequest(
            f"at most {MAX_CONVERSATIONS} conversations per stream", field="conversations"
        )
    if any(len(n) > 128 for n in found):
        raise InvalidRequest("a conversation id has at most 128 characters", field="conversations")
    return tuple(sorted(found))


def _token(request: Request) -> str | None:
    """The resume token: EventSource's ``Last-Event-ID`` (newer than any
    ``since`` in the URL it keeps re-sending), else ``?since=``."""
    return request.headers.get("last-event-id") or request.query_params.get("since") or None


async def _authorise(
    door: Door, request: Request, conversations: tuple[str, ...], detail: str | None
) -> tuple[Credential, str | None, Opened | None, Grant | None]:
    """Who opens the stream: ``(credential, detail mode, opened token, grant)``."""
    token = _token(request)
    if request.headers.get("authorization") is not None:
        credential = await door.credential(request)
        mind = door.mind()
        opened = _open_token(mind, token, conversations, credential.principal_id)
        return credential, detail, opened, None
    door.check_origin(request)
    mind = door.mind()
    tickets = mind.tickets
    if token is not None:
        opened = _open_token(mind, token, conversations, None)
        grant = opened.grant if opened is not None else None
        if grant is not None and tickets.grant_valid(grant):
            holder = _live_face(mind, grant.principal_id)
            if holder is not None and detail in (None, grant.detail_mode):
                renewed = tickets.grant(grant.principal_id, grant.detail_mode)
                settle(request.scope)  # authenticated by its grant
                return holder, grant.detail_mode, opened, renewed
    ticket = request.query_params.get("ticket")
    if ticket is None:
        raise Unauthorized(
            "send Authorization: Bearer <face token>, or ?ticket= from POST /v1/stream-tickets"
        )
    bound = tickets.redeem(ticket)
    if bound is None:
        raise Unauthorized("this stream ticket is unknown, used or expired: ask for a new one")
    if bound.conversations != conversations or detail not in (None, bound.detail_mode):
        raise Unauthorized("this stream ticket was issued for other conversations or detail")
    issued_to = _live_face(mind, bound.principal_id)
    if issued_to is None:
        raise Unauthorized("the credential of this ticket was revoked")
    settle(request.scope)  # authenticated: no longer counted as pending (gateway/guard.py)
    opened = _open_token(mind, token, conversations, bound.principal_id)
    grant = tickets.grant(bound.principal_id, bound.detail_mode)
    return issued_to, bound.detail_mode, opened, grant


def _open_token(
    mind: Mind, token: str | None, conversations: tuple[str, ...], principal_id: str | None
) -> Opened | None:
    if token is None:
        return None
    return open_token(mind.tickets.key, token, conversations, principal_id)


def _live_face(mind: Mind, principal_id: str) -> Credential | None:
    credential = mind.credential(principal_id)
    return credential if credential is not None and credential.kind == "face" else None

