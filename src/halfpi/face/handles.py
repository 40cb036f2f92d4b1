"""What a caller holds while a command is on its way: asyncio futures.

The protocol (:mod:`halfpi.face.protocol`) says when a command is accepted,
answered or failed; the client resolves the command's :class:`Waiter`, and
the caller awaits its :class:`ChatHandle`.
"""

from __future__ import annotations

import asyncio

from halfpi.core.events import Accepted
from halfpi.face.errors import FaceError
from halfpi.face.events import Answer
from halfpi.face.results import Result


class Waiter:
    """The futures of one caller's command: its acceptance and its end."""

    __slots__ = ("accepted", "result")

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        # None: it ended without a face.accepted (a read is answered at once).
        self.accepted: asyncio.Future[Accepted | None] = loop.create_future()
        self.result: asyncio.Future[Answer] = loop.create_future()

    def accept(self, accepted: Accepted | None) -> None:
        if not self.accepted.done():
            self.accepted.set_result(accepted)

    def finish(self, value: Answer) -> None:
        self.accept(None)
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

    async def accepted(self) -> Accepted | None:
        """Its ``face.accepted`` (None if it ended without one)."""
        return await self.waiter.accepted

    async def answer(self) -> Answer:
        """How it ended: a :class:`Result`, a snapshot or a subscribe's acceptance."""
        return await self.waiter.result

    async def result(self) -> Result:
        """Its ``face.result`` (a chat's, a cancel's…)."""
        value = await self.waiter.result
        if not isinstance(value, Result):
            raise FaceError(f"{self.type} {self.request_id} ended with {type(value).__name__}, "
                            "not a face.result: await answer()")
        return value
