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
  supervisor's), confined by Landlock when the spec denies paths
  (``landlock.py``), its environment marked ``HALFPI_RUN=<boot>/<pid>/<start>``;
- waits for the command; then — when it exits, or on SIGTERM/SIGINT/SIGHUP
  from the Hand (cancel, timeout) — ends every remaining descendant: freezes
  the tree with SIGSTOP until it stops growing, sends SIGTERM and SIGCONT,
  waits up to the grace (2 s) for them to go, then freezes and SIGKILLs
  whatever is left, and reaps them all;
- reports on a pipe the Hand passed (``status_fd``), one line per event::

      started <command pid> <confined: 1|0|-> <why not confined>
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

from halfpi.hand import landlock, proctree

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WATCHED = {signal.SIGCHLD, *ENDING}


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
        self.unconfined = ""  # why Landlock failed in the child, if it did

    # -- reporting -------------------------------------------------------------------

    def report(self, *words: object) -> None:
        line = " ".join(str(w) for w in words).replace("\n", " ") + "\n"
        try:  # noqa: SIM105 (no contextlib: the supervisor must start fast)
            os.write(self.status_fd, line.encode("utf-8", "replace"))
        except OSError:
            pass  # the Hand is gone: nobody to tell

    # -- the command -----------------------------------------------------------------

    def confine(self) -> tuple[int | None, str, str]:
        """(ruleset fd, confined flag, why not) for the spec's denied paths."""
        deny = list(self.spec.get("deny") or [])  # type: ignore[call-overload]
        if not deny:
            return None, "-", ""
        if not self.spec.get("landlock", True):
            return None, "0", "turned off (HALFPI_LANDLOCK=off)"
        version = landlock.abi()
        if not version:
            return None, "0", "Landlock is not available in this kernel"
        try:
            return landlock.build(landlock.plan(deny, landlock.handled_rights(version))), "1", ""
        except OSError as exc:
            return None, "0", f"Landlock ruleset: {exc}"

    def spawn(self, ruleset: int | None, env: dict[str, str]) -> str | None:
        """Start the command; return why it could not start, or None."""
        errors_r, errors_w = os.pipe()  # close-on-exec: EOF once the command runs
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child execs or exits
            self._exec(ruleset, env, errors_w)
        self.child = pid
        os.close(errors_w)
        chunks = []
        while chunk := os.read(errors_r, 4096):
            chunks.append(chunk)
        os.close(errors_r)
        failure = None
        for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
            kind, _, text = line.partition(" ")
            if kind == "L":
                self.unconfined = text
            elif kind == "E":
                failure = text
        return failure

    def _exec(self, ruleset: int | None, env: dict[str, str], errors: int) -> None:
        spec = self.spec
        command, argv = spec.get("command"), spec.get("argv")
        what = str(command if command is not None else argv[0])  # type: ignore[index]
        try:
            os.setpgid(0, 0)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a command must not
                signal.signal(sig, signal.SIG_DFL)
            if spec.get("cwd"):
                os.chdir(str(spec["cwd"]))
            if ruleset is not None:
                try:
                    landlock.restrict_self(ruleset)
                except OSError as exc:
                    os.write(errors, f"L Landlock: {exc}\n".encode())
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

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
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
        return proctree.descendants((self.me,), proctree.table())

    def end_tree(self, grace: float) -> int:
        """End every descendant (see the module docstring); return how many ran."""
        frozen = proctree.freeze(self.tree)
        if frozen:
            proctree.send(frozen, signal.SIGTERM)
            proctree.send(frozen, signal.SIGCONT)
            deadline = time.monotonic() + grace
            while (left := deadline - time.monotonic()) > 0:
                self.reap()
                if not self.tree():
                    break
                signal.sigtimedwait(WATCHED, min(left, 0.02))  # a child ended, or 20 ms
            proctree.kill_now(self.tree, self.reap)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the last zombies
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == self.child and self.exit_code is None:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.report("exited", self.exit_code)
            if pid == 0:
                time.sleep(0.002)
        return len(frozen)

    def run(self) -> None:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != self.spec.get("parent"):
            self.report("failed", "the Hand ended before the command started")
            return  # the Hand died before the death signal was armed: run nothing
        ruleset, confined, why = self.confine()
        start = proctree.stat(self.me)
        env = dict(os.environ)
        env[proctree.MARK_VAR] = proctree.run_mark(self.me, start[3] if start else 0)
        # Until now a SIGTERM simply ends this process (there is no command
        # yet); from now on it is a request to end the run, taken in turn.
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        failure = self.spawn(ruleset, env)
        if ruleset is not None:
            os.close(ruleset)
        if self.unconfined:
            confined, why = "0", self.unconfined
        if failure is not None:
            os.waitpid(self.child, 0)
            self.exit_code = 127
            self.report("failed", failure)
        else:
            self.report("started", self.child, confined, why)
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
