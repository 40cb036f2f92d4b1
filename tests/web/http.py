"""Plain HTTP from a test (urllib in a thread: no client library's logic
between the test and what the Mind answers)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _fetch(url: str, method: str, body: bytes | None, headers: dict[str, str]) -> Answer:
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Answer(response.status, {k.lower(): v for k, v in response.headers.items()},
                          response.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


async def fetch(url: str, method: str = "GET", body: Any = None, *,
                headers: dict[str, str] | None = None, token: str | None = None) -> Answer:
    sent = dict(headers or {})
    raw = None
    if body is not None:
        raw = json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    return await asyncio.to_thread(_fetch, url, method, raw, sent)


def http_base(ws_url: str) -> str:
    """``ws://host:port/v1/face`` → ``http://host:port``."""
    return "http" + ws_url.removeprefix("ws").removesuffix("/v1/face")
