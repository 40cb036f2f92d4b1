"""What every route of the HTTP door shares.

- The running Mind: ``None`` while it starts or drains, answered 503
  ``unavailable`` (a stream is simply not opened; EventSource retries).
- Authentication: ``Authorization: Bearer <face token>`` on every request,
  checked as a WebSocket hello is (throttled per address, I8), and the
  credential re-read on every command.
- Browsers: a request that carries ``Origin`` is served only when that
  Origin is allowed (the Mind's own, plus ``allowed_origins``); answered
  403 ``forbidden`` otherwise.
- Errors: ``{"error": {"code", "message", "field"?}}`` with a status chosen
  by the stable code (:data:`STATUS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response

from halfpi.core.throttle import client_address
from halfpi.errors import ErrorCode, Forbidden, HalfpiError, Unauthorized, Unavailable
from halfpi.gateway.guard import settle

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.service import Mind

# CORS (docs/protocol.md §17.5): what a page on an allowed Origin may send.
ALLOWED_HEADERS = "Authorization, Content-Type, Last-Event-ID, Idempotency-Key"
PREFLIGHT_MAX_AGE_S = 600

STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.CONVERSATION_NOT_FOUND: 404,
    ErrorCode.APPROVAL_NOT_FOUND: 404,
    ErrorCode.RUN_NOT_FOUND: 404,
    ErrorCode.TASK_NOT_FOUND: 404,
    ErrorCode.HAND_NOT_FOUND: 404,
    ErrorCode.REQUEST_CONFLICT: 409,
    ErrorCode.DELIVERY_CONFLICT: 409,
    ErrorCode.REQUEST_IN_PROGRESS: 409,
    ErrorCode.APPROVAL_EXPIRED: 409,
    ErrorCode.BUSY: 409,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.INTERNAL_ERROR: 500,
}


def error_response(exc: HalfpiError) -> JSONResponse:
    body: dict[str, object] = {"code": exc.code.value, "message": exc.message}
    field = getattr(exc, "field", None)
    if field is not None:
        body["field"] = field
    headers = {"WWW-Authenticate": "Bearer"} if exc.code is ErrorCode.UNAUTHORIZED else None
    return JSONResponse({"error": body}, status_code=STATUS[exc.code], headers=headers)


class Door:
    """The Mind behind the door, as the gateway holds it (``None`` while it
    is not serving)."""

    def __init__(self, mind_of: Callable[[], Mind | None]) -> None:
        self._mind_of = mind_of

    def mind(self) -> Mind:
        mind = self._mind_of()
        if mind is None or mind.draining:
            raise Unavailable("the Mind is restarting; retry shortly")
        return mind

    def address(self, conn: HTTPConnection) -> str:
        """The client's address, as the handshake throttle counts it."""
        peer = conn.client.host if conn.client else "unknown"
        forwarded = conn.headers.getlist("x-forwarded-for")
        return client_address(peer, forwarded, frozenset(self.mind().config.trusted_proxies))

    def check_origin(self, conn: HTTPConnection) -> None:
        """A browser's request (it carries ``Origin``) only from an allowed
        Origin; other clients send none and are not checked."""
        origin = conn.headers.get("origin")
        if origin is None:
            return
        port = conn.url.port
        if origin not in self.mind().config.origins(port):
            raise Forbidden("this Origin is not allowed")

    async def credential(self, conn: HTTPConnection) -> Credential:
        """The face credential of ``Authorization: Bearer``; Unauthorized
        (401) for a missing, unknown or revoked token, RateLimited (429)
        while this address must wait after failures."""
        self.check_origin(conn)
        scheme, _, token = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("send Authorization: Bearer <face token>")
        mind = self.mind()
        credential = await mind.authenticate(token.strip(), "face", self.address(conn))
        if credential is None:
            raise Unauthorized("unknown or revoked token")
        settle(conn.scope)  # the connection is no longer unauthenticated (gateway/guard.py)
        return credential

    def cors(self, conn: HTTPConnection) -> dict[str, str]:
        """The CORS headers of an answer: the request's Origin named back
        when it is allowed; nothing for a client that sends none, nor for
        an Origin that is not allowed (its page cannot read the answer)."""
        try:
            self.check_origin(conn)
        except HalfpiError:
            return {}
        return cors_headers(conn)


def cors_headers(request: HTTPConnection) -> dict[str, str]:
    """For a browser's request (already checked by ``Door.check_origin``):
    its Origin named back; nothing for a client that sends none."""
    origin = request.headers.get("origin")
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"} if origin else {}


def preflight(door: Door, request: Request, methods: str) -> Response:
    """A browser's CORS preflight: allowed Origins only (403 otherwise)."""
    try:
        door.check_origin(request)
    except HalfpiError as exc:
        return error_response(exc)
    headers = {
        **cors_headers(request),
        "Access-Control-Allow-Methods": methods,
        "Access-Control-Allow-Headers": ALLOWED_HEADERS,
        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
    }
    return Response(status_code=204, headers=headers)
