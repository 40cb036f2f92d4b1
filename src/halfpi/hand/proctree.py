"""Process trees read from ``/proc`` (Linux), and how to end one for sure.

Shared by the run supervisor (``reaper.py``, which runs with ``python -I
-S`` and must start fast: standard library only, no heavy imports) and by
the Hand, which ends what a dead supervisor left (``leftovers.py``).

Ending a set of processes that may be forking meanwhile: stop them all with
SIGSTOP, wait until each one really stopped (a stopped process cannot fork;
one that was forking has finished and its child is visible), look again for
members, stop the new ones, and so on until a look finds nothing new. Then
the frozen set is signalled at once. A process stopped this way still dies
of SIGKILL, and of SIGTERM unless it handles or ignores it — so SIGTERM is
followed by SIGCONT, letting handlers run.

Elsewhere than Linux there is no ``/proc``: :func:`table` returns an empty
table and callers fall back to process groups (best effort).
"""

from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

PROC = "/proc"
MARK_VAR = "HALFPI_RUN"  # environment variable naming the run a process belongs to

# pid -> (state, ppid, session id, start time in clock ticks since boot)
Table = dict[int, tuple[str, int, int, int]]
DEAD = ("Z", "X", "x")


def available() -> bool:
    return os.path.isdir(PROC + "/self")


def stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session id, start time) of a process, or None if gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[3]), int(fields[19])


def table() -> Table:
    """Every process now (zombies included: their state says so)."""
    found: Table = {}
    try:
        entries = os.listdir(PROC)
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            info = stat(int(entry))
            if info is not None:
                found[int(entry)] = info
    return found


def descendants(roots: Iterable[int], procs: Table) -> set[int]:
    """Live processes whose parent chain reaches one of ``roots`` (roots excluded)."""
    children: dict[int, list[int]] = {}
    for pid, info in procs.items():
        children.setdefault(info[1], []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid for pid in found if procs[pid][0] not in DEAD}


def boot_id() -> str:
    try:
        with open(f"{PROC}/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return "-"


def run_mark(pid: int, start: int) -> str:
    """The value of ``HALFPI_RUN`` for a run whose supervisor is ``pid``
    started at ``start``: unique on this machine, and derivable by a Hand
    that recorded only the supervisor."""
    return f"{boot_id()}/{pid}/{start}"


def has_mark(pid: int, mark: bytes) -> bool:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as handle:
            return mark in handle.read().split(b"\0")
    except OSError:
        return False


def members(session: int | None, mark: str | None, procs: Table) -> set[int]:
    """Processes of a run whose supervisor is gone: those of its session
    (only pass ``session`` if that session cannot be another one), those
    whose environment carries its mark, and all their descendants."""
    me = os.getpid()
    wanted = f"{MARK_VAR}={mark}".encode() if mark else None
    found = {
        pid for pid, info in procs.items()
        if pid != me and info[0] not in DEAD
        and ((session is not None and info[2] == session)
             or (wanted is not None and has_mark(pid, wanted)))
    }
    return (found | descendants(found, procs)) - {me}


def run_members(supervisor: int, started: int | None, procs: Table) -> set[int]:
    """What is left of the run whose supervisor was ``supervisor`` (started
    at ``started``), the supervisor included if it still lives.

    Its session id is the supervisor's pid. Linux does not give a pid to a
    new process while a session still bears it, so if that pid is free, or
    still the supervisor's, every process of that session is the run's; if
    another process has the pid now, the run's session is long gone."""
    holder = procs.get(supervisor)
    session = supervisor if holder is None or holder[3] == started else None
    mark = run_mark(supervisor, started) if started is not None else None
    found = members(session, mark, procs)
    if holder is not None and session is not None and holder[0] not in DEAD:
        found.add(supervisor)
    return found


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or the process is gone)."""
    try:
        tasks = os.listdir(f"{PROC}/{pid}/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"{PROC}/{pid}/task/{task}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        if raw[raw.rindex(b")") + 2 : raw.rindex(b")") + 3] not in (b"T", b"t", b"Z", b"X"):
            return False
    return True


def send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def freeze(find: Callable[[], set[int]], settle_s: float = 0.5, rounds: int = 1000) -> set[int]:
    """SIGSTOP what ``find`` returns until it returns nothing new; return
    the frozen set (some may have died meanwhile). A process that does not
    stop within ``settle_s`` (uninterruptible sleep) is not waited for."""
    frozen: set[int] = set()
    for _ in range(rounds):
        new = find() - frozen
        if not new:
            break
        send(new, signal.SIGSTOP)
        frozen |= new
        deadline = time.monotonic() + settle_s
        waiting = set(new)
        while waiting and time.monotonic() < deadline:
            waiting = {pid for pid in waiting if not _stopped(pid)}
            if waiting:
                time.sleep(0.001)
    return frozen


def kill_now(find: Callable[[], set[int]], reap: Callable[[], object] = lambda: None,
             rounds: int = 20) -> set[int]:
    """Freeze and SIGKILL what ``find`` returns until nothing is left (or
    ``rounds`` tries); return every pid that was killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        frozen = freeze(find)
        if not frozen:
            break
        send(frozen, signal.SIGKILL)
        killed |= frozen
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            reap()
            if not find() & frozen:
                break
            time.sleep(0.002)
    return killed
