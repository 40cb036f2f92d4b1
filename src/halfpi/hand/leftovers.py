"""Commands a Hand started, remembered on disk until they end.

A Hand killed with ``kill -9`` cannot kill its commands: they run in their
own process groups. The Mind declares such runs ``lost`` when the Hand comes
back as a new process — so they must not go on running either, or a person
who asks again ends up with two copies. Each command's group is recorded
here when it starts and forgotten when it ends; a starting Hand kills every
recorded group that still exists before it says hello (I11).

A group is ours if its leader is alive with the start time we recorded, or,
the leader gone, if processes of its session remain (Linux does not reuse a
pid that is still a session id). Elsewhere than Linux this is best effort.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger("halfpi.hand")

PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, int] | None:
    """(session id, start time) of a live process, from /proc."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[3]), int(fields[19])


def _session_members(sid: int) -> bool:
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None and found[0] == sid:
                return True
    return False


class Leftovers:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.groups: dict[str, tuple[int, int | None]] = {}  # run_id -> (pgid, start time)

    def spawned(self, run_id: str, pid: int) -> None:
        stat = _stat(pid)
        self.groups[run_id] = (pid, stat[1] if stat else None)
        self._save()

    def ended(self, run_id: str) -> None:
        if self.groups.pop(run_id, None) is not None:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: list(v) for k, v in self.groups.items()}))
        os.replace(tmp, self.path)

    def kill_all(self) -> int:
        """Kill the groups a previous instance recorded; return how many."""
        if self.path is None or not self.path.exists():
            return 0
        try:
            recorded = json.loads(self.path.read_text())
        except (OSError, ValueError):
            recorded = {}
        killed = 0
        for run_id, (pgid, started) in recorded.items():
            leader = _stat(pgid)
            ours = (leader is not None and leader[0] == pgid and leader[1] == started) or (
                leader is None and _session_members(pgid)
            )
            if ours:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                    killed += 1
                    log.warning("killed command of lost run %s (process group %s)", run_id, pgid)
        self.groups.clear()
        self._save()
        return killed
