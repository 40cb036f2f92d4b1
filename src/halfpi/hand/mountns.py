"""Hide paths from a command in a private mount namespace (Linux), via ctypes.

The run supervisor (``reaper.py``) calls this in the command's process,
between ``fork`` and ``exec``, when the command must not reach some paths
(the Mind's home, token files). The process enters a mount namespace of its
own and covers each denied path there; nothing changes outside it, and
nothing else changes for the command: the directories above a denied path
(``/``, the home directory…) are the real ones, with every right.

- :func:`enter`: ``unshare(CLONE_NEWNS)`` — possible with ``CAP_SYS_ADMIN``
  (a Hand run by root); otherwise ``unshare(CLONE_NEWUSER | CLONE_NEWNS)``
  where unprivileged user namespaces are allowed, the user and group mapped
  1:1 onto themselves (``setgroups`` denied first, as the kernel asks). Then
  ``/`` is made recursively *private*, so that no cover propagates out.
- :func:`cover`: a denied directory gets a fresh, empty, read-only ``tmpfs``
  of mode 000 mounted over it; a denied file (or socket, FIFO…) gets
  ``/dev/null`` bind-mounted over it, remounted read-only and ``nodev``, so
  that opening it for reading or writing fails (``EACCES``). A cover is a
  mount point: it cannot be removed or renamed (``EBUSY``).
- :func:`drop_capabilities`: the command's bounding set loses
  ``CAP_SYS_ADMIN`` (unmounting a cover, cloning the mount tree underneath
  it with ``open_tree``, entering another namespace) and
  ``CAP_DAC_READ_SEARCH`` (``open_by_handle_at``, which opens a file by its
  inode number, past any path), and ``CAP_SYS_PTRACE`` and ``CAP_PERFMON``
  (either, like ``CAP_SYS_ADMIN``, reads a non-dumpable process's
  ``/proc/<pid>/environ``: the Mind's). A
  command run as root keeps its other powers; one run by another user has
  no capability after ``exec`` anyway.

The supervisor puts Landlock on top (``landlock.py``, every path allowed):
its domain forbids every mount operation and keeps the command out of
processes outside the run (``/proc/<pid>/root`` of a process outside the
namespace would lead around the covers). Without Landlock the namespace is
not used.

Standard library only: the run supervisor imports this with ``python -I -S``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat as statmod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
COVER_FLAGS = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
PR_CAPBSET_DROP = 24
CAP_DAC_READ_SEARCH = 2
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38  # Linux 5.8
# What lets a process read another's /proc/<pid>/environ past the owner's
# non-dumpable flag: CAP_SYS_PTRACE, and for reading alone also CAP_SYS_ADMIN
# or CAP_PERFMON (seen on Linux 6.18).
INSPECTING = (CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON)
DROPPED = (CAP_DAC_READ_SEARCH, *INSPECTING)
CAPABILITY_V3 = 0x20080522
NULL_DEVICE = "/dev/null"

_libc: ctypes.CDLL | None = None


class Unavailable(OSError):
    """No mount namespace can be made here; nothing was changed."""


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def unshare(flags: int) -> bool:
    """``unshare(2)`` (``os.unshare`` comes with Python 3.12); False when
    the kernel refuses it (nothing changed then)."""
    return bool(_lib().unshare(flags) == 0)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def raw(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    _check(_lib().mount(raw(source), raw(target), raw(fstype), ctypes.c_ulong(flags), raw(data)),
           f"mount {target}")


def write_file(path: str, text: str) -> None:
    """Write ``text`` to a kernel file (/proc, cgroupfs) in one write."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def map_ids(uid: int, gid: int) -> None:
    """In a user namespace just made: this user and group mapped onto themselves."""
    write_file("/proc/self/setgroups", "deny")  # an unprivileged gid_map needs it first
    write_file("/proc/self/uid_map", f"{uid} {uid} 1\n")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1\n")


def userns_refusal(flags: int) -> str:
    """Why this process cannot enter a user namespace (with ``flags``) and
    map its ids there, "" if it can — tried in a child that exits at once.

    A user namespace cannot be left: a process that made one and then could
    not write its id map (Ubuntu's AppArmor lets ``unshare`` succeed and
    refuses the map) would run its command as the overflow user. So the
    whole sequence — and, for a mount namespace, the private ``/`` — is
    tried first where a refusal changes nothing."""
    uid, gid = os.geteuid(), os.getegid()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - exits at once
        code = 1
        try:
            os.close(read_end)
            if _lib().unshare(CLONE_NEWUSER | flags) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            try:
                map_ids(uid, gid)
            except OSError as exc:
                raise OSError(exc.errno, f"its id map: {exc.strerror}") from None
            if flags & CLONE_NEWNS:
                _mount(None, "/", None, MS_REC | MS_PRIVATE)
            code = 0
        except OSError as exc:
            os.write(write_end, (exc.strerror or str(exc)).encode("utf-8", "replace"))
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        why = os.read(read_end, 512).decode("utf-8", "replace")
    finally:
        os.close(read_end)
    status = os.waitpid(pid, 0)[1]
    return "" if os.waitstatus_to_exitcode(status) == 0 else why or "refused"


def enter() -> str:
    """Enter a private mount namespace; say how: ``"mount"`` (``CAP_SYS_ADMIN``
    was enough) or ``"user"`` (inside a new user namespace, once a child
    showed it can be made whole: :func:`userns_refusal`). Raises
    :class:`Unavailable` when neither can be made (nothing has changed
    then), OSError when a later step failed."""
    uid, gid = os.geteuid(), os.getegid()
    libc = _lib()
    if libc.unshare(CLONE_NEWNS) == 0:
        kind = "mount"
    else:
        if why := userns_refusal(CLONE_NEWNS):
            raise Unavailable(errno.EPERM, why)
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            code = ctypes.get_errno()
            raise Unavailable(code, os.strerror(code))
        kind = "user"
        map_ids(uid, gid)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches outside
    return kind


def cover(path: str) -> bool:
    """Mount a cover over ``path`` (resolved, not a symlink); False if it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if statmod.S_ISLNK(st.st_mode):  # still a link once resolved: a loop, or it just changed
        raise OSError(errno.ELOOP, f"{path} is a symbolic link")
    if statmod.S_ISDIR(st.st_mode):
        _mount("halfpi-denied", path, "tmpfs", COVER_FLAGS, "mode=000,size=4k,nr_inodes=1")
    else:
        _mount(NULL_DEVICE, path, None, MS_BIND)
        _mount(None, path, None, MS_BIND | MS_REMOUNT | COVER_FLAGS)
    return True


def hide(paths: Iterable[str]) -> tuple[str, list[str]]:
    """Enter a private mount namespace and cover every path; (how it was
    entered, the paths covered). Paths that do not exist are skipped.
    Raises like :func:`enter` and :func:`cover`."""
    kind = enter()
    return kind, [path for path in paths if cover(path)]


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32))


def drop_capabilities(caps: Iterable[int] = DROPPED) -> None:
    """Take ``caps`` out of this process's bounding and inheritable sets: no
    program it executes gets them (root included)."""
    libc = _lib()
    caps = tuple(caps)
    for cap in caps:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, "drop a capability")  # (EINVAL: a capability this kernel lacks)
    header = _CapHeader(CAPABILITY_V3, 0)
    data = (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "capget")
    mask = [0, 0]
    for cap in caps:
        mask[cap // 32] |= 1 << (cap % 32)
    if data[0].inheritable & mask[0] or data[1].inheritable & mask[1]:
        for word in (0, 1):
            data[word].inheritable &= ~mask[word] & 0xFFFFFFFF
        _check(libc.capset(ctypes.byref(header), data), "capset")
