"""Waiting on a condition of an in-process Mind: polled, with a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Return once ``predicate()`` holds; TimeoutError after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not reached in time")
        await asyncio.sleep(0.01)
