"""The supervisor of one command run (Linux): its whole process tree ends with it.

The Hand starts one per ``exec_command`` as ``python -I -S`` (isolated, no
``site``: it starts in milliseconds), writes the run's spec on its stdin
(``marshal``, the same interpreter reads it) and keeps its stdout and stderr:
the command writes there directly. The supervisor

- makes itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process
  of the run whose parent dies — a double-forked daemon, a ``setsid``
  grandchild — is re-parented to it, never to init, so the run's processes
  are exactly those whose parent chain reaches it;
- asks for SIGTERM when the Hand dies (``PR_SET_PDEATHSIG``), even by
  ``kill -9``, and treats it like a cancel;
- starts the command in its own process group (its session stays the
  supervisor's), its environment marked ``HALFPI_RUN=<boot>/<pid>/<start>``;
  when the spec denies paths, the command is confined: in a private mount
  namespace that covers them (``mountns.py``) with Landlock on top, or, if
  no such namespace can be made, by Landlock alone (``landlock.py``);
- has its children born in a PID namespace of their own where it can
  (``pidns.py``; ``HALFPI_PIDNS=off`` turns it off): the first is the
  namespace's init, the command the next, with a ``/proc`` of that
  namespace; the init is killed last, and every process of the run with it;
- puts the command in a cgroup v2 of its own where it can make one
  (``cgroup.py``; ``HALFPI_CGROUP=off`` turns it off): the command joins it
  before it runs anything, and everything it starts is born there;
- waits for the command; then — when it exits, or on SIGTERM/SIGINT/SIGHUP
  from the Hand (cancel, timeout) — ends every remaining descendant: freezes
  them (the cgroup's freezer, else SIGSTOP to the tree until it stops
  growing), sends SIGTERM and SIGCONT, waits up to the grace (2 s) for them
  to go, then kills whatever is left (``cgroup.kill``, else freezing and
  SIGKILL), and finally sweeps: as long as the kernel says it still has a
  child (``waitpid``), something of the run lives — an orphan re-parented
  to it that no look at ``/proc`` caught — and it is found and killed; only
  then does the supervisor report and exit (an orphan left then would go
  to init);
- reports on a pipe the Hand passed (``status_fd``), one line per event::

      started <pid> <how> <cgroup> <why>
                                the command started; <how> it is confined:
                                mount, landlock, none, or - (nothing denied);
                                <cgroup> the run's cgroup, or - (none);
                                <why> not more strongly
      pids <own|-> <why>        whether it sees its run's processes alone
      failed <message>          the command could not be started
      exited <code>             its exit status (negative: killed by that signal)
      done <ended>              every descendant is gone; <ended> were still running

A run whose supervisor is gone can still be found: its processes share the
supervisor's session (unless they called ``setsid``) and carry the mark in
their environment (unless they cleared it) — see ``leftovers.py``.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import signal
import sys
import time

from halfpi.hand import cgroup, landlock, mountns, pidns, proctree

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WATCHED = {signal.SIGCHLD, *ENDING}
# waitpid's __WALL: children whose exit signal is not SIGCHLD count too (os
# has no name for it).
WALL = 0x40000000
SWEEP_S = 5.0  # how long the final sweep may try before it reports what it could not end


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


class Reaper:
    def __init__(self, spec: dict[str, object], status_fd: int) -> None:
        self.spec = spec
        self.status_fd = status_fd
        self.me = os.getpid()
        self.child = 0
        self.exit_code: int | None = None
        self.abi = 0  # Landlock's ABI version
        self.applied = "-"  # the confinement the command got (see confinement())
        self.why = ""  # why not a stronger one
        self.retry = ""  # why the mount namespace failed half-way, if it did
        self.cgroup: str | None = None  # the run's own cgroup, if it has one
        self.init = 0  # the init of the run's PID namespace, if it has one
        self.pid_view = ""  # why the command sees more than its run's processes

    # -- reporting -------------------------------------------------------------------

    def report(self, *words: object) -> None:
        line = " ".join(str(w) for w in words).replace("\n", " ") + "\n"
        try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
            os.write(self.status_fd, line.encode("utf-8", "replace"))
        except OSError:
            pass  # the Hand is gone: nobody to tell

    # -- the command -----------------------------------------------------------------

    def confinement(self) -> tuple[str, str]:
        """(the confinement to try, why not a stronger one) for the spec's
        denied paths: ``mount`` (a private mount namespace, Landlock on top),
        ``landlock`` (Landlock alone), ``none``, or ``-`` (nothing denied)."""
        if not self.spec.get("deny"):
            return "-", ""
        if not self.spec.get("landlock", True):
            return "none", "turned off (HALFPI_LANDLOCK=off)"
        self.abi = landlock.abi()
        if not self.abi:
            return "none", "Landlock is not available in this kernel"
        if not self.spec.get("mountns", True):
            return "landlock", "no mount namespace: turned off (HALFPI_MOUNTNS=off)"
        return "mount", ""

    def spawn(self, mode: str, env: dict[str, str]) -> str | None:
        """Start the command; return why it could not start, or None.

        The child reports on a pipe (close-on-exec: EOF once the command
        runs) a line per event: ``C <mode> <why>`` it is confined otherwise
        than asked, ``R <why>`` the mount namespace failed half-way (it
        exits: start again without it), ``E <why>`` the command failed,
        ``G <why>`` it could not join the run's cgroup (it runs without),
        ``P <why>`` it sees the machine's ``/proc``, not its namespace's."""
        errors_r, errors_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child execs or exits
            self._exec(mode, env, errors_w)
        self.child = pid
        os.close(errors_w)
        chunks = []
        while chunk := os.read(errors_r, 4096):
            chunks.append(chunk)
        os.close(errors_r)
        failure = None
        for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
            kind, _, text = line.partition(" ")
            if kind == "C":
                self.applied, _, self.why = text.partition(" ")
            elif kind == "R":
                self.retry = text
            elif kind == "E":
                failure = text
            elif kind == "P":
                self.pid_view = text
            elif kind == "G" and self.cgroup is not None:
                cgroup.remove(self.cgroup)
                self.cgroup = None
        return failure

    def _hide(self, deny: list[str], errors: int) -> str:
        """In the child: a private mount namespace that covers ``deny``,
        Landlock on top, no CAP_SYS_ADMIN; "" when done, why not when no
        namespace can be made (then nothing changed). Raises OSError when
        it failed half-way."""
        try:
            mountns.hide(landlock.denied_paths(deny))
        except mountns.Unavailable as exc:
            return f"no mount namespace ({exc.strerror})"
        if self.init:
            self._own_proc(errors)
        handled = landlock.handled_rights(self.abi)
        landlock.restrict_self(landlock.build(landlock.everything(handled)))
        mountns.drop_capabilities()
        return ""

    @staticmethod
    def _join(path: str, errors: int) -> None:
        """In the child, before anything else: into the run's cgroup, then
        into a cgroup namespace rooted there (where it may: root, or a user
        namespace), in which no process can move out of it."""
        try:
            cgroup.join(path)
        except OSError as exc:
            os.write(errors, f"G {exc}\n".encode("utf-8", "replace"))
            return
        # Refused without CAP_SYS_ADMIN: a command without it cannot move
        # itself to a cgroup its user may not write anyway.
        mountns.unshare(cgroup.CLONE_NEWCGROUP)

    @staticmethod
    def _own_proc(errors: int, enter: bool = False) -> None:
        """In the child, in the run's PID namespace: a ``/proc`` of that
        namespace (in a private mount namespace, entered first if asked)."""
        try:
            if enter:
                mountns.enter()
            pidns.mount_proc()
        except OSError as exc:
            os.write(errors, f"P {exc.strerror or exc}\n".encode("utf-8", "replace"))

    @staticmethod
    def _no_inspection() -> None:
        """In the child: no program it runs gets a capability that reads a
        non-dumpable process's ``environ`` or memory (the Mind's, see
        ``undumpable.py``), root included. Dropping them needs
        ``CAP_SETPCAP``: a command of an ordinary user has none anyway."""
        try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
            mountns.drop_capabilities(mountns.INSPECTING)
        except OSError:
            pass

    def _exec(self, mode: str, env: dict[str, str], errors: int) -> None:
        spec = self.spec
        command, argv = spec.get("command"), spec.get("argv")
        deny = [str(p) for p in spec.get("deny") or []]  # type: ignore[attr-defined]
        what = str(command if command is not None else argv[0])  # type: ignore[index]
        try:
            if self.cgroup is not None:
                self._join(self.cgroup, errors)
            os.setpgid(0, 0)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a command must not
                signal.signal(sig, signal.SIG_DFL)
            cwd = str(spec["cwd"]) if spec.get("cwd") else None
            if mode == "mount":
                try:
                    why = self._hide(deny, errors)
                except OSError as exc:
                    os.write(errors, f"R {exc}\n".encode("utf-8", "replace"))
                    os._exit(127)
                if why:
                    mode = "landlock"
                    os.write(errors, f"C landlock {why}\n".encode("utf-8", "replace"))
                elif cwd is None or not os.path.isabs(cwd):
                    # The covers hold for paths walked from now on; a working
                    # directory inside a denied one would lead under them.
                    try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
                        os.chdir(os.getcwd())
                    except FileNotFoundError:
                        pass  # deleted: nothing below it to reach
            if self.init and mode != "mount":
                self._own_proc(errors, enter=True)
            if cwd:
                os.chdir(cwd)
            if mode == "landlock":
                try:
                    handled = landlock.handled_rights(self.abi)
                    landlock.restrict_self(landlock.build(landlock.plan(deny, handled)))
                except OSError as exc:
                    os.write(errors, f"C none Landlock: {exc}\n".encode("utf-8", "replace"))
            if mode != "mount":  # (the namespace dropped these and more)
                self._no_inspection()
            if command is not None:
                os.execve("/bin/sh", ["/bin/sh", "-c", str(command)], env)
            else:
                args = [str(a) for a in argv]  # type: ignore[attr-defined]
                os.execvpe(args[0], args, env)
        except OSError as exc:
            os.write(errors, f"E {exc.strerror}: {what}\n".encode("utf-8", "replace"))
        except BaseException as exc:
            os.write(errors, f"E {exc!r}\n".encode("utf-8", "replace"))
        finally:
            os._exit(127)

    # -- waiting and ending ------------------------------------------------------------

    def reap(self) -> bool:
        """Reap every child that ended; True while a child still lives."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | WALL)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.child and self.exit_code is None:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.report("exited", self.exit_code)

    def wait_command(self) -> None:
        """Until the command exits or the Hand asks to end the run."""
        while self.exit_code is None:
            info = signal.sigwaitinfo(WATCHED)
            if info.si_signo != signal.SIGCHLD:
                return
            self.reap()

    def tree(self) -> set[int]:
        """The run's processes, but for its PID namespace's init."""
        return proctree.descendants((self.me,), proctree.table()) - {self.init}

    def running(self) -> bool:
        """Whether a process of the run may still live: the kernel's word
        (this subreaper has a child), or — with a PID namespace, whose init
        is a child that lives until the end — a look at ``/proc`` (the
        init's death ends whatever a look missed)."""
        children = self.reap()
        return bool(self.tree()) if self.init else children

    def pause(self, seconds: float) -> None:
        """Until a child ends, or ``seconds``."""
        signal.sigtimedwait(WATCHED, seconds)

    def end_tree(self, grace: float) -> int:
        """End every descendant (see the module docstring); return how many ran."""
        if self.cgroup is not None:
            ended = self.end_cgroup(self.cgroup, grace)
        else:
            ended = self.end_descendants(grace)
        if self.init:  # every process of the namespace dies with it, at once
            proctree.send((self.init,), signal.SIGKILL)
        self.sweep()
        if self.cgroup is not None:
            cgroup.remove(self.cgroup)
        return ended

    def end_cgroup(self, path: str, grace: float) -> int:
        """SIGTERM to every member, frozen meanwhile; the grace; ``cgroup.kill``."""
        cgroup.freeze(path)
        members = cgroup.members(path)
        proctree.send(members, signal.SIGTERM)
        proctree.send(members, signal.SIGCONT)
        cgroup.thaw(path)
        deadline = time.monotonic() + grace
        while members and (left := deadline - time.monotonic()) > 0 and cgroup.populated(path):
            self.reap()
            self.pause(min(left, 0.02))
        cgroup.kill(path)
        deadline = time.monotonic() + SWEEP_S
        while cgroup.populated(path) and time.monotonic() < deadline:
            self.reap()
            self.pause(0.005)
        return len(members)

    def end_descendants(self, grace: float) -> int:
        """SIGTERM to the frozen tree; the grace; frozen again and SIGKILL."""
        deadline = time.monotonic() + grace
        frozen = proctree.freeze(self.tree)
        while not frozen and self.running() and time.monotonic() < deadline:
            self.pause(0.001)  # a child lives that this look missed: look again
            frozen = proctree.freeze(self.tree)
        if not frozen:
            return 0
        proctree.send(frozen, signal.SIGTERM)
        proctree.send(frozen, signal.SIGCONT)
        while (left := deadline - time.monotonic()) > 0 and self.running():
            self.pause(min(left, 0.02) if self.tree() else 0.001)
        proctree.kill_now(self.tree, self.reap)
        return len(frozen)

    def sweep(self) -> None:
        """Kill until the kernel says no child is left.

        Looks at ``/proc`` are not atomic: a process forked after the list of
        ``/proc`` was read, whose parent exits before its own entry is read,
        is in no look (its parent is gone, it was not listed). It is then an
        orphan, re-parented to this subreaper: ``waitpid`` still counts it.
        Leaving now would hand it to init."""
        deadline = time.monotonic() + SWEEP_S
        while self.reap() and time.monotonic() < deadline:
            if not proctree.kill_now(self.tree, self.reap):
                self.pause(0.001)  # a look missed it: look again
        if self.reap():
            self.report("error", f"processes of the run still there after {SWEEP_S:g} s")

    def make_cgroup(self, started: int) -> str | None:
        """The run's own cgroup, made now; None where none can be made."""
        if not self.spec.get("cgroup", True):
            return None
        base = cgroup.run_base()
        if base is None:
            return None
        path = cgroup.run_path(base, self.me, started)
        try:
            cgroup.create(path)
        except OSError:
            return None
        return path

    def run(self) -> None:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != self.spec.get("parent"):
            self.report("failed", "the Hand ended before the command started")
            return  # the Hand died before the death signal was armed: run nothing
        self.applied, self.why = self.confinement()
        start = proctree.stat(self.me)
        started = start[3] if start else 0
        env = dict(os.environ)
        env[proctree.MARK_VAR] = proctree.run_mark(self.me, started)
        self.cgroup = self.make_cgroup(started)
        # Until now a SIGTERM simply ends this process (there is no command
        # yet); from now on it is a request to end the run, taken in turn.
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        if not self.spec.get("pidns", True):
            self.pid_view = "turned off (HALFPI_PIDNS=off)"
        else:
            try:
                why = pidns.enter()
            except OSError as exc:
                # Its id map refused after a child showed it could be
                # written: the namespace is made, its children need an init.
                why = ""
                self.pid_view = str(exc)
            if not why:
                self.init = pidns.start_init(self.me)
            else:
                self.pid_view = why
        failure = self.spawn(self.applied, env)
        if self.retry:  # the namespace failed half-way: the child ran nothing
            os.waitpid(self.child, 0)
            self.applied, self.why = "landlock", f"no mount namespace: {self.retry}"
            failure = self.spawn(self.applied, env)
        if failure is not None:
            os.waitpid(self.child, 0)
            self.exit_code = 127
            self.report("failed", failure)
        else:
            self.report("started", self.child, self.applied, self.cgroup or "-", self.why)
            self.report("pids", "-" if self.pid_view or not self.init else "own", self.pid_view)
            self.wait_command()
        ended = self.end_tree(float(self.spec.get("grace", 2.0)))  # type: ignore[arg-type]
        self.report("done", ended)


def main() -> None:
    spec = marshal.loads(sys.stdin.buffer.read())
    status_fd = int(spec["status_fd"])
    os.set_inheritable(status_fd, False)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the command's stdin
    os.close(devnull)
    reaper = Reaper(spec, status_fd)
    try:
        reaper.run()
    except BaseException as exc:
        reaper.report("error", repr(exc))
        try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
            reaper.end_tree(0.0)
        except BaseException:
            pass
        raise SystemExit(1) from None
