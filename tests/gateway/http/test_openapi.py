"""The OpenAPI document and the served docs (DESIGN §9, docs/protocol.md §18):
generated from the wire's structs, covering every route of the door."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
from starlette.routing import Route

from halfpi.core import wire
from halfpi.errors import ErrorCode
from halfpi.gateway import http
from halfpi.gateway.http import commands, openapi
from halfpi.gateway.http.door import STATUS, Door
from tests.support.http_door import http_door


def door_routes() -> set[tuple[str, str]]:
    """(method, path) of every HTTP route the door serves."""
    found = set()
    for route in http.routes(Door(lambda: None)):
        assert isinstance(route, Route)
        for method in route.methods or ():
            if method != "HEAD":
                found.add((method.lower(), route.path))
    return found


def documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method, path) for path, ops in doc["paths"].items() for method in ops}


def test_the_document_describes_every_route_of_the_door() -> None:
    doc = openapi.document()
    assert doc["openapi"] == "3.1.0"
    paths = documented(doc)
    for method, path in door_routes():
        if path == "/v1/commands/{type}":
            assert {("post", f"/v1/commands/{t}") for t in commands.HTTP_COMMANDS} <= paths
        else:
            assert (method, path) in paths, (method, path)
    # The streams and tickets too (served by sse.py).
    assert {("get", "/v1/events"), ("get", "/v1/conversations/{conversation_id}/events"),
            ("post", "/v1/stream-tickets")} <= paths


def test_every_command_but_the_connections_own_is_an_http_command() -> None:
    assert set(commands.HTTP_COMMANDS) == set(wire.COMMANDS) - {
        "face.hello", "face.subscribe", "face.unsubscribe"}
    doc = openapi.document()
    for type_ in commands.HTTP_COMMANDS:
        post = doc["paths"][f"/v1/commands/{type_}"]["post"]
        key = next(p for p in post["parameters"] if p["name"] == "Idempotency-Key")
        assert key["in"] == "header"
        assert key["required"] is (type_ in wire.MUTATIONS)


def test_command_bodies_are_the_wire_structs_with_the_key_as_request_id() -> None:
    doc = openapi.document()
    schemas = doc["components"]["schemas"]
    _, generated = msgspec.json.schema_components([wire.Chat], ref_template=openapi.REF)
    wire_chat = copy.deepcopy(generated["Chat"])
    wire_chat["required"].remove("request_id")
    del wire_chat["properties"]["request_id"]
    assert schemas["Chat"] == wire_chat
    assert schemas["Chat"]["additionalProperties"] is False
    body = doc["paths"]["/v1/commands/face.chat"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Chat"}


def test_every_error_is_documented_under_the_status_of_its_code() -> None:
    doc = openapi.document()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, answer in op["responses"].items():
                if int(status) < 400:
                    continue
                schema = answer["content"]["application/json"]["schema"]
                codes = schema["properties"]["error"]["properties"]["code"]["enum"]
                assert codes, (path, status)
                for code in codes:
                    assert STATUS[ErrorCode(code)] == int(status), (method, path, code)
            if op.get("security") != []:
                assert "401" in op["responses"], (method, path)
    chat = doc["paths"]["/v1/commands/face.chat"]["post"]["responses"]
    conflicts = chat["409"]["content"]["application/json"]["schema"]
    assert set(conflicts["properties"]["error"]["properties"]["code"]["enum"]) == {
        "request_conflict", "request_in_progress", "busy"}


def test_streams_are_documented_as_event_streams() -> None:
    doc = openapi.document()
    for path in ("/v1/events", "/v1/conversations/{conversation_id}/events"):
        content = doc["paths"][path]["get"]["responses"]["200"]["content"]
        assert list(content) == ["text/event-stream"]


def test_read_parameters_are_the_wire_fields() -> None:
    doc = openapi.document()
    params = {p["name"]: p for p in doc["paths"]["/v1/conversations/{conversation_id}/messages"]
              ["get"]["parameters"]}
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 500}
    assert params["before"]["schema"] == {"type": "integer", "minimum": 1,
                                          "maximum": 2**53 - 1}
    detail = doc["paths"]["/v1/conversations/{conversation_id}"]["get"]["parameters"][1]
    assert detail["schema"] == {"enum": ["summary", "transparent"]}


def test_the_page_escapes_everything_it_shows() -> None:
    doc = openapi.document()
    doc["paths"]["/v1/hands"]["get"]["summary"] = "<script>alert(1)</script>"
    page = openapi.render(doc)
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


async def test_the_document_and_the_page_are_served_without_a_token(tmp_path: Path) -> None:
    async with http_door(tmp_path) as (_, door):
        served = await door.client.get("/v1/openapi.json", headers={"Authorization": ""})
        assert served.status_code == 200
        assert served.json() == msgspec.json.decode(msgspec.json.encode(openapi.document()))
        page = await door.client.get("/v1/docs", headers={"Authorization": ""})
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        text = page.text
        # Offline: no script, no stylesheet or image from elsewhere.
        assert "<script" not in text
        assert "http://" not in text and "https://" not in text
        for path in served.json()["paths"]:
            assert path in text
