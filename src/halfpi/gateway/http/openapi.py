"""The OpenAPI 3.1 document of the HTTP door and its served docs (DESIGN §9).

``GET /v1/openapi.json`` is **generated**: each routes module describes its
routes (``describe() -> list[spec.Operation]``), and every schema in the
document is made by ``msgspec.json.schema_components`` from the same
structs the wire decodes and encodes (``core/wire.py`` for payloads,
``core/events.py`` for answers). So the document cannot drift from what
the door accepts and answers; ``tests/e2e/test_schemathesis.py`` checks
the door against it.

Every operation lists, per HTTP status, the stable error codes it may
answer (``{"error": {"code", "message", "field"?}}``, the status of each
code is ``door.STATUS``'s), so a client — or a fuzzer — can tell a
documented refusal from a bug.

``GET /v1/docs`` is the same document rendered on the server as one small
HTML page (escaped, no script, no CDN): it works offline, and there is no
renderer to vendor or keep up to date.

The event streams, stream tickets and their CORS preflights are
described by ``sse.py``'s ``describe()``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from halfpi import __version__
from halfpi.core import wire
from halfpi.errors import ErrorCode
from halfpi.gateway.http import agui, commands, durable, ops, reads, spec, sse, web
from halfpi.gateway.http.door import STATUS, Door

REF = "#/components/schemas/{name}"
OPENAPI_PATH = "/v1/openapi.json"
DOCS_PATH = "/v1/docs"

SELF: tuple[spec.Operation, ...] = (
    spec.Operation(
        method="get", path=OPENAPI_PATH, operation_id="get_v1_openapi",
        summary="This document", tag="meta", public=True,
        responses={200: spec.Body({"type": "object"}, "OpenAPI 3.1")},
    ),
    spec.Operation(
        method="get", path=DOCS_PATH, operation_id="get_v1_docs",
        summary="This document as a page (no script, works offline)", tag="meta", public=True,
        responses={200: spec.Body({"type": "string"}, "HTML", "text/html")},
    ),
)


def describe() -> list[spec.Operation]:
    return list(SELF)


def operations() -> list[spec.Operation]:
    """Every route of the door, as its module describes it."""
    return [*commands.describe(), *reads.describe(), *sse.describe(), *web.describe(),
            *describe(), *durable.describe(), *agui.describe(), *ops.describe()]


def _is_type(schema: spec.Schema) -> bool:
    return not isinstance(schema, dict)


def _error_schema(codes: Iterable[ErrorCode]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": sorted(c.value for c in codes)},
                    "message": {"type": "string"},
                    "field": {"type": "string"},
                },
            }
        },
    }


def _request_body_schemas(components: dict[str, Any], refs: dict[Any, Any]) -> None:
    """A command's body as HTTP takes it: the wire's payload without
    ``request_id``, which Idempotency-Key carries (a body may repeat it,
    equal, as a courtesy to code written for the WebSocket; never differ)."""
    for cls in wire.COMMANDS.values():
        ref = refs.get(cls)
        if ref is not None:
            schema = components[ref["$ref"].rsplit("/", 1)[1]]
            schema["properties"].pop("request_id", None)
            schema["required"] = [r for r in schema.get("required", []) if r != "request_id"]


def document() -> dict[str, Any]:
    ops = operations()
    types: list[Any] = []
    for op in ops:
        bodies = [*op.responses.values(), *([op.body] if op.body else [])]
        types += [b.schema for b in bodies if _is_type(b.schema)]
        types += [p.schema for p in op.parameters if _is_type(p.schema)]
    unique = list(dict.fromkeys(types))
    refs, components = msgspec.json.schema_components(unique, ref_template=REF)
    schema_of = dict(zip(unique, refs, strict=True))
    _request_body_schemas(components, schema_of)

    def schema(value: spec.Schema) -> Any:
        return schema_of[value] if _is_type(value) else value

    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        responses: dict[str, Any] = {
            str(status): {
                "description": body.description or "OK",
                # An answer with no media type has no body (a 204).
                **({"content": {body.media_type: {"schema": schema(body.schema)}}}
                   if body.media_type else {}),
            }
            for status, body in sorted(op.responses.items())
        }
        codes = set(op.errors) | (set() if op.public else set(spec.AUTHENTICATED_ERRORS))
        by_status: dict[int, set[ErrorCode]] = {}
        for code in codes:
            by_status.setdefault(STATUS[code], set()).add(code)
        for status, code in op.extra_errors:
            by_status.setdefault(status, set()).add(code)
        for status, status_codes in sorted(by_status.items()):
            responses[str(status)] = {
                "description": "refused: " + ", ".join(sorted(c.value for c in status_codes)),
                "content": {"application/json": {"schema": _error_schema(status_codes)}},
            }
        operation: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "tags": [op.tag],
            "parameters": [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required,
                    "schema": schema(p.schema),
                    **({"description": p.description} if p.description else {}),
                }
                for p in op.parameters
            ],
            "responses": responses,
        }
        if op.description:
            operation["description"] = op.description
        if op.body is not None:
            operation["requestBody"] = {
                "required": op.body_required,
                "content": {op.body.media_type: {"schema": schema(op.body.schema)}},
            }
        if op.public:
            operation["security"] = []
        paths.setdefault(op.path, {})[op.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "halfpi Mind: the HTTP door",
            "version": __version__,
            "description": "HTTP commands, REST reads and event streams of a halfpi Mind "
                           "(docs/protocol.md §17, §18). Errors: "
                           '{"error": {"code", "message", "field"?}}; clients branch on code.',
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "a face token (halfpi face add LABEL)"}
            },
        },
    }


def render(doc: dict[str, Any]) -> str:
    """The document as one HTML page: every operation, its parameters, its
    answers and their schemas, all escaped; no script, no external link."""
    e = html.escape
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{e(doc['info']['title'])}</title>",
        "<style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;"
        "padding:0 1rem}code,pre{font:13px ui-monospace,monospace}pre{background:#f4f4f4;"
        "padding:.5rem;overflow:auto}h2{border-top:1px solid #ccc;padding-top:1rem}"
        "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2rem .5rem;"
        "text-align:left;vertical-align:top}</style></head><body>",
        f"<h1>{e(doc['info']['title'])} <small>{e(doc['info']['version'])}</small></h1>",
        f"<p>{e(doc['info']['description'])}</p>",
        f"<p>The machine-readable document: <a href='{OPENAPI_PATH}'>{OPENAPI_PATH}</a>. "
        "Authenticate with <code>Authorization: Bearer &lt;face token&gt;</code>.</p>",
        "<nav><ul>",
    ]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            out.append(f"<li><a href='#{e(op['operationId'])}'><code>{e(method.upper())} "
                       f"{e(path)}</code></a> {e(op['summary'])}</li>")
    out.append("</ul></nav>")
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            out.append(f"<h2 id='{e(op['operationId'])}'><code>{e(method.upper())} "
                       f"{e(path)}</code></h2><p>{e(op['summary'])}</p>")
            if "description" in op:
                out.append(f"<p>{e(op['description'])}</p>")
            if op["parameters"]:
                out.append("<table><tr><th>parameter</th><th>in</th><th>required</th>"
                           "<th>schema</th></tr>")
                for p in op["parameters"]:
                    out.append(f"<tr><td><code>{e(p['name'])}</code></td><td>{e(p['in'])}</td>"
                               f"<td>{'yes' if p['required'] else 'no'}</td><td><code>"
                               f"{e(json.dumps(p['schema']))}</code></td></tr>")
                out.append("</table>")
            if "requestBody" in op:
                for media, content in op["requestBody"]["content"].items():
                    out.append(f"<p>Body (<code>{e(media)}</code>): "
                               f"<code>{e(json.dumps(content['schema']))}</code></p>")
            out.append("<table><tr><th>status</th><th>answer</th></tr>")
            for status, answer in op["responses"].items():
                schemas = ", ".join(f"{media}: {json.dumps(c['schema'])}"
                                    for media, c in answer.get("content", {}).items())
                out.append(f"<tr><td>{e(status)}</td><td>{e(answer['description'])}"
                           f"<br><code>{e(schemas)}</code></td></tr>")
            out.append("</table>")
    out.append("<h2 id='schemas'>Schemas</h2>")
    for name, schema in doc["components"]["schemas"].items():
        out.append(f"<h3 id='{e(name)}'>{e(name)}</h3><pre>{e(json.dumps(schema, indent=2))}"
                   "</pre>")
    out.append("</body></html>")
    return "\n".join(out)


class Documents:
    """The document is made once per process (it depends on code only)."""

    def __init__(self) -> None:
        self._json: bytes | None = None
        self._html: str | None = None

    def json(self) -> bytes:
        if self._json is None:
            self._json = msgspec.json.encode(document())
        return self._json

    def html(self) -> str:
        if self._html is None:
            self._html = render(msgspec.json.decode(self.json()))
        return self._html

    async def openapi(self, request: Request) -> Response:
        return Response(self.json(), media_type="application/json")

    async def docs(self, request: Request) -> Response:
        return HTMLResponse(self.html())


def routes(door: Door) -> list[BaseRoute]:
    documents = Documents()
    return [
        Route(OPENAPI_PATH, documents.openapi, methods=["GET"]),
        Route(DOCS_PATH, documents.docs, methods=["GET"]),
    ]
