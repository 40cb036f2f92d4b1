"""A cgroup v2 of its own for each command run (Linux), where the Hand can make one.

A run's processes are then exactly the members of its cgroup, whatever they
do: a child is born in its parent's cgroup, and neither ``setsid``, a
double fork nor re-parenting takes it out. Ending the run is one write to
``cgroup.kill``: the kernel kills every member, and a fork racing the kill
is killed too (Linux ≥ 5.14). ``cgroup.freeze`` stops them all at once, so
that the SIGTERM before it reaches exactly who is there.

The run supervisor (``reaper.py``) makes the cgroup as a child of its own
(the Hand's) — ``halfpi-run-<its pid>-<its start time>``, so that the Hand
can name it too — and the command joins it before it runs anything; the
supervisor stays outside. The command then enters a cgroup namespace rooted
there where it can (``unshare(CLONE_NEWCGROUP)``), so that even a root
command cannot move itself out. That needs the process's cgroup v2 directory
to be writable: a Hand run by root (outside a container that mounts
``/sys/fs/cgroup`` read-only), or a subtree delegated to its user
(systemd's ``Delegate=yes``). Elsewhere :func:`run_base` says None and the
supervisor tracks the tree as a child subreaper alone.

Standard library only: the supervisor imports this with ``python -I -S``.
"""

from __future__ import annotations

import os
import time

from halfpi.hand.mountns import write_file

PREFIX = "halfpi-run-"
CLONE_NEWCGROUP = 0x02000000


def _own_path() -> str | None:
    """This process's cgroup in the v2 hierarchy (``0::/path``)."""
    try:
        with open("/proc/self/cgroup") as handle:
            for line in handle:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass
    return None


def _mount() -> tuple[str, str] | None:
    """(mount point, root) of the cgroup v2 hierarchy, from mountinfo."""
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                dash = fields.index("-")
                if fields[dash + 1] == "cgroup2":
                    return _unescape(fields[4]), _unescape(fields[3])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _unescape(field: str) -> str:
    """mountinfo writes a space, a tab, a newline and a backslash as octal."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def run_base() -> str | None:
    """The directory under which this process can make run cgroups (its
    own cgroup v2 directory), or None where it cannot."""
    own, mount = _own_path(), _mount()
    if own is None or mount is None or own.endswith(" (deleted)"):
        return None
    point, root = mount
    if root != "/" and not (own == root or own.startswith(root + "/")):
        return None
    relative = own[len(root):] if root != "/" else own
    base = os.path.normpath(point + "/" + relative)
    if not os.path.isfile(os.path.join(base, "cgroup.procs")) or not os.access(base, os.W_OK):
        return None
    return base


def run_path(base: str, supervisor: int, started: int) -> str:
    """The cgroup of the run whose supervisor is ``supervisor``, started at ``started``."""
    return os.path.join(base, f"{PREFIX}{supervisor}-{started}")


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def create(path: str) -> None:
    """Make the run's cgroup (raises OSError where it cannot be made, or
    where the kernel cannot kill a cgroup at once: Linux before 5.14)."""
    os.mkdir(path, 0o755)
    if not os.path.isfile(os.path.join(path, "cgroup.kill")):
        remove(path)
        raise OSError(0, "no cgroup.kill (Linux before 5.14)")


def join(path: str) -> None:
    """Move the calling process into the cgroup."""
    write_file(os.path.join(path, "cgroup.procs"), "0")


def members(path: str) -> set[int]:
    try:
        return {int(pid) for pid in _read(os.path.join(path, "cgroup.procs")).split()}
    except (OSError, ValueError):
        return set()


def _events(path: str) -> dict[str, str]:
    try:
        text = _read(os.path.join(path, "cgroup.events"))
    except OSError:
        return {}
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def populated(path: str) -> bool:
    """Whether a live process is in the cgroup (a gone cgroup has none)."""
    return _events(path).get("populated", "0") != "0"


def freeze(path: str, settle_s: float = 0.5) -> None:
    """Freeze every member (none can fork until :func:`thaw`); wait until
    the kernel says it is done, at most ``settle_s`` (a process in an
    uninterruptible sleep freezes only when it wakes)."""
    try:
        write_file(os.path.join(path, "cgroup.freeze"), "1")
    except OSError:
        return
    deadline = time.monotonic() + settle_s
    while _events(path).get("frozen", "1") != "1" and time.monotonic() < deadline:
        time.sleep(0.001)


def thaw(path: str) -> None:
    try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
        write_file(os.path.join(path, "cgroup.freeze"), "0")
    except OSError:
        pass


def kill(path: str) -> None:
    """SIGKILL every member at once, forks racing the kill included."""
    try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
        write_file(os.path.join(path, "cgroup.kill"), "1")
    except OSError:
        pass  # gone already


def remove(path: str) -> bool:
    """Remove the (empty) cgroup; False if it cannot be (still populated)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def kill_and_remove(path: str, wait_s: float = 5.0) -> bool:
    """End a run's cgroup from outside its supervisor (the Hand, when the
    supervisor is gone): kill, wait until empty, remove. False if it is
    still there after ``wait_s``."""
    if not os.path.isdir(path):
        return True
    kill(path)
    deadline = time.monotonic() + wait_s
    while populated(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return remove(path)
