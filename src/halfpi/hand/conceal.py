"""Take a secret out of what other processes can read about this one (Linux).

A Hand's token arrives in its environment (``HALFPI_HAND_TOKEN``) or on its
command line (``--token``). Both stay readable by every process of the same
user in ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline`` for the
process's whole life — the kernel shows the memory they were given at
``exec``, whatever the program does with its copies. A command confined by
Landlock cannot ptrace the Hand or read its memory, but Linux (6.18 at least) still
lets it read those two files of a process of the same user. So the Hand
overwrites the secret in place, once it has read it (like ``setproctitle``
rewrites argv): ``ps`` then shows asterisks.
"""

from __future__ import annotations

import contextlib
import ctypes

_FIELDS = {"cmdline": (45, 46), "environ": (47, 48)}  # arg_start/arg_end, env_start/env_end


def _layout() -> dict[str, tuple[int, int]]:
    with open("/proc/self/stat", "rb") as handle:
        raw = handle.read()
    fields = raw[raw.rindex(b")") + 2 :].split()
    return {name: (int(fields[a]), int(fields[b])) for name, (a, b) in _FIELDS.items()}


def conceal(secret: str) -> int:
    """Overwrite every occurrence of ``secret`` in this process's original
    command line and environment; return how many were found."""
    needle = secret.encode()
    if len(needle) < 8:
        return 0  # too short to be a credential, too likely to hit something else
    found = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for name, (start, end) in _layout().items():
            with open(f"/proc/self/{name}", "rb") as handle:
                block = handle.read()
            if len(block) > end - start:
                continue  # rewritten since exec: the kernel shows something else
            at = block.find(needle)
            while at >= 0:
                ctypes.memset(start + at, ord("*"), len(needle))
                found += 1
                at = block.find(needle, at + len(needle))
    return found
