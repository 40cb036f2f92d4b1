"""A PID namespace for each command run (Linux), where one can be made.

A command then sees only its own run's processes: in its ``/proc`` (a
fresh one, mounted in its private mount namespace) the Mind, the Hand and
every other process of the machine do not exist, so ``/proc/<mind
pid>/environ`` names nothing, and ``kill`` cannot reach them.

- :func:`enter`, in the run supervisor (``reaper.py``): ``unshare(CLONE_NEWPID)``
  — with ``CAP_SYS_ADMIN`` (a Hand run by root) — or, for an ordinary user
  where the kernel allows unprivileged user namespaces, inside a user
  namespace of its own, its user and group mapped onto themselves. The
  supervisor stays where it is; its children are born in the new namespace.
- :func:`start_init`: the first child is the namespace's init (pid 1): a
  loop that reaps the orphans of the run (they are re-parented to it, not
  to the supervisor) and ignores every signal but SIGKILL and SIGSTOP,
  which the kernel forces from outside. Killing it kills every process of
  the namespace at once: the supervisor does that last, after the grace.
  It dies with the supervisor too (``PR_SET_PDEATHSIG``).
- The command is the next child (pid 2); between ``fork`` and ``exec`` it
  enters a private mount namespace and :func:`mount_proc` mounts a
  ``/proc`` of its namespace over the machine's.

Standard library only: the supervisor imports this with ``python -I -S``.
``os.unshare`` comes with Python 3.12, ``prctl`` with none: ctypes.
"""

from __future__ import annotations

import ctypes
import os
import signal

from halfpi.hand import mountns

CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def enter() -> str:
    """Have this process's next children born in a new PID namespace;
    "" when done, else why not (nothing changed then)."""
    libc = _libc()
    if libc.unshare(CLONE_NEWPID) == 0:
        return ""
    # A user namespace cannot be left: tried whole in a child first.
    try:
        why = mountns.userns_refusal(CLONE_NEWPID)
    except OSError as exc:  # no child to try it in (a pids limit): nothing changed
        why = exc.strerror or str(exc)
    if why:
        return f"no PID namespace ({why})"
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        return f"no PID namespace ({os.strerror(ctypes.get_errno())})"
    try:  # inside a user namespace now: map its ids, or it is nobody
        mountns.map_ids(uid, gid)
    except OSError as exc:
        raise OSError(exc.errno, f"user namespace for the PID namespace: {exc.strerror}") from None
    return ""


def start_init(supervisor: int) -> int:
    """Fork the namespace's init; return its pid (as the supervisor sees it)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs until killed
        try:
            _init(supervisor)
        finally:
            os._exit(0)
    return pid


def _init(supervisor: int) -> None:
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        with open("/proc/self/stat", "rb") as handle:  # the machine's /proc: real pids
            raw = handle.read()
        if int(raw[raw.rindex(b")") + 2 :].split()[1]) != supervisor:
            return  # the supervisor died before the death signal was armed
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # hold none of the Hand's pipes open
    os.closerange(3, 65536)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        signal.sigwaitinfo({signal.SIGCHLD})
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def mount_proc() -> None:
    """In the command, in its private mount namespace and its PID namespace:
    a ``/proc`` that shows that namespace only."""
    result = _libc().mount(b"proc", b"/proc", b"proc",
                           ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), None)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount /proc: {os.strerror(code)}")
