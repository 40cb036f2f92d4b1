"""Store wrappers that let a test hold a commit in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from halfpi.store.base import TxOutcome, WriteTx


class HeldCommits:
    """Wraps the Mind's store: writes matching ``holds`` are committed at once,
    but whoever awaits them is told only on :meth:`release` — a commit still
    in flight, for as long as the test needs."""

    def __init__(self, inner: Any, holds: Callable[[WriteTx], bool]) -> None:
        self.inner = inner
        self.holds = holds
        self.held: list[tuple[asyncio.Future[TxOutcome], asyncio.Future[TxOutcome]]] = []
        self.arrived = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        committed = self.inner.write(tx)
        if not self.holds(tx):
            return committed
        told: asyncio.Future[TxOutcome] = asyncio.get_running_loop().create_future()
        self.held.append((committed, told))
        self.arrived.set()
        return told

    async def release(self) -> None:
        for committed, told in self.held:
            outcome = await committed
            if not told.done():
                told.set_result(outcome)


class SlowCommits:
    """Wraps the Mind's store: writes matching ``holds`` reach the database only
    on :meth:`release` (a slow fsync, stretched for as long as the test needs)."""

    def __init__(self, inner: Any, holds: Callable[[WriteTx], bool]) -> None:
        self.inner = inner
        self.holds = holds
        self.held: list[tuple[WriteTx, asyncio.Future[TxOutcome]]] = []
        self.arrived = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        if not self.holds(tx):
            return self.inner.write(tx)
        told: asyncio.Future[TxOutcome] = asyncio.get_running_loop().create_future()
        self.held.append((tx, told))
        self.arrived.set()
        return told

    async def release(self) -> None:
        for tx, told in self.held:
            told.set_result(await self.inner.write(tx))


class HeldReads:
    """Wraps the Mind's store: ``messages`` (the snapshot's page read) waits
    for :attr:`gate` so the test can close a connection mid-command."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.arrived = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def messages(self, *args: Any, **kwargs: Any) -> Any:
        self.arrived.set()
        await self.gate.wait()
        return await self.inner.messages(*args, **kwargs)
