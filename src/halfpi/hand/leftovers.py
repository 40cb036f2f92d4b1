"""Command runs a Hand started, remembered on disk until they end.

The Mind declares ``lost`` the runs of a Hand that comes back as a new
process (I11), so they must not go on running either, or a person who asks
again ends up with two copies. Each run's supervisor (``reaper.py``) is
recorded here when it starts — pid and start time — and forgotten when the
run ends.

Normally a killed Hand leaves nothing: the supervisors get a signal when
their parent dies and end their trees. A starting Hand still ends, before
it says hello, whatever a previous instance recorded:

- a recorded supervisor still alive (same pid *and* start time: pids are
  reused) is asked to end its run (SIGTERM, SIGCONT in case it was
  stopped) and given the grace and a margin to do so; then it is killed;
- the run's cgroup, if it had one (``cgroup.py``), is killed and removed;
- what is left of the run is then killed outright: the processes of the
  supervisor's session (valid while that session exists: Linux gives no
  new process a pid that is still a session id) and every process whose
  environment carries the run's mark ``HALFPI_RUN`` — which finds those
  that called ``setsid`` — with all their descendants.

Elsewhere than Linux a Hand cannot tell its leftovers from other processes
and leaves them. The record is private (0600 in a 0700 directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from halfpi.hand import cgroup, proctree, tree
from halfpi.private import write_private

log = logging.getLogger("halfpi.hand")

GRACE_S = 2.0 + 3.0  # the supervisor's grace, and a margin to report


class Leftovers:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}

    def spawned(self, run_id: str, pid: int) -> None:
        info = proctree.stat(pid)
        started = info[3] if info else None
        self.runs[run_id] = {"supervisor": pid, "started": started,
                             "cgroup": tree.run_cgroup(pid, started)}
        self._save()

    def ended(self, run_id: str) -> None:
        if self.runs.pop(run_id, None) is not None:
            self._save()

    def _save(self) -> None:
        if self.path is not None:
            write_private(self.path, json.dumps(self.runs).encode())

    def _load(self) -> list[tuple[str, int, int | None, str | None]]:
        """(run_id, supervisor pid, its start time, its cgroup) of each recorded run."""
        if self.path is None or not self.path.exists():
            return []
        try:
            recorded = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        runs: list[tuple[str, int, int | None, str | None]] = []
        for run_id, entry in recorded.items() if isinstance(recorded, dict) else ():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                if isinstance(entry, list):  # an earlier version: [process group, start time]
                    runs.append((run_id, int(entry[0]), entry[1], None))
                else:
                    runs.append((run_id, int(entry["supervisor"]), entry["started"],
                                 _run_cgroup(entry.get("cgroup"))))
        return runs

    async def kill_all(self) -> int:
        """End the runs a previous instance recorded; return how many had
        something left running."""
        runs = self._load()
        if not runs:
            return 0
        left = {
            run_id for run_id, pid, started, group in runs
            if proctree.run_members(pid, started, proctree.table())
            or (group is not None and cgroup.populated(group))
        }
        asked = []
        for _run_id, pid, started, _group in runs:
            info = proctree.stat(pid)
            if info is not None and info[3] == started and info[0] not in proctree.DEAD:
                for sig in (signal.SIGTERM, signal.SIGCONT):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                asked.append((pid, started))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GRACE_S
        while asked and loop.time() < deadline:
            await asyncio.sleep(0.05)  # a supervisor ending its tree
            asked = [(pid, started) for pid, started in asked if _alive(pid, started)]
        ended = 0
        for run_id, pid, started, group in runs:

            def find(pid: int = pid, started: int | None = started) -> set[int]:
                return proctree.run_members(pid, started, proctree.table())

            if group is not None:  # every member at once, wherever it went
                await asyncio.to_thread(cgroup.kill_and_remove, group)
            killed = await asyncio.to_thread(proctree.kill_now, find)
            if run_id in left or killed:
                ended += 1
                log.warning("ended the command of lost run %s (%d processes left)", run_id,
                            len(killed), extra={"run_id": run_id})
        self.runs.clear()
        self._save()
        return ended


def _run_cgroup(recorded: object) -> str | None:
    """A recorded run cgroup, only if it is one (the record is a file on disk:
    never let it name another directory to kill and remove)."""
    if not isinstance(recorded, str):
        return None
    name = os.path.basename(recorded)
    return recorded if name.startswith(cgroup.PREFIX) and "/" in recorded else None


def _alive(pid: int, started: int | None) -> bool:
    info = proctree.stat(pid)
    return info is not None and info[3] == started and info[0] not in proctree.DEAD
