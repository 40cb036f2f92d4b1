"""Giving freed memory back to the system after unloading (DESIGN §11:
memory follows the work, not the history).

Unloading an idle conversation frees its actor and journal window, but
glibc's allocator keeps the freed pages of its heaps for reuse: a Mind that
served 10,000 conversations and unloaded them all still held about 5 KiB
for each (``benchmarks/conversations.py``). ``malloc_trim(0)`` returns the
free pages of every arena (``madvise(MADV_DONTNEED)``), so the resident
size comes back to that of a Mind which never loaded them.

It walks every arena, so it is not free: :class:`Trimmer` runs it only
when something was unloaded since the last trim, and at most once every
``every_s`` seconds (time passed in) — at once, though, when the last
loaded actor went (the Mind is idle: the moment it matters, and no work
to slow). Elsewhere than glibc (musl, macOS)
there is nothing to call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Callable

log = logging.getLogger("halfpi.mind")

# How often at most the allocator is asked to give memory back.
TRIM_EVERY_S = 5.0


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` as a callable, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class Trimmer:
    """Counts what was unloaded and trims, guarded (see the module's docstring)."""

    __slots__ = ("_trim", "every_s", "pending", "trimmed_at", "trims")

    def __init__(self, trim: Callable[[], object] | None, every_s: float = TRIM_EVERY_S) -> None:
        self._trim = trim
        self.every_s = every_s
        self.pending = 0  # unloaded since the last trim
        self.trimmed_at = float("-inf")
        self.trims = 0

    def unloaded(self, count: int) -> None:
        self.pending += count

    def maybe_trim(self, now: float, *, idle: bool = False) -> bool:
        """Trim if something was unloaded since the last trim and the last
        one was at least ``every_s`` ago, or nothing is loaded any more
        (``idle``); True if it did."""
        if not self.pending or self._trim is None:
            return False
        if not idle and now - self.trimmed_at < self.every_s:
            return False
        self.pending = 0
        self.trimmed_at = now
        self.trims += 1
        try:
            self._trim()
        except Exception:  # a failed hint must not stop the maintenance round
            log.exception("malloc_trim failed")
        return True
