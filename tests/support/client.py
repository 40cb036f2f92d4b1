"""A deliberately thin Face client for tests: raw frames over ``websockets``.

It speaks the wire protocol directly (no SDK logic) so tests see exactly
what the Mind sends. ``expect`` waits for a frame matching a predicate and
keeps everything else it read in ``seen`` for later assertions.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

Frame = dict[str, Any]
_ids = itertools.count(1)


def rid(prefix: str = "r") -> str:
    return f"{prefix}-{next(_ids)}"


class FaceClient:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.seen: list[Frame] = []
        self.welcome: Frame | None = None

    @classmethod
    async def connect(
        cls, url: str, token: str | None = None, *, hello: bool = True, **kwargs: Any
    ) -> FaceClient:
        ws = await websockets.connect(url, max_size=None, open_timeout=10, **kwargs)
        client = cls(ws)
        if hello:
            assert token is not None
            await client.hello(token)
        return client

    async def hello(self, token: str) -> Frame:
        await self.send("face.hello", {"token": token, "client": {"name": "test", "version": "0"},
                                       "protocol": 3})
        self.welcome = await self.expect(lambda f: f["type"] == "face.welcome")
        return self.welcome

    async def send(self, type_: str, payload: dict[str, Any]) -> None:
        await self.ws.send(json.dumps({"type": type_, "payload": payload}))

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def recv(self, timeout: float = 10.0) -> Frame:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        frame: Frame = json.loads(raw)
        self.seen.append(frame)
        return frame

    async def expect(self, predicate: Callable[[Frame], bool], timeout: float = 10.0) -> Frame:
        """Read until a frame matches; earlier frames stay in ``seen``."""
        for frame in self.seen:
            if predicate(frame) and not frame.get("_taken"):
                frame["_taken"] = True
                return frame
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no matching frame; last seen: {self.seen[-5:]}")
            frame = await self.recv(remaining)
            if predicate(frame):
                frame["_taken"] = True
                return frame

    async def command(self, type_: str, request_id: str | None = None, **payload: Any) -> str:
        request_id = request_id or rid(type_.rsplit(".", 1)[-1])
        await self.send(type_, {"request_id": request_id, **payload})
        return request_id

    async def reply(self, request_id: str, types: tuple[str, ...] = ("face.result", "face.error",
                                                                       "face.snapshot"),
                    timeout: float = 10.0) -> Frame:
        return await self.expect(
            lambda f: f["type"] in types and f["payload"].get("request_id") == request_id,
            timeout,
        )

    async def create_conversation(self, name: str = "test") -> str:
        request_id = await self.command("face.conversation.create", name=name)
        result = await self.reply(request_id)
        assert result["type"] == "face.result", result
        return str(result["payload"]["data"]["conversation_id"])

    async def subscribe(self, conversation_id: str, since: str | None = None,
                        **extra: Any) -> Frame:
        payload: dict[str, Any] = {"conversation_ids": [conversation_id], **extra}
        if since is not None:
            payload["since"] = {conversation_id: since}
        request_id = await self.command("face.subscribe", **payload)
        return await self.reply(request_id, ("face.accepted", "face.error"))

    async def chat_to_end(self, conversation_id: str, content: str,
                          request_id: str | None = None, timeout: float = 20.0) -> Frame:
        request_id = await self.command("face.chat", request_id, conversation_id=conversation_id,
                                        content=content)
        return await self.reply(request_id, ("face.result", "face.error"), timeout)

    def events(self, conversation_id: str | None = None) -> list[Frame]:
        return [
            f for f in self.seen
            if f["type"] in ("face.event", "face.chat.delta")
            and (conversation_id is None or f["payload"]["conversation_id"] == conversation_id)
        ]

    async def close(self) -> None:
        await self.ws.close()

    async def closed_with(self, timeout: float = 10.0) -> int | None:
        """Drain until the connection closes; return the close code received."""
        try:
            while True:
                await self.recv(timeout)
        except websockets.ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd is not None else None


def seq_of(cursor: str) -> int:
    return int(cursor.rpartition(".")[2])


async def connect_new_credential(url: str, token: str, timeout: float = 5.0) -> FaceClient:
    """Connect with a token that another process has just created.

    A Mind that learns about new credentials only by polling the store may
    refuse (4001) a hello sent right after ``halfpi face add``; retry on 4001
    until ``timeout``. Any other outcome is returned or raised at once.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        client = await FaceClient.connect(url, hello=False)
        await client.send("face.hello", {"token": token, "client": {"name": "test",
                                                                    "version": "0"},
                                         "protocol": 3})
        try:
            frame = await client.recv(max(0.1, deadline - loop.time()))
        except websockets.ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            if code == 4001 and loop.time() < deadline:
                await asyncio.sleep(0.02)  # poll interval, not synchronization
                continue
            raise
        assert frame["type"] == "face.welcome", frame
        frame["_taken"] = True
        client.welcome = frame
        return client


async def approve_next(face: FaceClient, chat_id: str) -> None:
    """Allow the next approval that ``chat_id`` asks for, and check it applied."""
    requested = await face.expect(
        lambda f: f["type"] == "face.event"
        and f["payload"]["type"] == "approval.requested"
        and f["payload"]["data"].get("request_id") == chat_id
    )
    resolve_id = await face.command(
        "face.approval.resolve",
        approval_id=requested["payload"]["data"]["approval_id"],
        decision="allow_once",
    )
    reply = await face.reply(resolve_id)
    assert reply["payload"]["data"]["outcome"] == "applied", reply
