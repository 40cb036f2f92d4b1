"""Keep other processes of the same user out of the Mind's memory (Linux).

The Mind holds secrets in its memory and often in its environment (a
provider key in ``OPENAI_API_KEY``), and the commands of its local Hand run
as its user. Linux lets a process of the same user read another's
``/proc/<pid>/environ``, ``mem`` and ``cmdline`` and ptrace it — unless that
process is *non-dumpable* (``prctl(PR_SET_DUMPABLE, 0)``): then its
``/proc`` entries belong to root and reading them needs ``CAP_SYS_PTRACE``,
which a command run by an ordinary user never has and from which the Hand
drops a root command's bounding set (``hand/reaper.py``). It also means no
core dump. A program the Mind starts is dumpable again after its ``exec``.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def make_undumpable() -> bool:
    """Make this process non-dumpable; False where that is not possible
    (not Linux). The standard library has no ``prctl``: ctypes."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)


def is_dumpable() -> bool:
    if not sys.platform.startswith("linux"):
        return True
    return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
