"""The event loop a process of halfpi runs on (docs/performance.md, "The
event loop and the HTTP parser").

asyncio's own loop by default. ``HALFPI_LOOP=uvloop`` runs on uvloop
(libuv under asyncio's API; ``pip install 'halfpi[uvloop]'``), an error if
it is missing. Measured side by side, uvloop takes 3-4 % off the Mind's
CPU per delivered event (within the noise at 10 Faces) and adds 2.1 MiB to
its resident memory, so it is not the default: the raw baselines gain
more from it than the Mind does, whose time is its own Python.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("asyncio", "uvloop")


def chosen() -> str:
    """``asyncio`` or ``uvloop``: the loop :func:`run` will use."""
    choice = os.environ.get("HALFPI_LOOP", "asyncio") or "asyncio"
    if choice not in CHOICES:
        raise ValueError(f"HALFPI_LOOP is one of {', '.join(CHOICES)}, not {choice!r}")
    return choice


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if chosen() == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            main.close()
            raise RuntimeError(
                "HALFPI_LOOP=uvloop but uvloop is not installed: pip install 'halfpi[uvloop]'"
            ) from exc
        return uvloop.run(main)
    return asyncio.run(main)
