"""A command's process tree, as the Hand starts, watches and ends it (DESIGN §8).

On Linux every command runs under its own supervisor (``reaper.py``): the
Hand talks to the supervisor only — SIGTERM (and SIGCONT) to end the run,
a pipe on which it reports how the command started and ended — and the
supervisor tracks and ends every descendant. If the supervisor itself
disappears without reporting (someone killed it), the Hand ends what the run
left: the processes of the supervisor's session and those carrying the
run's mark (``proctree.members``).

Elsewhere (no ``/proc``, no subreaper) the command runs in its own process
group, which gets SIGTERM and, after the grace, SIGKILL: best effort, a
process that leaves the group escapes, and nothing is confined.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from halfpi.hand import cgroup, proctree

log = logging.getLogger("halfpi.hand")

SUPERVISED = sys.platform == "linux"
# Never handed to a command: the Hand's own credential, a Face token.
SECRET_ENV = frozenset({"HALFPI_HAND_TOKEN", "HALFPI_TOKEN"})
# How long past the grace a supervisor may take to finish before it is killed.
MARGIN_S = 3.0


def command_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a command starts with: ``base`` (default: the Hand's,
    the tool policy passes one already scrubbed of secrets), never the
    Hand's credential nor a stale run mark."""
    source = os.environ if base is None else base
    return {k: v for k, v in source.items() if k not in SECRET_ENV and k != proctree.MARK_VAR}


def supervisor_argv() -> list[str]:
    """This interpreter, isolated and without ``site`` (fast to start), the
    package found by its path."""
    src = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {src!r}); from halfpi.hand.reaper import main; main()"
    return [sys.executable, "-I", "-S", "-c", code]


OFF = ("0", "off", "no", "false")


def landlock_wanted() -> bool:
    return os.environ.get("HALFPI_LANDLOCK", "").lower() not in OFF


def mountns_wanted() -> bool:
    return os.environ.get("HALFPI_MOUNTNS", "").lower() not in OFF


def cgroup_wanted() -> bool:
    return os.environ.get("HALFPI_CGROUP", "").lower() not in OFF


def pidns_wanted() -> bool:
    return os.environ.get("HALFPI_PIDNS", "").lower() not in OFF


def run_cgroup(supervisor: int, started: int | None) -> str | None:
    """Where the run whose supervisor is ``supervisor`` has its cgroup, if
    this process can make run cgroups (the supervisor makes it in the Hand's)."""
    base = cgroup.run_base()
    return None if base is None or started is None else cgroup.run_path(base, supervisor, started)


class CommandTree:
    """What :func:`start` returns, whichever way the command runs."""

    pid: int  # the supervisor (or, without one, the command and its group)
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    exit_code: int | None = None  # negative: killed by that signal
    exited = False  # the command's own end is known
    reported = False  # its supervisor saw the whole tree end
    # How the kernel keeps the command from its denied paths: "mount" (a
    # private mount namespace, Landlock on top), "landlock" (Landlock alone),
    # "none"; None: nothing was denied.
    confinement: str | None = None
    why_unconfined = ""  # why not more strongly
    failure: str | None = None  # it could not start
    cgroup: str | None = None  # the run's own cgroup (``cgroup.py``), if it has one
    # Whether the command saw only its run's processes (a PID namespace,
    # ``pidns.py``); None: not said (no supervisor). Why not, if not.
    own_pids: bool | None = None
    why_all_pids = ""
    ended = 0  # descendants still running when the command ended or was stopped

    async def wait(self) -> None:
        raise NotImplementedError

    def terminate(self) -> None:
        raise NotImplementedError

    async def end(self, grace: float) -> None:
        """Stop the run now; return once its supervisor (or group) is gone."""
        raise NotImplementedError

    async def sweep(self) -> int:
        """Kill what a vanished supervisor left; return how many."""
        raise NotImplementedError


async def start(command: str | None, argv: Sequence[str], cwd: str | None,
                deny_paths: Sequence[str], grace: float,
                env: Mapping[str, str] | None = None) -> CommandTree:
    """Start the command (raises OSError if that cannot even be tried)."""
    if SUPERVISED:
        return await Supervised.start(command, argv, cwd, deny_paths, grace, env)
    return await Grouped.start(command, argv, cwd, deny_paths, grace, env)


class Supervised(CommandTree):
    def __init__(self, proc: asyncio.subprocess.Process, status: asyncio.StreamReader) -> None:
        self.proc = proc
        self.pid = proc.pid
        info = proctree.stat(proc.pid)
        self.started_at = info[3] if info else 0
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout, self.stderr = proc.stdout, proc.stderr
        self._reader = asyncio.ensure_future(self._read(status))

    @classmethod
    async def start(cls, command: str | None, argv: Sequence[str], cwd: str | None,
                    deny_paths: Sequence[str], grace: float,
                    env: Mapping[str, str] | None = None) -> Supervised:
        status_r, status_w = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *supervisor_argv(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(status_w,),
                start_new_session=True,
                env=command_env(env),
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(status_r, "rb", 0)
        )
        tree = cls(proc, reader)
        spec = {
            "command": command,
            "argv": list(argv),
            "cwd": cwd,
            "deny": list(deny_paths),
            "landlock": landlock_wanted(),
            "mountns": mountns_wanted(),
            "cgroup": cgroup_wanted(),
            "pidns": pidns_wanted(),
            "grace": grace,
            "parent": os.getpid(),
            "status_fd": status_w,
        }
        assert proc.stdin is not None
        proc.stdin.write(marshal.dumps(spec))
        with contextlib.suppress(ConnectionError):  # it died at once: wait() tells
            await proc.stdin.drain()
        proc.stdin.close()
        return tree

    async def _read(self, status: asyncio.StreamReader) -> None:
        while line := await status.readline():
            kind, _, rest = line.decode("utf-8", "replace").rstrip("\n").partition(" ")
            if kind == "started":
                _, _, flags = rest.partition(" ")
                how, _, flags = flags.partition(" ")
                group, _, self.why_unconfined = flags.partition(" ")
                self.confinement = None if how == "-" else how
                self.cgroup = None if group == "-" else group
            elif kind == "pids":
                view, _, self.why_all_pids = rest.partition(" ")
                self.own_pids = view == "own"
            elif kind == "exited":
                self.exit_code, self.exited = int(rest), True
            elif kind == "failed":
                self.failure = rest
            elif kind == "done":
                self.ended, self.reported = int(rest), True
            elif kind == "error":
                log.error("the supervisor of a command failed: %s", rest)

    async def wait(self) -> None:
        # The end of its status pipe, not ``proc.wait()``: asyncio waits for
        # the output pipes too, which a process that escaped may hold.
        await asyncio.shield(self._reader)

    def terminate(self) -> None:
        if not self._reader.done() and self.proc.returncode is None:  # the pid is its own
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, sig)

    async def end(self, grace: float) -> None:
        self.terminate()
        try:
            await asyncio.wait_for(asyncio.shield(self.wait()), grace + MARGIN_S)
        except TimeoutError:
            log.warning("the supervisor %s of a command did not finish; killing it", self.pid)
            if not self._reader.done() and self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            await self.wait()

    async def sweep(self) -> int:
        def find() -> set[int]:
            return proctree.run_members(self.pid, self.started_at, proctree.table())

        def end() -> int:
            # Its cgroup first (named after the supervisor, whether or not it
            # said so before it died): every member at once, wherever it went.
            group = self.cgroup or run_cgroup(self.pid, self.started_at)
            members = cgroup.members(group) if group else set()
            if group and not cgroup.kill_and_remove(group):
                log.warning("the cgroup %s of a run could not be removed", group)
            return len(members | proctree.kill_now(find))

        return await asyncio.to_thread(end)


class Grouped(CommandTree):
    """Without a supervisor: the command leads its own process group."""

    def __init__(self, proc: asyncio.subprocess.Process, deny_paths: Sequence[str],
                 grace: float) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.grace = grace
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout, self.stderr = proc.stdout, proc.stderr
        if deny_paths:
            self.confinement, self.why_unconfined = "none", f"no confinement on {sys.platform}"

    @classmethod
    async def start(cls, command: str | None, argv: Sequence[str], cwd: str | None,
                    deny_paths: Sequence[str], grace: float,
                    env: Mapping[str, str] | None = None) -> Grouped:
        common = {
            "cwd": cwd,
            "stdin": asyncio.subprocess.DEVNULL,
            "stdout": asyncio.subprocess.PIPE,
            "stderr": asyncio.subprocess.PIPE,
            "start_new_session": True,
            "env": command_env(env),
        }
        if command is not None:
            proc = await asyncio.create_subprocess_shell(command, **common)  # type: ignore[arg-type]
        else:
            proc = await asyncio.create_subprocess_exec(*argv, **common)  # type: ignore[arg-type]
        return cls(proc, deny_paths, grace)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    async def _end_group(self, grace: float) -> None:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._group_alive() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        deadline = loop.time() + 1.0
        while self._group_alive() and loop.time() < deadline:  # dying (or a zombie)
            await asyncio.sleep(0.02)

    async def wait(self) -> None:
        # Not ``proc.wait()``: it also waits for the output pipes, which
        # what is left of the group may hold.
        while self.proc.returncode is None:
            await asyncio.sleep(0.02)
        self.exit_code, self.exited = self.proc.returncode, True
        if self._group_alive():  # what it left in its group ends with the run
            self.ended = 1
            await self._end_group(self.grace)
        self.reported = True

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGTERM)

    async def end(self, grace: float) -> None:
        await self._end_group(grace)
        while self.proc.returncode is None:
            await asyncio.sleep(0.02)
        self.exit_code, self.reported = self.proc.returncode, True

    async def sweep(self) -> int:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        return 0
