"""Injected time for the Mind's waits: a test decides when a wait ends."""

from __future__ import annotations

import asyncio


class ManualSleep:
    """Use as ``Mind.sleep``: each wait is recorded (:attr:`delays`) and ends
    only when the test calls :meth:`advance` — no wall-clock waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._pending: list[asyncio.Future[None]] = []
        self.waiting = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.delays.append(seconds)
        self._pending.append(future)
        self.waiting.set()
        await future

    async def next_wait(self, timeout: float = 10.0) -> float:
        """Wait until something sleeps; return how long it asked for."""
        await asyncio.wait_for(self.waiting.wait(), timeout)
        return self.delays[-1]

    def advance(self) -> None:
        """Every wait in progress ends now."""
        self.waiting.clear()
        pending, self._pending = self._pending, []
        for future in pending:
            if not future.done():
                future.set_result(None)
