"""What a caller holds while a command is on its way: asyncio futures.

The protocol (:mod:`halfpi.face.protocol`) says when a command is accepted,
answered or failed; the client resolves the command's :class:`Waiter`, and
the caller awaits its :class:`ChatHandle`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from halfpi.face.results import Result


class Waiter:
    """The futures of one caller's command: its acceptance and its end."""

    __slots__ = ("accepted", "result")

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.accepted: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.result: asyncio.Future[Any] = loop.create_future()

    def accept(self, payload: dict[str, Any]) -> None:
        if not self.accepted.done():
            self.accepted.set_result(payload)

    def finish(self, value: Any) -> None:
        self.accept({})
        if not self.result.done():
            self.result.set_result(value)

    def fail(self, exc: BaseException) -> None:
        for future in (self.accepted, self.result):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: callers may await only one


class ChatHandle:
    """A command on its way: await :meth:`accepted`, then :meth:`result`."""

    def __init__(self, type_: str, request_id: str, waiter: Waiter) -> None:
        self.type = type_
        self.request_id = request_id
        self.waiter = waiter

    async def accepted(self) -> dict[str, Any]:
        return await self.waiter.accepted

    async def result(self) -> Result:
        value: Result = await self.waiter.result
        return value
