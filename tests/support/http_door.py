"""The HTTP door (DESIGN §9) from a test: an ``httpx`` client on a real socket.

:class:`Door` wraps an ``httpx.AsyncClient`` whose base URL is a Mind's
``http://`` address and which sends its face token as a bearer token; its
helpers speak the door's routes directly (no SDK logic) so tests see
exactly what the Mind answers. :func:`http_door` starts an in-process Mind
(served by uvicorn, ``server="asgi"``, unless told otherwise) for it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.mind import LocalMind, local_mind

_keys = itertools.count(1)


def key(prefix: str = "k") -> str:
    """A fresh Idempotency-Key."""
    return f"{prefix}-{next(_keys)}"


def base_url(ws_url: str) -> str:
    """``ws://host:port/v1/face`` → ``http://host:port``."""
    scheme, _, rest = ws_url.partition("://")
    return ("https" if scheme == "wss" else "http") + "://" + rest.split("/", 1)[0]


class Door:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def command(self, type_: str, body: dict[str, Any] | None = None, *,
                      idempotency_key: str | None = None, wait: float | None = None,
                      token: str | None = None) -> httpx.Response:
        headers = {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        params = {} if wait is None else {"wait": str(wait)}
        return await self.client.post(f"/v1/commands/{type_}", json=body or {},
                                      headers=headers, params=params)

    async def create_conversation(self, name: str = "test") -> str:
        answer = await self.command("face.conversation.create", {"name": name},
                                    idempotency_key=key("create"))
        assert answer.status_code == 200, answer.text
        return str(answer.json()["data"]["conversation_id"])

    async def get(self, path: str, *, token: str | None = None,
                  **params: Any) -> httpx.Response:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return await self.client.get(path, params=params, headers=headers)


@contextlib.asynccontextmanager
async def door_client(url: str, token: str) -> AsyncIterator[Door]:
    """A door client for a Mind at ``url`` (its ``ws://`` or ``http://`` address)."""
    async with httpx.AsyncClient(base_url=base_url(url) if "://" in url else url,
                                 headers={"Authorization": f"Bearer {token}"},
                                 timeout=30.0) as client:
        yield Door(client)


@contextlib.asynccontextmanager
async def http_door(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[LocalMind, Door]]:
    """An in-process Mind and a door client for it."""
    overrides.setdefault("server", "asgi")
    async with local_mind(tmp_path / "home", **overrides) as lmind, \
            door_client(lmind.url, lmind.token) as door:
        yield lmind, door
