"""The event loop a process of halfpi runs on (docs/performance.md, "The
event loop and the HTTP parser").

uvloop (libuv under asyncio's API) where it is installed — it comes with
``pip install halfpi`` on the platforms that have its wheels — and asyncio's
own loop elsewhere, or when ``HALFPI_LOOP=asyncio`` asks for it (the
pure-Python path, which CI keeps testing). ``HALFPI_LOOP=uvloop`` insists:
a missing uvloop is then an error, not a quiet fallback.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")


def chosen() -> str:
    """``uvloop`` or ``asyncio``: the loop :func:`run` will use."""
    choice = os.environ.get("HALFPI_LOOP", "auto") or "auto"
    if choice not in CHOICES:
        raise ValueError(f"HALFPI_LOOP is one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401  (only whether it is there)
    except ImportError:
        if choice == "uvloop":
            raise
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if chosen() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
