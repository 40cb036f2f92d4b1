"""A page on an allowed other Origin can use the HTTP commands and reads
(docs/protocol.md §17.5): their CORS preflights are answered for the
configured Origins and refused for others, and their answers name the
Origin back. On both servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.http_door import http_door, key

APP = "https://app.example"
EVIL = "https://evil.example"


def preflight_headers(origin: str, method: str) -> dict[str, str]:
    return {"Origin": origin, "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "authorization, content-type, idempotency-key"}


@pytest.mark.parametrize("server", ["native", "asgi"])
async def test_commands_and_reads_answer_preflights_for_allowed_origins_only(
    tmp_path: Path, server: str
) -> None:
    async with http_door(tmp_path, server=server, local_hand=False,
                         allowed_origins=(APP,)) as (_, door):
        cid = await door.create_conversation()
        routes = [("POST", "/v1/commands/face.chat"),
                  ("POST", "/v1/commands/face.conversation.create"),
                  ("GET", "/v1/conversations"), ("GET", f"/v1/conversations/{cid}"),
                  ("GET", f"/v1/conversations/{cid}/messages"), ("GET", "/v1/approvals"),
                  ("GET", "/v1/hands"), ("GET", "/v1/welcome")]
        for method, path in routes:
            allowed = await door.client.options(path, headers=preflight_headers(APP, method))
            assert allowed.status_code == 204, (path, allowed.status_code, allowed.text)
            assert allowed.headers["access-control-allow-origin"] == APP
            assert method in allowed.headers["access-control-allow-methods"]
            assert "Idempotency-Key" in allowed.headers["access-control-allow-headers"]
            assert "Origin" in allowed.headers["vary"]
            refused = await door.client.options(path, headers=preflight_headers(EVIL, method))
            assert refused.status_code == 403, (path, refused.status_code)
            assert "access-control-allow-origin" not in refused.headers
        # The answers themselves name the allowed Origin back (else the page cannot read them).
        made = await door.client.post("/v1/commands/face.conversation.create", json={},
                                      headers={"Origin": APP, "Idempotency-Key": key()})
        assert made.status_code == 200, made.text
        assert made.headers["access-control-allow-origin"] == APP
        listed = await door.client.get("/v1/conversations", headers={"Origin": APP})
        assert listed.status_code == 200
        assert listed.headers["access-control-allow-origin"] == APP
        refused = await door.client.get("/v1/conversations", headers={"Origin": EVIL})
        assert refused.status_code == 403
        assert "access-control-allow-origin" not in refused.headers
