"""One Face connection of the conformance kit, and the failure a check
raises: plain WebSocket, read eagerly, every wait bounded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

Frame = dict[str, Any]


class CheckFailed(Exception):
    """A promise the target did not keep (the message is the table's line)."""


def expect_that(ok: bool, why: str) -> None:
    if not ok:
        raise CheckFailed(why)


class Face:
    """One Face connection through the proxy, reading eagerly into ``frames``."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[Frame] = []
        self.seen = 0
        self.arrived = asyncio.Event()
        self.reader = asyncio.create_task(self._read())
        self._n = 0

    @classmethod
    async def open(cls, url: str, token: str) -> Face:
        ws = await connect(url, max_size=None, open_timeout=5, compression=None)
        face = cls(ws)
        await face.send("face.hello", {"token": token, "protocol": 3,
                                       "client": {"name": "halfpi-conformance", "version": "1"}})
        welcome = await face.expect(lambda f: f["type"] in ("face.welcome", "face.error"))
        if welcome["type"] != "face.welcome":
            raise CheckFailed(f"hello refused: {welcome['payload'].get('code')}")
        return face

    async def close_code(self, timeout: float, still_open: str) -> int | None:
        """The code the target closed this connection with (None: no close
        frame), once it has; ``still_open`` fails the check after ``timeout``."""
        try:
            await asyncio.wait_for(asyncio.shield(self.reader), timeout)
        except TimeoutError:
            raise CheckFailed(still_open) from None
        rcvd = self.ws.protocol.close_rcvd
        return rcvd.code if rcvd is not None else None

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self.frames.append(json.loads(message))
                self.arrived.set()
        except (ConnectionClosed, OSError, ValueError):
            pass
        finally:
            self.arrived.set()

    async def send(self, type_: str, payload: dict[str, Any]) -> None:
        await self.ws.send(json.dumps({"type": type_, "payload": payload}))

    def rid(self, stem: str) -> str:
        self._n += 1
        return f"conf-{stem}-{time.monotonic_ns()}-{self._n}"

    async def expect(self, predicate: Callable[[Frame], bool], timeout: float = 5.0, *,
                     quiet: bool = False) -> Frame:
        """The next frame ``predicate`` accepts, within ``timeout`` — or,
        ``quiet``, as long as no ``timeout`` passes without any frame at all
        (a deadline set by the progress the target shows, not by its pace)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if quiet and self.seen < len(self.frames):
                deadline = loop.time() + timeout
            while self.seen < len(self.frames):
                frame = self.frames[self.seen]
                self.seen += 1
                if predicate(frame):
                    return frame
            if self.reader.done():
                raise CheckFailed("the connection closed before the expected frame")
            self.arrived.clear()
            left = deadline - loop.time()
            if left <= 0:
                raise CheckFailed("no expected frame in time")
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except TimeoutError:
                raise CheckFailed("no expected frame in time") from None

    async def answer(self, rid: str, types: tuple[str, ...] = ("face.result", "face.error"),
                     timeout: float = 5.0) -> Frame:
        return await self.expect(
            lambda f: f["type"] in types and f["payload"].get("request_id") == rid, timeout)

    async def command(self, type_: str, stem: str, **payload: Any) -> Frame:
        """Send a command; return its answer (a subscribe's is ``face.accepted``)."""
        rid = self.rid(stem)
        await self.send(type_, {"request_id": rid, **payload})
        answers = ("face.accepted", "face.error") if type_ == "face.subscribe" else (
            "face.result", "face.error", "face.snapshot")
        return await self.answer(rid, answers)

    async def conversation(self) -> str:
        made = await self.command("face.conversation.create", "conv", name="conformance")
        expect_that(made["type"] == "face.result", f"create refused: {made['payload']}")
        return str(made["payload"]["data"]["conversation_id"])

    async def close(self) -> None:
        self.reader.cancel()
        await asyncio.wait_for(self.ws.close(), 2)


async def user_messages(face: Face, cid: str, rid: str) -> int:
    snap = await face.command("face.conversation.snapshot", "snap", conversation_id=cid)
    expect_that(snap["type"] == "face.snapshot", f"snapshot refused: {snap['payload']}")
    return sum(1 for m in snap["payload"]["messages"]
               if m["role"] == "user" and m.get("request_id") == rid)


def face_url(host: str, port: int) -> str:
    return f"ws://{host}:{port}/v1/face"
