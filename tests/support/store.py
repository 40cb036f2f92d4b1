"""Store wrappers that hold, slow down or fail commits, for as long as a test needs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from halfpi.errors import StoreError
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


class FailingWrites:
    """Wraps the Mind's store: while :meth:`fail` is on, every write matching
    ``which`` fails as it does on a full disk (the future raises StoreError)
    and is recorded in :attr:`refused`; :meth:`heal` lets writes through
    again. Reads always pass."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.which: Callable[[WriteTx], bool] | None = None
        self.refused: list[WriteTx] = []
        self.refusal = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def fail(self, which: Callable[[WriteTx], bool] = lambda tx: True) -> None:
        self.which = which

    def heal(self) -> None:
        self.which = None

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        if self.which is None or not self.which(tx):
            return self.inner.write(tx)
        self.refused.append(tx)
        self.refusal.set()
        future: asyncio.Future[TxOutcome] = asyncio.get_running_loop().create_future()
        future.set_exception(StoreError("commit failed: database or disk is full"))
        return future
