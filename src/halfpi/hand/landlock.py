"""Kernel confinement of a command with Landlock (Linux ≥ 5.13), via ctypes.

``exec_command`` may be given paths that the command and everything it
starts must neither read nor write (the Mind's home, token files). A shell
reaches any file by indirection, so the paths are enforced by the kernel on
the command's whole process tree, not checked in its text.

Landlock only *allows*: a ruleset handles every file-system right, and
``path_beneath`` rules grant rights on whole hierarchies (a right granted on
a directory holds for everything below it). To deny a path, everything else
is allowed:

- at each level from ``/`` down to the denied path, every *sibling* entry
  (not on the way to a denied path) gets every right — its whole hierarchy
  works as before;
- the *ancestors* themselves (``/``, ``/root``, … the directories on the
  way) get only what cannot expose a denied path, because whatever they get
  cascades into it: nothing, or the right to list directories when every
  denied path below is an existing file (a listing shows names, never
  contents). Creating, removing and renaming entries is checked on the
  parent directory and would cascade the same way (plant a symlink in the
  denied directory, delete a token), so it is never granted on an ancestor:
  *directly in an ancestor directory* a command can use the entries that
  existed when it started, but cannot create, delete or rename entries, and
  entries created there later (by anyone) are out of its reach.
- nothing is granted on a denied path: its files cannot be read, written,
  truncated or executed, a denied directory cannot be listed, and nothing
  can be created or removed in it. Its *existence* stays visible (``stat``
  and path lookups are not restricted by Landlock).

Paths are resolved (``realpath``) first; another path to the same files
through a bind mount is denied as well (found in ``/proc/self/mountinfo``);
a hard link made elsewhere *before* the run is not found (a file with more
than one link is reported in :attr:`Plan.notes`).

Under ``/proc`` no rule is needed: a process inside a Landlock domain may
not ptrace, nor open the ptrace-guarded files (``environ``, ``mem``,
``fd/``, ``maps``, ``cwd``, ``root``…) of, any process outside it — so
``/proc/<hand pid>`` is out of reach as soon as the command is confined at
all. (``cmdline`` and ``status`` stay world-readable, as for any process.)

Standard library only: the run supervisor imports this with ``python -I -S``.
"""

from __future__ import annotations

import ctypes
import os
import stat as statmod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

PROC = "/proc"
MOUNTINFO = "/proc/self/mountinfo"


class _RulesetAttr(ctypes.Structure):
    # Newer kernels know more fields; an older one accepts the larger
    # struct as long as the fields it does not know are zero.
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_libc: ctypes.CDLL | None = None


def _syscall(*args: object) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    result = int(_libc.syscall(*args))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def abi() -> int:
    """The Landlock ABI version of this kernel; 0 when Landlock is unavailable."""
    try:
        return _syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0


def handled_rights(version: int) -> int:
    """Every file-system right the given ABI version knows (all are handled)."""
    rights = (1 << 13) - 1
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    if version >= 5:
        rights |= IOCTL_DEV
    return rights


class Plan:
    """What a ruleset allows for a set of denied paths."""

    def __init__(self, handled: int) -> None:
        self.handled = handled
        self.denied: list[str] = []  # resolved, bind-mount aliases included, none below another
        self.ancestors: list[str] = []
        self.rules: list[tuple[str, int]] = []  # (path, rights)
        self.avoid: set[tuple[int, int]] = set()  # (dev, ino) that must never get a rule
        self.notes: list[str] = []


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _ancestors(path: str) -> list[str]:
    found = []
    while (parent := os.path.dirname(path)) != path:
        found.append(parent)
        path = parent
    return found


def _join(top: str, rel: str) -> str:
    # Never normpath("/" + "/x"): POSIX keeps a leading "//".
    return os.path.normpath(os.path.join(top, rel))


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str, str]]:
    """(device, root inside the file system, mount point) of each mount, in order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            mounts.append((fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return mounts


def aliases(path: str, mounts: list[tuple[str, str, str]]) -> list[str]:
    """Other paths to ``path`` through bind mounts (or other mounts of the same file system)."""
    holder = None
    for mount in mounts:  # the last, deepest mount point holding the path wins
        if _under(path, mount[2]) and (holder is None or len(mount[2]) >= len(holder[2])):
            holder = mount
    if holder is None:
        return []
    dev, root, point = holder
    inside = _join(root, os.path.relpath(path, point))
    found = []
    for other_dev, other_root, other_point in mounts:
        if other_dev == dev and _under(inside, other_root):
            alias = _join(other_point, os.path.relpath(inside, other_root))
            if alias != path:
                found.append(alias)
    return found


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def denied_paths(deny: Iterable[str], mountinfo: str | None = None) -> list[str]:
    """The paths to deny for ``deny``: resolved, with their bind-mount
    aliases, none below another, none under ``/proc`` (the domain itself
    keeps the command out of other processes)."""
    if mountinfo is None:
        try:
            with open(MOUNTINFO) as handle:
                mountinfo = handle.read()
        except OSError:
            mountinfo = ""
    mounts = parse_mountinfo(mountinfo)
    denied: set[str] = set()
    for raw in deny:
        path = os.path.realpath(raw)
        if _under(path, PROC):
            continue
        denied.add(path)
        denied.update(aliases(path, mounts))
    return sorted(p for p in denied if not any(q != p and _under(p, q) for q in denied))


def everything(handled: int) -> Plan:
    """A ruleset that allows every right everywhere: its domain only forbids
    mount operations and reaching processes outside it."""
    result = Plan(handled)
    result.rules.append(("/", handled))
    return result


def plan(deny: Iterable[str], handled: int, mountinfo: str | None = None) -> Plan:
    """The rules that allow everything but ``deny`` (see the module docstring)."""
    result = Plan(handled)
    denied = set(denied_paths(deny, mountinfo))
    ancestors = {a for p in denied for a in _ancestors(p)}
    result.denied, result.ancestors = sorted(denied), sorted(ancestors)
    if not denied:
        result.rules.append(("/", handled))
        return result
    for path in denied | ancestors:
        ident = _ident(path)
        if ident is not None:
            result.avoid.add(ident)
    for path in result.denied:
        try:
            if os.stat(path).st_nlink > 1 and not os.path.isdir(path):
                result.notes.append(f"{path} has other hard links; they are not covered")
        except OSError:
            pass
    for top in result.ancestors:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            full = os.path.join(top, entry.name)
            if full in denied or full in ancestors or entry.is_symlink():
                continue  # a symlink leads to its target, which has its own rights
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in result.avoid:
                continue  # a hard link or a mount of a denied path or an ancestor
            result.rules.append((full, handled if entry.is_dir() else handled & FILE_RIGHTS))
        below = [p for p in result.denied if _under(p, top)]
        if all(os.path.lexists(p) and not os.path.isdir(p) for p in below):
            result.rules.append((top, handled & READ_DIR))
    return result


def build(p: Plan) -> int:
    """A ruleset file descriptor (close-on-exec) holding the plan's rules."""
    attr = _RulesetAttr(p.handled, 0, 0)
    ruleset = _syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                       ctypes.c_uint32(0))
    try:
        for path, rights in p.rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # gone since it was listed: nothing to allow
            try:
                st = os.fstat(fd)
                if statmod.S_ISLNK(st.st_mode):
                    continue
                if (st.st_dev, st.st_ino) in p.avoid and path not in p.ancestors:
                    continue  # replaced since it was listed
                if not statmod.S_ISDIR(st.st_mode):
                    rights &= FILE_RIGHTS
                if not rights:
                    continue
                rule = _PathBeneathAttr(rights, fd)
                try:
                    _syscall(SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                             ctypes.byref(rule), ctypes.c_uint32(0))
                except OSError as exc:
                    if exc.errno != 77:  # EBADFD: an internal file system, never mountable
                        raise
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def restrict_self(ruleset: int) -> None:
    """Enter the ruleset's domain (this thread and everything it starts).

    Without CAP_SYS_ADMIN the kernel asks for ``no_new_privs`` first: then
    set-user-ID programs (``sudo``) do not gain privileges in the command."""
    try:
        _syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    except PermissionError:
        assert _libc is not None
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise
        _syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
