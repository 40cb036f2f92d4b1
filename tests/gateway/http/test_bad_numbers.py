"""A number of thousands of digits in a query string, a header or a body is
a bad number like any other: 400 ``invalid_request`` naming it, never a
500 and a traceback (Python refuses to convert more than 4,300 digits)."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

from tests.support.http_door import http_door, key

HUGE = "9" * 5000


@pytest.mark.parametrize("server", ["native", "asgi"])
async def test_integers_of_thousands_of_digits_are_invalid_requests(
    tmp_path: Path, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with http_door(tmp_path, server=server, local_hand=False) as (_, door):
        cid = await door.create_conversation()
        asks = [
            ("/v1/conversations", {"limit": HUGE}, "limit"),
            (f"/v1/conversations/{cid}", {"messages_limit": HUGE}, "messages_limit"),
            (f"/v1/conversations/{cid}/messages", {"before": HUGE}, "before"),
            (f"/v1/conversations/{cid}/messages", {"limit": HUGE}, "limit"),
            (f"/v1/conversations/{cid}/messages", {"limit": "٣"}, "limit"),  # a digit, not ASCII
        ]
        for path, params, field in asks:
            answer = await door.get(path, **params)
            assert answer.status_code == 400, (path, params, answer.text[:200])
            assert answer.json()["error"]["code"] == "invalid_request"
            assert answer.json()["error"]["field"] == field
        # A resume token whose grant's number is a digit Python cannot convert.
        token = base64.urlsafe_b64encode("1|x|p,²,y".encode() + bytes(12)).decode()
        async with httpx.AsyncClient(base_url=door.client.base_url) as anonymous:
            answer = await anonymous.get(f"/v1/conversations/{cid}/events",
                                         headers={"Last-Event-ID": token}, timeout=5)
        assert answer.status_code == 401, answer.text[:200]  # no bearer: a ticket's turn
        body = '{"limit": ' + HUGE + "}"
        answer = await door.client.post("/v1/commands/face.conversation.list", content=body,
                                        headers={"Content-Type": "application/json"})
        assert answer.status_code == 400, answer.text[:200]
        answer = await door.command("face.conversation.list", {}, idempotency_key=key(),
                                    wait=None)
        assert answer.status_code == 200
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info]
