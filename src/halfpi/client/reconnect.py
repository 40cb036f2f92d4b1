"""The one reconnect loop: ``async for link in Reconnect(...)``.

Shared by the Face SDK and the Hand (websockets' ``async for connection in
connect(...)``). Each iteration is one *welcomed* connection: the loop dials
the next URL, says hello through the caller's ``handshake`` and yields a
:class:`Link`; a failed dial or hello is a failed attempt, waited out with
the plan's backoff (:class:`~halfpi.client.redial.Redial`, pure). When the
caller's body returns — it records why in ``link.lost`` — the transport is
closed and the loop backs off and dials again.

It stops when :meth:`Reconnect.close` is called, and raises the
:class:`ConnectionLost` when the Mind refused the credential (4001/4003),
during the hello or later: retrying cannot help.

Time is injected: ``sleep`` waits (tests record it), ``clock`` stamps
``next_at``; :meth:`Reconnect.wake` cuts a wait short.

Use it closed, so the transport of a body that raised is closed too::

    async with contextlib.aclosing(reconnect.links()) as links:
        async for link in links:
            try:
                await serve(link)
            except ConnectionLost as exc:
                link.lost = exc
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from halfpi.client.redial import Delays, Locate, Redial, Retry
from halfpi.client.transport import ConnectionLost, Connector, Transport

W = TypeVar("W")


@dataclass(eq=False)
class Link(Generic[W]):
    """One welcomed connection: where, over what, and what the Mind said."""

    url: str
    transport: Transport
    welcome: W
    lost: ConnectionLost | None = None  # why it ended, set by the body

    def why(self) -> str:
        return self.lost.describe() if self.lost is not None else "the connection ended"


class Reconnect(Generic[W]):
    def __init__(
        self,
        urls: str | Iterable[str],
        connector: Connector,
        handshake: Callable[[Transport], Awaitable[W]],
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        delays: Delays | None = None,
        rng: random.Random | None = None,
        max_delay_s: float | None = None,
        on_retry: Callable[[Retry], None] | None = None,
        locate: Locate | None = None,
    ) -> None:
        self.plan = Redial(urls, delays=delays, rng=rng, max_delay_s=max_delay_s, locate=locate)
        self.connector = connector
        self.handshake = handshake
        self.sleep = sleep
        self.clock = clock
        self.on_retry = on_retry
        self.closed = False
        self._wake = asyncio.Event()

    @property
    def url(self) -> str:
        """The URL being dialed, or connected to."""
        return self.plan.url

    def wake(self) -> None:
        """Skip the rest of the current wait: dial the next URL at once."""
        self._wake.set()

    def close(self) -> None:
        """Dial no more; a wait in progress ends at once."""
        self.closed = True
        self._wake.set()

    async def links(self) -> AsyncGenerator[Link[W], None]:
        while not self.closed:
            url = self.plan.next_url()
            transport: Transport | None = None
            try:
                transport = await self.connector(url)
                welcome = await self.handshake(transport)
            except ConnectionLost as exc:
                if transport is not None:
                    await transport.close()
                if exc.refused:
                    raise
                await self._back_off(self.plan.failed(exc.describe(), self.clock()))
                continue
            if self.closed:
                await transport.close()
                return
            self.plan.welcomed()
            link = Link(url, transport, welcome)
            try:
                yield link
            finally:
                await transport.close()
            if link.lost is not None and link.lost.refused:
                raise link.lost
            await self._back_off(self.plan.failed(link.why(), self.clock()))

    def __aiter__(self) -> AsyncIterator[Link[W]]:
        return self.links()

    async def _back_off(self, retry: Retry) -> None:
        """Say where and why (``on_retry``), then wait, or until woken."""
        if self.closed:
            return
        self._wake.clear()
        if self.on_retry is not None:
            self.on_retry(retry)
        sleeper = asyncio.ensure_future(self.sleep(retry.delay))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
