"""What an operator's tools ask the door (docs/operations.md, "Health and
metrics"): ``GET /healthz`` (the process is up), ``GET /readyz`` (it can
serve: its Store commits a write and its disk has room, its Journal
answers) and ``GET /metrics`` (Prometheus). None of them takes a face token; ``/metrics`` takes the
scrape token when the Mind was given one (``--metrics-token-file``).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from halfpi.errors import ErrorCode, HalfpiError, Unauthorized
from halfpi.gateway.http import spec
from halfpi.gateway.http.door import Door, error_response
from halfpi.mind.health import ReadinessProbe, probe_of
from halfpi.mind.metrics import MindCollector

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

HEALTHZ = "/healthz"
READYZ = "/readyz"
METRICS = "/metrics"

_READY_SCHEMA = {
    "type": "object",
    "required": ["status", "checks"],
    "properties": {
        "status": {"type": "string", "enum": ["ready", "unavailable"]},
        "checks": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def describe() -> list[spec.Operation]:
    return [
        spec.Operation(
            method="get", path=HEALTHZ, operation_id="get_healthz",
            summary="The process is up", tag="operations", public=True,
            description="Answers 200 `ok` while the process serves HTTP, "
                        "starting and draining included; it touches nothing.",
            responses={200: spec.Body({"type": "string", "const": "ok\n"}, "up",
                                      "text/plain")},
        ),
        spec.Operation(
            method="get", path=READYZ, operation_id="get_readyz",
            summary="The Mind can serve", tag="operations", public=True,
            description="200 when the Store committed a write (with SQLite: and its disk "
                        "had room for 64 KiB more) and the Journal answered (Redis PING in "
                        "cluster mode); 503 while the Mind starts or drains, when a part "
                        "failed its check (named in `checks`), and at once when the Store's "
                        "last commit failed, until one succeeds. One probe is made per second "
                        "at most; checks in between get its answer. "
                        "A 503 carries `status` and `checks` next to its `error`.",
            responses={200: spec.Body(_READY_SCHEMA, "ready")},
            errors=frozenset({ErrorCode.UNAVAILABLE}),
        ),
        spec.Operation(
            method="get", path=METRICS, operation_id="get_metrics",
            summary="Prometheus metrics", tag="operations", public=True,
            description="The Prometheus text format (`halfpi_*`, docs/operations.md). "
                        "Without a face token; when the Mind has a metrics token "
                        "(`--metrics-token-file`) only `Authorization: Bearer <metrics token>`.",
            responses={200: spec.Body({"type": "string"}, "metrics (OpenMetrics when asked)",
                                      "text/plain")},
            errors=frozenset({ErrorCode.UNAUTHORIZED, ErrorCode.UNAVAILABLE}),
        ),
    ]


class Ops:
    """The routes' state: the readiness probe of the Mind being served (a
    mounted app may start a new Mind after stopping one)."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self._probe: tuple[Mind, ReadinessProbe] | None = None
        self._registry: tuple[Mind, CollectorRegistry] | None = None

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n")

    def probe(self, mind: Mind) -> ReadinessProbe:
        if self._probe is None or self._probe[0] is not mind:
            self._probe = (mind, probe_of(mind))
        return self._probe[1]

    async def readyz(self, request: Request) -> Response:
        try:
            mind = self.door.mind()
        except HalfpiError:
            return _not_ready({"mind": "starting or draining"})
        readiness = await self.probe(mind).check()
        if readiness.ready and not mind.draining:
            return JSONResponse({"status": "ready", "checks": readiness.checks})
        return _not_ready(readiness.checks)


    def collector_registry(self, mind: Mind) -> CollectorRegistry:
        if self._registry is None or self._registry[0] is not mind:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(MindCollector(mind))
            self._registry = (mind, registry)
        return self._registry[1]

    async def metrics(self, request: Request) -> Response:
        try:
            mind = self.door.mind()
            expected = mind.config.metrics_token
            if expected is not None:
                scheme, _, given = request.headers.get("authorization", "").partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), expected.encode()
                ):
                    raise Unauthorized("send Authorization: Bearer <metrics token>")
        except HalfpiError as exc:
            return error_response(exc)
        # The format the scraper asks for (Accept): Prometheus text, or OpenMetrics.
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encode(self.collector_registry(mind))
        return Response(body, headers={"Content-Type": content_type})


def _not_ready(checks: dict[str, str]) -> Response:
    failed = ", ".join(f"{name}: {state}" for name, state in checks.items() if state != "ok")
    error = {"code": ErrorCode.UNAVAILABLE.value, "message": f"not ready ({failed})"}
    return JSONResponse({"status": "unavailable", "checks": checks, "error": error},
                        status_code=503)


def routes(door: Door) -> list[BaseRoute]:
    ops = Ops(door)
    return [
        Route(HEALTHZ, ops.healthz, methods=["GET", "HEAD"]),
        Route(READYZ, ops.readyz, methods=["GET"]),
        Route(METRICS, ops.metrics, methods=["GET"]),
    ]
