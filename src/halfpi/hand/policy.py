"""The Hand's side of the tool policy (DESIGN §8): resolve, judge, enforce.

The rules are pure (:mod:`halfpi.core.policy`); this module gives them
resolved paths. Only the Hand can resolve a path on its own disk, so:

- ``hand.check`` (before the Mind asks a human) is answered by :meth:`HandPolicy.check`;
- every run is checked again when it starts (:meth:`HandPolicy.enforce`):
  ``deny`` is refused whatever a human decided, ``ask`` is refused unless
  the run was approved — a path that changed since the check is judged anew;
- ``read_file`` checks the file it actually opened
  (:meth:`HandPolicy.open_checked`: the kernel's name for the open
  descriptor, ``/proc/self/fd/N``), so a symlink swapped between the check
  and the open cannot win;
- a protected file is also recognised by its inode, so a hard link to it
  under another name is refused too.

``exec_command`` is checked on a best-effort basis (its ``cwd`` and every
word of its command line that resolves to a protected path): a shell can
reach a file by indirection, which only a kernel-level confinement stops.
Its children never see the Hand's secrets: :func:`scrub_environment`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from halfpi.core.hand_wire import HandPolicyInfo
from halfpi.core.policy import (
    APPROVAL_REQUIRED,
    FORBIDDEN_PATH,
    Decision,
    Rule,
    ToolPolicy,
    Verdict,
)
from halfpi.core.redact import BACKUP_MANIFEST, backup_secrets, credential_in
from halfpi.hand.executor import ToolError

# Environment variables a tool's processes never inherit from the Hand.
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY")
SECRET_PREFIX = "HALFPI_"
# Files looked at directly inside a protected directory to know their inodes.
INODES_PER_DIR = 256
# Characters a shell puts before a file name: redirections, subshells.
_SHELL_LEAD = "<>&|;(){}0123456789"
# How much of a file is looked at for a credential's shape (a token file is
# one line), and of a folder's backup manifest; how many words of a command.
SNIFF_BYTES = 64 * 1024
MANIFEST_BYTES = 64 * 1024
SNIFFED_PATHS = 64


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(SECRET_PREFIX) or any(m in upper for m in SECRET_MARKERS)


def scrub_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a tool's process gets: the Hand's, minus its secrets."""
    return {k: v for k, v in environ.items() if not is_secret_name(k)}


def without_secrets(args: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``exec_command`` arguments that run the command through ``env -u NAME…``,
    so neither it nor anything it starts inherits the Hand's secrets (nor can
    read them in ``/proc/<its pid>/environ``: ``env`` replaces itself with the
    command). Used while ``exec_command`` takes no environment of its own."""
    names = sorted(k for k in environ if is_secret_name(k))
    if not names:
        return args
    prefix = [shutil.which("env") or "/usr/bin/env"]
    for name in names:
        prefix += ["-u", name]
    rest = {k: v for k, v in args.items() if k not in ("command", "argv")}
    command, argv = args.get("command"), args.get("argv")
    if isinstance(command, str) and argv is None:
        return {**rest, "argv": [*prefix, "/bin/sh", "-c", command]}
    if isinstance(argv, list) and argv and command is None:
        return {**rest, "argv": [*prefix, "--", *argv]}
    return args  # malformed: the tool refuses it as it is


def _real(path: str | Path, base: str | None = None) -> str:
    """``realpath``; a path that cannot be resolved (a link the Hand may not
    read, such as ``/proc/1/root``) is refused with its reason, at once."""
    try:
        return os.path.realpath(os.path.join(base or os.getcwd(), os.fspath(path)))
    except ValueError:  # an embedded NUL
        raise ToolError("bad_arguments", "a path contains a NUL character") from None
    except OSError as exc:
        denied = exc.errno in (errno.EACCES, errno.EPERM)
        raise ToolError(
            "permission_denied" if denied else "bad_arguments",
            f"{os.fspath(path)} cannot be resolved ({exc.strerror or exc}): refused",
        ) from None


def _configured(path: str | Path) -> str:
    """A root or protected path as configured: resolved where it can be."""
    try:
        return _real(path)
    except ToolError:
        return os.path.abspath(path)


class HandPolicy:
    """One Hand's policy, with its paths resolved on this machine."""

    def __init__(
        self,
        roots: Iterable[str | Path] = (),
        rules: Mapping[str, Rule] | None = None,
        protected: Iterable[str | Path] = (),
        *,
        pid: int | None = None,
    ) -> None:
        resolved_roots = [_configured(r) for r in roots] or [_configured(os.getcwd())]
        self.rules = dict(rules or {})
        self.pid = os.getpid() if pid is None else pid
        self.core = ToolPolicy.build(
            resolved_roots, self.rules, [_configured(p) for p in protected], self.pid
        )

    def protect(self, paths: Iterable[str | Path]) -> None:
        """Protect more paths (the Mind names its home in ``hand.welcome``)."""
        more = [_configured(p) for p in paths]
        self.core = ToolPolicy.build(
            self.core.roots, self.rules, [*self.core.protected, *more], self.pid
        )

    def advertised(self) -> HandPolicyInfo:
        """What ``hand.hello`` tells the Mind of this policy."""
        return HandPolicyInfo(**self.core.advertised())

    def deny_paths(self) -> tuple[str, ...]:
        """What a kernel-level confinement of ``exec_command`` must refuse."""
        return (*self.core.protected, f"/proc/{self.pid}")

    def protected_roots(self) -> list[str]:
        """Roots that are themselves protected (a configuration mistake)."""
        return [r for r in self.core.roots if self.core.protection(r) is not None]

    # -- judging ---------------------------------------------------------------------

    def check(self, tool: str, args: dict[str, Any]) -> Decision:
        """The verdict for a call, on the paths as they resolve now."""
        try:
            paths, mentions = self._paths(tool, args)
        except ToolError as exc:
            return Decision(Verdict.DENY, str(exc), exc.category)
        decision = self.core.judge(tool, paths, mentions)
        if decision.verdict is Verdict.DENY:
            return decision
        inodes = self._protected_inodes()
        for path in (*paths, *mentions):
            with contextlib.suppress(OSError):
                info = os.stat(path)
                if (info.st_dev, info.st_ino) in inodes:
                    return _linked(path)
        for path in list(dict.fromkeys((*paths, *mentions)))[:SNIFFED_PATHS]:
            secret = secret_file(path)
            if secret is not None:
                return Decision(Verdict.DENY, secret, FORBIDDEN_PATH)
        return decision

    def enforce(self, tool: str, args: dict[str, Any], *, approved: bool) -> None:
        """Refuse a run the policy does not permit (raises :class:`ToolError`)."""
        _refuse_unless_permitted(self.check(tool, args), approved)

    def open_checked(self, tool: str, approved: bool, path: str) -> int:
        """Open ``path`` for reading and judge *the file opened*; its fd, or
        :class:`ToolError`. OS errors of the open itself propagate."""
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
        fd = os.open(path, flags)
        try:
            info = os.fstat(fd)
            opened = _opened_path(fd, path, info)
            decision = self.core.judge(tool, [opened])
            if decision.verdict is not Verdict.DENY and (
                (info.st_dev, info.st_ino) in self._protected_inodes()
            ):
                decision = _linked(opened)
            if decision.verdict is not Verdict.DENY and stat.S_ISREG(info.st_mode):
                secret = _backup_secret(opened) or _holds_credential(
                    opened, os.pread(fd, SNIFF_BYTES, 0))
                if secret is not None:
                    decision = Decision(Verdict.DENY, secret, FORBIDDEN_PATH)
            _refuse_unless_permitted(decision, approved)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError("bad_arguments", f"not a regular file: {path}")
            os.set_blocking(fd, True)
            return fd
        except BaseException:
            os.close(fd)
            raise

    # -- what a call names --------------------------------------------------------------

    def _paths(self, tool: str, args: dict[str, Any]) -> tuple[list[str], list[str]]:
        """``(paths, mentions)``: the paths a call works on (judged against the
        roots) and the words it mentions that may be paths (protection only)."""
        if tool == "read_file":
            path = args.get("path")
            if not isinstance(path, str) or not path:
                raise ToolError("bad_arguments", "path must be a non-empty string")
            return [_real(path)], []
        if tool != "exec_command":
            return [], []
        cwd = args.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ToolError("bad_arguments", "cwd must be a string")
        base = _real(cwd or os.getcwd())
        paths, mentions = [base], []
        for word in _words(args):
            for candidate in _candidates(word):
                resolved = _real(candidate, base)
                mentions.append(resolved)
                if "/" in word:
                    paths.append(resolved)
        return paths, mentions

    def _protected_inodes(self) -> set[tuple[int, int]]:
        """(device, inode) of the protected files and of the files directly
        inside the protected directories: a hard link shares them."""
        found: set[tuple[int, int]] = set()
        for place in self.core.protected:
            with contextlib.suppress(OSError):
                info = os.stat(place)
                if stat.S_ISREG(info.st_mode):
                    found.add((info.st_dev, info.st_ino))
                    continue
                with os.scandir(place) as entries:
                    for count, entry in enumerate(entries):
                        if count >= INODES_PER_DIR:
                            break
                        with contextlib.suppress(OSError):
                            if entry.is_file(follow_symlinks=False):
                                inner = entry.stat(follow_symlinks=False)
                                found.add((inner.st_dev, inner.st_ino))
        return found


def secret_file(path: str) -> str | None:
    """Why the file (or folder) at resolved ``path`` holds a secret, or None:
    a file of a halfpi backup that its manifest calls a secret, a backup
    folder itself, or a file with a halfpi token in it — whatever their
    names, wherever they were copied."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode):
        if _manifest_secrets(path) is not None:
            return f"{path} is protected (a halfpi backup: as secret as the Mind's home)"
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    found = _backup_secret(path)
    if found is not None:
        return found
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # the tool cannot open it either
    try:
        return _holds_credential(path, os.pread(fd, SNIFF_BYTES, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


def _holds_credential(path: str, head: bytes) -> str | None:
    kind = credential_in(head)
    if kind is None:
        return None
    return f"{path} is protected (it holds a {kind}: a credential file, whatever its name)"


def _backup_secret(path: str) -> str | None:
    folder, _, name = path.rpartition("/")
    secrets = _manifest_secrets(folder or "/")
    if secrets is None or name not in secrets:
        return None
    return (f"{path} is protected (a secret of a halfpi backup, as its {BACKUP_MANIFEST} "
            "says)")


def _manifest_secrets(folder: str) -> frozenset[str] | None:
    """The secrets a halfpi backup manifest in ``folder`` lists, if it has one."""
    try:
        fd = os.open(os.path.join(folder, BACKUP_MANIFEST),
                     os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO never blocks
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.pread(fd, MANIFEST_BYTES + 1, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MANIFEST_BYTES:
        return None
    try:
        return backup_secrets(json.loads(raw))
    except ValueError:  # not JSON: no manifest of ours
        return None


def _refuse_unless_permitted(decision: Decision, approved: bool) -> None:
    if decision.permits(approved=approved):
        return
    if decision.verdict is Verdict.DENY:
        raise ToolError(decision.category or FORBIDDEN_PATH, decision.reason)
    raise ToolError(APPROVAL_REQUIRED, f"needs approval: {decision.reason}")


def _linked(path: str) -> Decision:
    return Decision(
        Verdict.DENY, f"{path} is protected (a link to a protected file)", FORBIDDEN_PATH
    )


def _opened_path(fd: int, path: str, info: os.stat_result) -> str:
    """The path of the file behind ``fd``, as the kernel names it; where there
    is no ``/proc``, the resolved path if it still is that same file."""
    with contextlib.suppress(OSError):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith("/"):
            return target.removesuffix(" (deleted)")
    resolved = _real(path)
    try:
        again = os.stat(resolved)
    except OSError:
        again = None
    if again is None or (again.st_dev, again.st_ino) != (info.st_dev, info.st_ino):
        raise ToolError(FORBIDDEN_PATH, f"{path} changed while it was opened")
    return resolved


def _words(args: dict[str, Any]) -> list[str]:
    argv, command = args.get("argv"), args.get("command")
    if isinstance(argv, list):
        return [a for a in argv if isinstance(a, str)]
    if isinstance(command, str):
        try:
            return shlex.split(command)
        except ValueError:  # unbalanced quotes: the shell refuses it too
            return command.split()
    return []


def _candidates(word: str) -> list[str]:
    """The paths a command-line word may name: itself, what follows ``=``
    (``--file=PATH``), itself without a leading redirection (``<PATH``,
    ``2>PATH``), each with ``~`` and ``$VARS`` expanded as a shell would."""
    found = {word, word.partition("=")[2], word.lstrip(_SHELL_LEAD)}
    expanded = {os.path.expanduser(os.path.expandvars(w)) for w in found}
    return sorted(w for w in found | expanded if w)
