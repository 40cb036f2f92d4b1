"""The built-in tools a Hand runs: ``exec_command`` and ``read_file`` (DESIGN §8).

``exec_command`` runs the command under a supervisor that tracks every
descendant, so cancel, timeout and the command's own end leave nothing
running (SIGTERM, then SIGKILL after a grace; ``tree.py``, ``reaper.py``).
Output is read in chunks of at most 4 KiB and reported as progress within
the per-run bounds (1 MiB and 256 events; beyond them progress is dropped
while execution continues, and the next progress says ``gap``). Lengths and
sha256 digests always cover the full output; what is kept for display is
bounded (1 MiB per stream). The bounds hold for the *text* that travels
(UTF-8 bytes, after undecodable bytes became U+FFFD), because that is what
the Mind counts; the digest is the one it can verify
(:func:`halfpi.core.hand_wire.output_digest`).
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from halfpi.core.hand_wire import (
    CHUNK_BYTES,
    ERROR_CHARS,
    BoundedProgress,
    HandResult,
    Progress,
    combine_digests,
)
from halfpi.hand import tree

log = logging.getLogger("halfpi.hand")

CHUNK = CHUNK_BYTES
DISPLAY_BYTES = 1024 * 1024
KILL_GRACE_S = 2.0
DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 24 * 3600.0



class ToolError(Exception):
    """A tool could not run at all (bad arguments, missing file…)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


@dataclass
class Outcome:
    status: str  # succeeded | failed | cancelled | timed_out
    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    output_bytes: int = 0
    digest: str = ""
    truncated: bool = False
    error_category: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        stdout, cut_out = _text(self.stdout)
        stderr, cut_err = _text(self.stderr)
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "stdout": stdout,
            "stderr": stderr,
            "output_bytes": self.output_bytes,
            "digest": self.digest,
            "truncated": self.truncated or cut_out or cut_err,
            "error_category": self.error_category,
            "error": None if self.error is None else self.error[:ERROR_CHARS],
            **self.extra,
        }

    def result(self, run_id: str, generation: int) -> HandResult:
        """The ``hand.result`` of a run that ended so."""
        return HandResult(run_id=run_id, generation=generation, **self.to_wire())


def _text(data: bytes, limit: int = DISPLAY_BYTES) -> tuple[str, bool]:
    """Decoded for the wire, at most ``limit`` UTF-8 bytes (replacement
    characters take three); True if that cut it."""
    text = data.decode("utf-8", errors="replace")
    encoded = text.encode()
    if len(encoded) <= limit:
        return text, False
    return encoded[:limit].decode("utf-8", errors="ignore"), True


def _pieces(text: str, limit: int = CHUNK) -> list[str]:
    """``text`` cut on character boundaries into pieces of at most ``limit``
    UTF-8 bytes."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return [text]
    pieces = []
    while encoded:
        cut = limit
        while cut < len(encoded) and (encoded[cut] & 0xC0) == 0x80:
            cut -= 1  # not inside a character
        pieces.append(encoded[:cut].decode())
        encoded = encoded[cut:]
    return pieces


class ProgressGate(BoundedProgress):
    """Applies the per-run progress bounds to a command's raw output."""

    def __init__(self, sink: Progress) -> None:
        super().__init__(sink)
        # One incremental decoder per stream: a character split across two
        # reads is decoded whole, never as two replacement characters.
        self._decoders = {
            kind: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for kind in ("stdout", "stderr")
        }

    def __call__(self, kind: str, data: bytes, *, final: bool = False) -> None:
        text = self._decoders[kind].decode(data, final=final)
        if not text:
            return
        for piece in _pieces(text):
            if not self.send(kind, piece):
                return

    def close(self) -> None:
        """Flush what the decoders still hold (an incomplete last character)."""
        for kind in self._decoders:
            self(kind, b"", final=True)


class _Stream:
    def __init__(self) -> None:
        self.kept = bytearray()
        self.size = 0
        self.sha256 = hashlib.sha256()  # of the whole stream, for the digest

    def add(self, data: bytes) -> None:
        self.size += len(data)
        self.sha256.update(data)
        room = DISPLAY_BYTES - len(self.kept)
        if room > 0:
            self.kept += data[:room]


async def exec_command(
    args: dict[str, Any],
    progress: Progress,
    cancelled: asyncio.Event,
    spawned: Callable[[int], None] | None = None,
    *,
    deny_paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    output: Callable[[str, bytes], None] | None = None,
) -> Outcome:
    """Run a command; its whole process tree ends with the run (``tree.py``).

    ``output``: given every chunk of stdout and stderr as read, whole and
    before the progress bounds (a background task's log keeps it).

    ``deny_paths``: files and directories that the command and everything it
    starts can neither read nor write (a private mount namespace and
    Landlock, ``mountns.py``, ``landlock.py``); the result says ``confined``
    and ``confinement`` when some were given. ``env``: the environment
    the command starts with (default the Hand's; the tool policy passes one
    scrubbed of secrets), never with the Hand's credential in it."""
    command, argv = args.get("command"), args.get("argv")
    if (command is None) == (argv is None):
        raise ToolError("bad_arguments", "give exactly one of command (str) or argv (list)")
    if command is not None and not isinstance(command, str):
        raise ToolError("bad_arguments", "command must be a string")
    if argv is not None and (
        not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv)
    ):
        raise ToolError("bad_arguments", "argv must be a non-empty list of strings")
    argv_list: list[str] = list(argv or [])
    cwd = args.get("cwd")
    if cwd is not None and not (isinstance(cwd, str) and Path(cwd).is_dir()):
        raise ToolError("bad_arguments", f"cwd is not a directory: {cwd!r}")
    timeout = float(args.get("timeout_s") or DEFAULT_TIMEOUT_S)
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise ToolError("bad_arguments", f"timeout_s must be in (0, {MAX_TIMEOUT_S}]")
    try:
        run = await tree.start(command, argv_list, cwd, deny_paths, KILL_GRACE_S, env)
    except OSError as exc:
        raise ToolError("spawn_failed", str(exc)) from None
    if spawned is not None:
        spawned(run.pid)  # recorded so that a restarted Hand ends what this run left
    gate = ProgressGate(progress)
    streams = {"stdout": _Stream(), "stderr": _Stream()}

    async def pump(kind: str, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(CHUNK):
            streams[kind].add(chunk)
            if output is not None:
                output(kind, chunk)
            gate(kind, chunk)

    pumps: asyncio.Future[Any] = asyncio.gather(
        pump("stdout", run.stdout), pump("stderr", run.stderr)
    )
    waiter: asyncio.Future[Any] = asyncio.ensure_future(cancelled.wait())
    finished: asyncio.Future[Any] = asyncio.ensure_future(run.wait())
    status = "succeeded"
    try:
        done, _ = await asyncio.wait(
            {finished, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if finished not in done:
            if not run.exited:  # else it ended by itself and is only tidying up
                status = "cancelled" if waiter in done else "timed_out"
            await _kill_group(run)
        if not run.reported:
            # Its supervisor vanished before it saw the tree end: end it here.
            swept = await run.sweep()
            log.warning("the supervisor %s of a command vanished; ended %d processes it left",
                        run.pid, swept)
        try:
            # Whatever still holds the output pipes now is no descendant: bounded.
            await asyncio.wait_for(asyncio.shield(pumps), KILL_GRACE_S)
        except TimeoutError:
            pumps.add_done_callback(lambda f: f.cancelled() or f.exception())  # no warning
            pumps.cancel()
        gate.close()
    finally:
        waiter.cancel()
        if not finished.done():  # this task was cancelled: the supervisor ends the tree
            finished.cancel()
            run.terminate()
        if not pumps.done():  # cancelled midway: its readers go with it, unreported
            pumps.add_done_callback(lambda f: f.cancelled() or f.exception())
            pumps.cancel()
    if run.failure is not None:
        raise ToolError("spawn_failed", run.failure)
    exit_code = run.exit_code
    error = None
    if status == "succeeded" and not run.exited:
        status, error = "failed", "the command's supervisor ended before the command"
    elif status == "succeeded" and exit_code != 0:
        status = "failed"
    if run.confinement is not None:
        _say_confinement(run.confinement, run.why_unconfined)
    if run.own_pids is not None:
        _say_pids(run.own_pids, run.why_all_pids)
        _say_cgroup(run.cgroup is not None)
    out, err = streams["stdout"], streams["stderr"]
    return Outcome(
        status=status,
        exit_code=exit_code,
        stdout=bytes(out.kept),
        stderr=bytes(err.kept),
        output_bytes=out.size + err.size,
        digest=combine_digests(
            out.sha256.digest(), err.sha256.digest(), stderr_empty=err.size == 0
        ),
        truncated=out.size > len(out.kept) or err.size > len(err.kept),
        error_category=(
            "supervisor_died"
            if error
            else {"failed": "nonzero_exit", "timed_out": "timeout", "cancelled": "cancelled"}.get(
                status
            )
        ),
        error=error,
        extra={} if run.confinement is None else {
            "confined": run.confinement != "none", "confinement": run.confinement},
    )


async def _kill_group(run: tree.CommandTree) -> None:
    """End the run's whole tree now: its supervisor sends SIGTERM to every
    descendant, then SIGKILL after the grace, and reports when all are gone;
    a supervisor that does not (stopped, killed) is killed and the Hand
    ends what it left."""
    await run.end(KILL_GRACE_S)


confinement_said: set[str] = set()  # each said once per Hand process


def _say_confinement(how: str, why: str) -> None:
    """Say once per Hand process how its commands are confined."""
    if how in confinement_said:
        return
    confinement_said.add(how)
    if how == "mount":
        log.info("commands are confined by a private mount namespace and Landlock: "
                 "their denied paths are hidden")
    elif how == "landlock":
        log.warning("commands are confined by Landlock alone (%s): they cannot create, "
                    "remove or rename entries directly in a directory above a denied path",
                    why or "unknown reason")
    else:
        log.warning("commands run without kernel confinement (%s): their denied paths are "
                    "not enforced", why or "unknown reason")


def _say_pids(own: bool, why: str) -> None:
    """Say once per Hand process which processes its commands see."""
    if ("pids", own) in pids_said:
        return
    pids_said.add(("pids", own))
    if own:
        log.info("commands see only their own run's processes (a PID namespace each)")
    else:
        log.warning("commands see every process of this machine in /proc (%s): the Mind's "
                    "stay unreadable only by being non-dumpable", why or "unknown reason")


pids_said: set[tuple[str, bool]] = set()  # each said once per Hand process


def _say_cgroup(own: bool) -> None:
    """Say once per Hand process whether its runs get a cgroup of their own."""
    if ("cgroup", own) in pids_said:
        return
    pids_said.add(("cgroup", own))
    if own:
        log.info("each command runs in a cgroup of its own: all it leaves ends with the run")
    else:
        why = ("turned off (HALFPI_CGROUP=off)" if not tree.cgroup_wanted()
               else "no cgroup v2 directory this user may write")
        log.warning("commands run without a cgroup of their own (%s): what a run leaves is "
                    "found by its supervisor as a child subreaper", why)


def _open_plain(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


async def read_file(
    args: dict[str, Any],
    progress: Progress,
    cancelled: asyncio.Event,
    spawned: Callable[[int], None] | None = None,
    *,
    open_file: Callable[[str], int] = _open_plain,
) -> Outcome:
    """Read a file; ``open_file`` opens it and may refuse it: the Hand passes
    one that judges the file actually opened against its policy (so a path
    swapped after the check cannot win)."""
    path = args.get("path")
    if not isinstance(path, str) or not path:
        raise ToolError("bad_arguments", "path must be a non-empty string")
    limit = int(args.get("max_bytes") or DISPLAY_BYTES)
    if not 0 < limit <= 64 * DISPLAY_BYTES:
        raise ToolError("bad_arguments", "max_bytes out of range")

    def read() -> tuple[bytes, int, str]:
        digest = hashlib.sha256()
        kept = bytearray()
        size = 0
        fd = open_file(path)
        try:
            handle = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)  # not owned by a file object yet
            raise
        with handle:
            while chunk := handle.read(65536):
                size += len(chunk)
                digest.update(chunk)
                if len(kept) < limit:
                    kept += chunk[: limit - len(kept)]
        return bytes(kept), size, "sha256:" + digest.hexdigest()

    try:
        kept, size, digest = await asyncio.to_thread(read)
    except FileNotFoundError:
        raise ToolError("not_found", f"no such file: {path}") from None
    except IsADirectoryError:
        raise ToolError("bad_arguments", f"is a directory: {path}") from None
    except PermissionError:
        raise ToolError("permission_denied", f"permission denied: {path}") from None
    return Outcome(
        "succeeded",
        stdout=kept,
        output_bytes=size,
        digest=digest,
        truncated=size > len(kept),
        extra={"size": size},
    )


TOOLS: dict[str, Callable[..., Awaitable[Outcome]]] = {
    "exec_command": exec_command,
    "read_file": read_file,
}


async def announce_confinement(deny_paths: Sequence[str]) -> None:
    """Run ``true`` once, confined as every command will be, so that the
    Hand says at its start (once) how its commands are confined and what
    they see — not on its first real run."""
    if not tree.SUPERVISED:
        return
    try:
        await exec_command({"command": "true", "timeout_s": 30}, lambda *_: None,
                           asyncio.Event(), deny_paths=deny_paths)
    except ToolError as exc:
        log.error("a command could not be started here: %s", exc)
