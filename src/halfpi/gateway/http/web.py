"""The web face's routes (docs/faces.md, "The web face"): the page at ``/``,
its one script and one style sheet, and ``POST /v1/web/link`` that turns a
one-time sign-in link (``halfpi face link``) into a token.

Every response carries the same headers: a Content-Security-Policy that
allows only this origin's own script, style and connections (no inline
script or style, no ``eval``, no frames, no plugins, no form posts), and
``nosniff``, ``no-referrer``, ``DENY`` framing. The page itself only ever
builds the DOM with ``textContent`` (docs/faces.md); the policy is the
second wall should that ever fail.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from halfpi.errors import ErrorCode, HalfpiError, InvalidRequest
from halfpi.gateway.http import spec
from halfpi.gateway.http.door import Door, error_response
from halfpi.mind.links import LINK_CODE_PATTERN, redeem_link

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    # The page changes with halfpi: revalidate, never serve a stale one.
    "Cache-Control": "no-cache",
}
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/web/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/web/app.css": ("app.css", "text/css; charset=utf-8"),
}
MAX_LINK_BODY = 1024


class LinkBody(msgspec.Struct, forbid_unknown_fields=True):
    # The rule claim_link applies, stated for the OpenAPI document too.
    code: Annotated[str, msgspec.Meta(pattern=LINK_CODE_PATTERN)]


class Linked(msgspec.Struct, frozen=True):
    """The answer to a redeemed link: a new credential, its token shown once."""

    token: str
    label: str
    principal_id: str


def _asset(name: str) -> bytes:
    return resources.files("halfpi.web").joinpath(name).read_bytes()


def routes(door: Door) -> list[BaseRoute]:
    files = {path: (_asset(name), media) for path, (name, media) in ASSETS.items()}

    async def asset(request: Request) -> Response:
        body, media = files[request.url.path]
        return Response(body, media_type=media, headers=HEADERS)

    async def link(request: Request) -> Response:
        try:
            door.check_origin(request)
            raw = await request.body()
            if len(raw) > MAX_LINK_BODY:
                raise InvalidRequest("the body is too large", field="code")
            try:
                body = msgspec.json.decode(raw, type=LinkBody)
            except msgspec.ValidationError as exc:
                raise InvalidRequest(f"send {{\"code\": \"…\"}}: {exc}", field="code") from None
            except msgspec.DecodeError:
                raise InvalidRequest("the body is not JSON", field="code") from None
            redeemed = await redeem_link(door.mind(), body.code)
        except HalfpiError as exc:
            response = error_response(exc)
            response.headers.update({"Cache-Control": "no-store"})
            return response
        linked = Linked(redeemed.token, redeemed.label, redeemed.principal_id)
        return Response(msgspec.json.encode(linked), media_type="application/json",
                        headers={**HEADERS, "Cache-Control": "no-store"})

    return [
        *(Route(path, asset, methods=["GET", "HEAD"]) for path in ASSETS),
        Route("/v1/web/link", link, methods=["POST"]),
    ]


def describe() -> list[spec.Operation]:
    """The face's routes for the OpenAPI document (``openapi.py``)."""
    files = [
        spec.Operation(
            method="get", path=path, operation_id="get_web_" + (name.replace(".", "_")),
            summary=f"The web face: {name}", tag="web", public=True,
            responses={200: spec.Body({"type": "string"}, name, media.split(";")[0])},
        )
        for path, (name, media) in ASSETS.items()
    ]
    link = spec.Operation(
        method="post", path="/v1/web/link", operation_id="post_v1_web_link",
        summary="Redeem a one-time sign-in link (halfpi face link) for a new Face token",
        tag="web", public=True,
        description="The code from the link's #fragment, used once within its time; "
        "the answer is a new credential's token, shown once.",
        body=spec.Body(LinkBody, "the link's code"),
        body_required=True,
        responses={200: spec.Body(Linked, "the new credential")},
        errors=frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.UNAUTHORIZED,
                          ErrorCode.FORBIDDEN}),
    )
    return [*files, link]
