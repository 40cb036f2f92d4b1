"""Denied paths are enforced by the kernel on a command's whole tree.

Two layers (docs/hands.md, "Confinement"): a private mount namespace that
covers the denied paths, with Landlock on top (``mount``); where no mount
namespace can be made, Landlock alone (``landlock``), with its limits in the
directories above a denied path. Real commands through
``exec_command(..., deny_paths=...)``; the plan of Landlock rules is also
checked on its own (``landlock.plan``), without a kernel.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.hand import executor, landlock, tree
from halfpi.hand.executor import Outcome, ToolError, exec_command
from tests.support.procs import Marks

SRC = str(Path(tree.__file__).resolve().parents[2])

linux_with_landlock = pytest.mark.skipif(
    sys.platform != "linux" or landlock.abi() == 0, reason="needs Landlock")


@functools.cache
def mount_namespaces() -> str:
    """Why this process's commands cannot get a mount namespace ("" if they can)."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "from halfpi.hand import mountns; mountns.enter()")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, SRC],
                          capture_output=True, text=True, check=False)
    return done.stderr.strip().splitlines()[-1] if done.returncode else ""


@pytest.fixture
def mount_mode() -> None:
    """Commands are confined by a mount namespace with Landlock on top."""
    if sys.platform != "linux" or landlock.abi() == 0:
        pytest.skip("needs Landlock")
    if why := mount_namespaces():
        pytest.skip(f"no mount namespace can be made here: {why}")


@pytest.fixture
def landlock_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands are confined by Landlock alone (as where no mount namespace can be made)."""
    if sys.platform != "linux" or landlock.abi() == 0:
        pytest.skip("needs Landlock")
    monkeypatch.setenv("HALFPI_MOUNTNS", "off")


MOUNT = {"confined": True, "confinement": "mount"}
LANDLOCK = {"confined": True, "confinement": "landlock"}


async def run(command: str, deny_paths: list[str], cwd: Path | None = None) -> Outcome:
    args: dict[str, Any] = {"command": command}
    if cwd is not None:
        args["cwd"] = str(cwd)
    return await asyncio.wait_for(
        exec_command(args, lambda kind, text, gap: None, asyncio.Event(), deny_paths=deny_paths),
        30)


def lines(outcome: Outcome) -> list[str]:
    return outcome.stdout.decode().splitlines()


def verdicts(checks: dict[str, str]) -> str:
    """Shell text that prints ``name=allowed`` or ``name=denied`` per check."""
    return " ".join(
        f"if {cmd} >/dev/null 2>&1; then echo {name}=allowed; else echo {name}=denied; fi;"
        for name, cmd in checks.items())


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """tmp/home/{token, notes.txt, sub/deep.txt}, tmp/work/readme, tmp/a/{existing, secret/x}."""
    home = tmp_path / "home"
    (home / "sub").mkdir(parents=True)
    (home / "token").write_text("hph_secret\n")
    (home / "notes.txt").write_text("notes\n")
    (home / "sub" / "deep.txt").write_text("deep\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "readme").write_text("readme\n")
    (tmp_path / "a" / "secret").mkdir(parents=True)
    (tmp_path / "a" / "secret" / "x").write_text("x\n")
    (tmp_path / "a" / "existing").write_text("existing\n")
    return tmp_path


def intact(tree: Path) -> None:
    home = tree / "home"
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "sub", "token"]
    assert (home / "notes.txt").read_text() == "notes\n"
    assert (home / "token").read_text() == "hph_secret\n"


# -- a mount namespace hides the denied paths; everything around them works -----------------


async def test_beside_a_denied_directory_a_command_creates_renames_and_removes_files(
    files: Path, marks: Marks, mount_mode: None,
) -> None:
    """The first-hour case: the Mind's home is ~/.halfpi and a command writes
    in ~ — a new file, an editor's save-by-rename, a directory — and lists ~ and /."""
    home = files / "home"
    outcome = await run(
        marks.export()
        + f"cd {files} && echo hi > notes.txt && cat notes.txt && echo draft > .notes.swp "
        f"&& mv .notes.swp notes.txt && cat notes.txt && mkdir newdir && rmdir newdir "
        f"&& rm notes.txt && ls -A {files} && ls / | grep -cx proc",
        [str(home)])
    assert outcome.extra == MOUNT, outcome.stderr
    assert lines(outcome) == ["hi", "draft", "a", "home", "work", "1"], outcome.stderr
    assert not (files / "notes.txt").exists()
    intact(files)


async def test_a_denied_directory_shows_nothing_and_takes_nothing(
    files: Path, marks: Marks, mount_mode: None,
) -> None:
    home, work = files / "home", files / "work"
    (files / "to-home").symlink_to(home)  # made before the run: it leads to the cover
    checks = {
        "read": f"cat {home}/notes.txt",
        "read_deep": f"cat {home}/sub/deep.txt",
        "list_deep": f"ls {home}/sub",
        "write": f"echo x >> {home}/notes.txt",
        "create": f"echo x > {home}/new",
        "mkdir": f"mkdir {home}/newdir",
        "remove": f"rm {home}/notes.txt",
        "remove_dir": f"rm -r {home}",
        "rename_dir": f"mv {home} {work}/moved",
        "move_out": f"mv {home}/notes.txt {work}/stolen",
        "link_out": f"ln {home}/token {work}/hard",
        "symlink_in": f"ln -s {work}/readme {home}/planted",
        "via_symlink": f"ln -s {home}/token {work}/sym && cat {work}/sym",
        "via_old_symlink": f"cat {files}/to-home/token",
    }
    outcome = await run(
        marks.export() + verdicts(checks)
        + f" (ls -A {home}; ls -A {files}/to-home/) 2>/dev/null | wc -l",
        [str(home)])
    assert outcome.extra == MOUNT
    assert lines(outcome) == [*(f"{name}=denied" for name in checks), "0"], outcome.stderr
    assert "hph_secret" not in outcome.stdout.decode() + outcome.stderr.decode()
    intact(files)


async def test_a_denied_file_cannot_be_read_written_or_removed_while_its_sibling_can(
    files: Path, marks: Marks, mount_mode: None,
) -> None:
    token, notes = files / "home" / "token", files / "home" / "notes.txt"
    outcome = await run(
        marks.export() + f"cat {token} || echo read-denied; (echo x >> {token}) || echo "
        f"write-denied; (true > {token}) || echo truncate-denied; "
        + verdicts({"remove": f"rm -f {token}", "rename": f"mv {token} {token}.old"})
        + f" cat {notes}; echo new > {files}/home/new && cat {files}/home/new",
        [str(token)])
    assert outcome.extra == MOUNT
    assert lines(outcome) == ["read-denied", "write-denied", "truncate-denied", "remove=denied",
                              "rename=denied", "notes", "new"]
    assert outcome.stderr.decode().count("Permission denied") == 3, outcome.stderr
    assert token.read_text() == "hph_secret\n"


async def test_a_command_cannot_take_the_covers_off(
    files: Path, marks: Marks, mount_mode: None,
) -> None:
    """Landlock forbids every mount operation to the command, and a command
    run as root has lost CAP_SYS_ADMIN: no unmounting, no cloning the mount
    tree to look beneath a cover, no entering the Hand's namespace."""
    home = files / "home"
    clone = (  # open_tree(OPEN_TREE_CLONE) of /, then the token beneath the cover
        "import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
        "fd = libc.syscall(428, -100, b'/', 1); "
        "sys.exit(1) if fd < 0 else print(os.read(os.open(sys.argv[1].lstrip('/'), os.O_RDONLY, "
        "dir_fd=fd), 99))")
    checks = {
        "umount": f"umount {home}",
        "lazy_umount": f"umount -l {home}",
        "bind_over": f"mount --bind {files}/work {home}",
        "open_tree": f"{sys.executable} -I -S -c \"{clone}\" {home}/token",
        "nsenter": f"nsenter -t {os.getpid()} -m cat {home}/token",
    }
    outcome = await run(marks.export() + verdicts(checks) + f" cat {home}/token", [str(home)])
    assert outcome.extra == MOUNT
    assert lines(outcome) == [f"{name}=denied" for name in checks], outcome.stderr
    assert "hph_secret" not in outcome.stdout.decode() + outcome.stderr.decode()
    intact(files)


async def test_a_working_directory_inside_a_denied_directory_leads_to_the_cover(
    files: Path, marks: Marks, mount_mode: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether it is given (``cwd``, absolute or relative) or inherited from
    the Hand, the command starts in the cover, never beneath it (or does
    not start at all)."""
    home = files / "home"
    for hand_cwd, cwd in ((None, home), (home, None), (home, Path("sub"))):
        if hand_cwd is not None:
            monkeypatch.chdir(hand_cwd)
        try:
            outcome = await run(marks.export() + "cat token deep.txt; ls -A | wc -l",
                                [str(home)], cwd=cwd)
        except ToolError as exc:  # a user without CAP_DAC_OVERRIDE cannot enter the cover
            assert exc.category == "spawn_failed"
            continue
        assert outcome.extra == MOUNT
        assert lines(outcome) == ["0"], (hand_cwd, cwd)
        assert "hph_secret" not in outcome.stdout.decode()


def _private_mounts(code: str, env: dict[str, str]) -> dict[str, Any]:
    """Run ``code`` (which prints JSON) with the Hand's Python in a private
    mount namespace of its own, so that a bind mount it makes stays there."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1)")
    wrap = [unshare, "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        wrap[1:1] = ["--user", "--map-root-user"]
    done = subprocess.run([*wrap, sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no private mount namespace for the test: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("mode", ["mount", "landlock"])
def test_a_denied_directory_is_denied_through_a_bind_mount_of_it_too(
    files: Path, marks: Marks, mode: str,
) -> None:
    if sys.platform != "linux" or landlock.abi() == 0:
        pytest.skip("needs Landlock")
    home, alias = files / "home", files / "work" / "alias"
    alias.mkdir()
    command = marks.export() + f"cat {alias}/token || echo alias-denied; ls -A {alias} | wc -l"
    code = (
        "import asyncio, json, subprocess\n"
        "from halfpi.hand.executor import exec_command\n"
        f"subprocess.run(['mount', '--bind', {str(home)!r}, {str(alias)!r}], check=True)\n"
        f"o = asyncio.run(exec_command({{'command': {command!r}}}, lambda *a: None, "
        f"asyncio.Event(), deny_paths=[{str(home)!r}]))\n"
        "print(json.dumps({'stdout': o.stdout.decode(), 'extra': o.extra}))\n"
    )
    env = {**os.environ, "HALFPI_MOUNTNS": "on" if mode == "mount" else "off"}
    got = _private_mounts(code, env)
    assert got["extra"] == {"confined": True, "confinement": mode}
    assert got["stdout"].split() == ["alias-denied", "0"]


async def test_a_mount_namespace_that_fails_half_way_leaves_landlock_alone(
    files: Path, marks: Marks, mount_mode: None,
) -> None:
    """A denied path that cannot be covered (here a symlink loop, which
    cannot be resolved): the command starts afresh, confined by Landlock alone."""
    loop = files / "loop"
    loop.symlink_to(files / "loop2")
    (files / "loop2").symlink_to(loop)
    token = files / "home" / "token"
    outcome = await run(marks.export() + f"cat {token} || echo denied", [str(loop), str(token)])
    assert outcome.extra == LANDLOCK
    assert lines(outcome) == ["denied"]


# A seccomp filter that refuses unshare(2), as a container's default profile does.
_NO_UNSHARE = {"x86_64": (0xC000003E, 272), "aarch64": (0xC00000B7, 97)}


def _seccomp_wrapper() -> list[str]:
    arch, nr = _NO_UNSHARE[platform.machine()]
    code = f"""
import ctypes, os, struct, sys
prog = b"".join(struct.pack("HBBI", *op) for op in [
    (0x20, 0, 0, 4), (0x15, 0, 3, {arch}), (0x20, 0, 0, 0), (0x15, 0, 1, {nr}),
    (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7FFF0000)])
buf = ctypes.create_string_buffer(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0
fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()
os.execv(sys.argv[1], sys.argv[1:])
"""
    return [sys.executable, "-I", "-S", "-c", code]


async def test_where_no_mount_namespace_can_be_made_landlock_alone_confines(
    files: Path, marks: Marks, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if sys.platform != "linux" or landlock.abi() == 0 or platform.machine() not in _NO_UNSHARE:
        pytest.skip("needs Landlock, and seccomp on x86_64 or aarch64")
    real = tree.supervisor_argv()
    monkeypatch.setattr(tree, "supervisor_argv", lambda: [*_seccomp_wrapper(), *real])
    monkeypatch.setattr(executor, "confinement_said", set())
    home = files / "home"
    with caplog.at_level(logging.INFO, logger="halfpi.hand"):
        outcome = await run(marks.export() + f"cat {home}/token || echo denied", [str(home)])
    assert outcome.extra == LANDLOCK
    assert lines(outcome) == ["denied"]
    said = [r.getMessage() for r in caplog.records if "confined" in r.getMessage()]
    assert len(said) == 1 and "Landlock alone" in said[0], said
    assert "no mount namespace (Operation not permitted)" in said[0], said


async def test_the_hand_says_once_how_its_commands_are_confined(
    files: Path, marks: Marks, mount_mode: None, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(executor, "confinement_said", set())
    with caplog.at_level(logging.INFO, logger="halfpi.hand"):
        for _ in range(2):
            await run(marks.export() + "true", [str(files / "home")])
    said = [r.getMessage() for r in caplog.records if "confined" in r.getMessage()]
    assert len(said) == 1 and "mount namespace" in said[0], said


# -- an unprivileged Hand: a user namespace ------------------------------------------------

USER = 4242  # no account of that number is needed


@functools.cache
def python_for(uid: int) -> str | None:
    """A Python that ``uid`` can run and that finds this source tree."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        return None
    for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        probe = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-I",
                 "-S", "-c", f"import subprocess, sys; sys.path.insert(0, {SRC!r}); "
                 "import halfpi.hand.reaper; "
                 "subprocess.run([sys.executable, '-I', '-S', '-c', ''], check=True)"]
        try:
            if subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 0:
                return python
        except OSError:
            continue
    return None


@pytest.fixture
def unprivileged_home() -> Iterator[Path]:
    """A directory tree owned by USER that USER can reach (pytest's is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="halfpi-userns-"))
    try:
        top.chmod(0o755)
        home = top / "home"
        (home / ".halfpi").mkdir(parents=True)
        (home / ".halfpi" / "hand.token").write_text("hph_secret\n")
        for path in (home, home / ".halfpi", home / ".halfpi" / "hand.token"):
            os.chown(path, USER, USER)
        (home / ".halfpi").chmod(0o700)
        yield home
    finally:
        shutil.rmtree(top)


SUPERVISE = """
import json, marshal, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from halfpi.hand import tree
spec = json.loads(sys.argv[2])
status_r, status_w = os.pipe()
spec.update(status_fd=status_w, parent=os.getpid(), argv=[], cwd=None, landlock=True,
            mountns=True, grace=2.0)
done = subprocess.run(tree.supervisor_argv(), input=marshal.dumps(spec), capture_output=True,
                      pass_fds=(status_w,), start_new_session=True, timeout=60)
os.close(status_w)
status = os.read(status_r, 65536).decode()
print(json.dumps({"stdout": done.stdout.decode(), "stderr": done.stderr.decode(),
                  "status": status}))
"""


def test_an_unprivileged_hand_hides_denied_paths_in_a_user_namespace(
    unprivileged_home: Path, marks: Marks,
) -> None:
    """A Hand run by an ordinary user: the command's supervisor makes a user
    namespace (its user mapped onto itself) with a mount namespace inside;
    the command keeps its identity, gets no capability, and works in its
    home beside the denied one."""
    if sys.platform != "linux" or landlock.abi() == 0:
        pytest.skip("needs Landlock")
    python = python_for(USER)
    if python is None:
        pytest.skip(f"needs root, setpriv(1) and a Python that uid {USER} can run")
    home = unprivileged_home
    command = marks.export() + (
        f"id -u; cd {home} && echo hi > notes.txt && mv notes.txt kept.txt && cat kept.txt; "
        f"ls -A {home}; cat .halfpi/hand.token || echo read-denied; "
        "ls .halfpi || echo list-denied; touch .halfpi/new || echo create-denied; "
        "umount .halfpi || echo umount-denied; grep CapEff /proc/self/status"
    )
    spec = json.dumps({"command": command, "deny": [str(home / ".halfpi")]})
    done = subprocess.run(
        [shutil.which("setpriv") or "setpriv", f"--reuid={USER}", f"--regid={USER}",
         "--clear-groups", python, "-I", "-S", "-c", SUPERVISE, SRC, spec],
        capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    started = next(line for line in got["status"].splitlines() if line.startswith("started"))
    if started.split()[2] != "mount":
        pytest.skip(f"no user namespace for an ordinary user here: {started}")
    assert got["stdout"].splitlines() == [
        str(USER), "hi", ".halfpi", "kept.txt", "read-denied", "list-denied", "create-denied",
        "umount-denied", "CapEff:\t0000000000000000"], got["stderr"]
    assert (home / ".halfpi" / "hand.token").read_text() == "hph_secret\n"
    assert sorted(p.name for p in (home / ".halfpi").iterdir()) == ["hand.token"]


# -- Landlock alone (no mount namespace) ------------------------------------------------------


async def test_landlock_alone_keeps_a_denied_file_from_reading_and_writing(
    files: Path, marks: Marks, landlock_mode: None,
) -> None:
    token, notes = files / "home" / "token", files / "home" / "notes.txt"
    outcome = await run(
        marks.export() + f"cat {token} || echo read-denied; (echo x >> {token}) || echo "
        f"write-denied; (true > {token}) || echo truncate-denied; cat {notes}",
        [str(token)])
    assert outcome.extra == LANDLOCK
    assert lines(outcome) == ["read-denied", "write-denied", "truncate-denied", "notes"]
    assert outcome.stderr.decode().count("Permission denied") == 3, outcome.stderr
    assert token.read_text() == "hph_secret\n"


async def test_landlock_alone_keeps_a_denied_directory_from_listing_reading_and_writing(
    files: Path, marks: Marks, landlock_mode: None,
) -> None:
    home, work = files / "home", files / "work"
    checks = {
        "list": f"ls {home}",
        "read": f"cat {home}/notes.txt",
        "read_deep": f"cat {home}/sub/deep.txt",
        "list_deep": f"ls {home}/sub",
        "write": f"echo x >> {home}/notes.txt",
        "create": f"echo x > {home}/new",
        "mkdir": f"mkdir {home}/newdir",
        "remove": f"rm -f {home}/notes.txt",
        "move_out": f"mv {home}/notes.txt {work}/stolen",
        "link_out": f"ln {home}/token {work}/hard",
        "symlink_in": f"ln -s {work}/readme {home}/planted",
        "via_symlink": f"ln -s {home}/token {work}/sym && cat {work}/sym",
    }
    script = marks.export() + verdicts(checks)
    script += f" echo hi > {work}/mine && cat {work}/mine {work}/readme && ls {work} | wc -l"
    outcome = await run(script, [str(home)])
    assert outcome.extra == LANDLOCK
    assert lines(outcome)[: len(checks)] == [f"{name}=denied" for name in checks]
    # Everything beside it works as before.
    assert lines(outcome)[len(checks):] == ["hi", "readme", "3"], outcome.stderr
    intact(files)


async def test_landlock_alone_creates_nothing_directly_in_an_ancestor_directory(
    files: Path, marks: Marks, landlock_mode: None,
) -> None:
    """The documented limit of Landlock alone: rights on an ancestor would
    cascade into the denied path, so none that create, remove or (above a
    denied directory) list are granted there."""
    ancestor = files / "a"
    outcome = await run(
        marks.export()
        + f"cat {ancestor}/existing; echo more >> {ancestor}/existing; echo append=$?; "
        f"touch {ancestor}/new 2>/dev/null; echo create=$?; "
        f"ls {ancestor} >/dev/null 2>&1; echo list=$?; "
        f"touch {files}/work/new; echo sibling_create=$?",
        [str(ancestor / "secret")])
    assert lines(outcome) == ["existing", "append=0", "create=1", "list=2", "sibling_create=0"]
    # Above a denied *file* the directories can be listed (names, not contents).
    listed = await run(marks.export() + f"ls {files / 'home'}", [str(files / "home" / "token")])
    assert lines(listed) == ["notes.txt", "sub", "token"]


# -- both ---------------------------------------------------------------------------------


@linux_with_landlock
@pytest.mark.parametrize("mountns", ["on", "off"])
async def test_confinement_holds_for_every_descendant(
    files: Path, marks: Marks, monkeypatch: pytest.MonkeyPatch, mountns: str,
) -> None:
    monkeypatch.setenv("HALFPI_MOUNTNS", mountns)
    token = files / "home" / "token"
    outcome = await run(
        marks.export()
        + f"setsid sh -c 'cat {token} || echo setsid-denied'; "
        f"(sh -c 'cat {token} || echo daemon-denied' &); sleep 0.2; wait",
        [str(token)])
    assert outcome.extra["confined"] is True
    assert "hph_secret" not in outcome.stdout.decode()
    assert sorted(lines(outcome)) == ["daemon-denied", "setsid-denied"]


@linux_with_landlock
@pytest.mark.parametrize("mountns", ["on", "off"])
async def test_the_hands_memory_is_out_of_reach_through_proc(
    marks: Marks, monkeypatch: pytest.MonkeyPatch, mountns: str,
) -> None:
    """Outside its domain a confined command may not ptrace a process nor
    open its memory. (The environment of a process of the same user stays
    readable on this kernel: the Hand takes its token out of it, see
    test_conceal.py.)

    The process looked at has no capabilities: a command never has those
    that reach into a process with more than it has (``CAP_SYS_PTRACE``),
    so without confinement it can open this one's memory. Without a PID
    namespace (forced off), where the target is in the command's view."""
    monkeypatch.setenv("HALFPI_MOUNTNS", mountns)
    monkeypatch.setenv("HALFPI_PIDNS", "off")
    target = subprocess.Popen(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "sleep", "1000"],
        env=marks.env("target"))
    try:
        mem = f"/proc/{target.pid}/mem"
        script = marks.export() + f"(exec 3<{mem}) 2>/dev/null && echo open || echo denied; "
        script += "ps -p $$ | wc -l"
        free = await run(script, [])
        assert lines(free) == ["open", "2"], "without confinement it can (so the test can fail)"
        confined = await run(script, [f"/proc/{target.pid}"])
        assert confined.extra["confined"] is True
        assert lines(confined) == ["denied", "2"]  # its own processes are still visible
    finally:
        target.kill()
        target.wait()


@linux_with_landlock
async def test_no_denied_paths_means_no_confinement(files: Path, marks: Marks) -> None:
    outcome = await run(marks.export() + f"cat {files}/home/token", [])
    assert outcome.extra == {}
    assert lines(outcome) == ["hph_secret"]


async def test_without_landlock_the_run_goes_on_unconfined_and_the_hand_says_so_once(
    files: Path, marks: Marks, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A mount namespace alone is not used: Landlock is what keeps the
    command from unmounting the covers and from ``/proc/<pid>/root`` of a
    process outside the namespace."""
    monkeypatch.setenv("HALFPI_LANDLOCK", "off")
    monkeypatch.setattr(executor, "confinement_said", set())
    token = files / "home" / "token"
    with caplog.at_level(logging.WARNING, logger="halfpi.hand"):
        first = await run(marks.export() + f"cat {token}", [str(token)])
        second = await run(marks.export() + "true", [str(token)])
    assert first.status == second.status == "succeeded"
    assert first.extra == second.extra == {"confined": False, "confinement": "none"}
    assert lines(first) == ["hph_secret"]
    said = [r.getMessage() for r in caplog.records if "confinement" in r.getMessage()]
    assert len(said) == 1, said
    assert "HALFPI_LANDLOCK=off" in said[0]


# -- the plan, without a kernel -----------------------------------------------------------

ALL = landlock.handled_rights(7)


def rules(plan: landlock.Plan, top: Path) -> dict[str, int]:
    return {path: rights for path, rights in plan.rules if landlock._under(path, str(top))}


def test_plan_allows_every_sibling_fully_and_ancestors_only_what_exposes_nothing(
    files: Path,
) -> None:
    home = files / "home"
    (files / "link").symlink_to(home)
    plan = landlock.plan([str(home)], ALL, mountinfo="")
    assert plan.denied == [str(home)]
    got = rules(plan, files)
    assert got == {str(files / "work"): ALL, str(files / "a"): ALL}  # no link, no home, no tree
    assert str(files) in plan.ancestors and "/" in plan.ancestors
    assert not [p for p, _ in plan.rules if p in plan.ancestors], "a denied directory below"

    only_file = landlock.plan([str(home / "token")], ALL, mountinfo="")
    got = rules(only_file, home)
    assert got[str(home)] == landlock.READ_DIR
    assert got[str(home / "notes.txt")] == ALL & landlock.FILE_RIGHTS
    assert got[str(home / "sub")] == ALL
    assert str(home / "token") not in got


def test_plan_merges_nested_denied_paths_and_resolves_symlinks(files: Path) -> None:
    home = files / "home"
    (files / "work" / "to-home").symlink_to(home)
    plan = landlock.plan([str(home / "sub"), str(files / "work" / "to-home"), "/proc/1"], ALL,
                         mountinfo="")
    assert plan.denied == [str(home)]


def test_plan_skips_a_hard_link_of_a_denied_file_and_notes_it(files: Path) -> None:
    token = files / "home" / "token"
    os.link(token, files / "home" / "token-again")
    plan = landlock.plan([str(token)], ALL, mountinfo="")
    assert str(files / "home" / "token-again") not in dict(plan.rules)
    assert any("hard links" in note for note in plan.notes)


def test_plan_denies_the_same_files_through_a_bind_mount() -> None:
    mountinfo = "\n".join([
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
        "40 27 254:0 /root /mnt/root\\040copy rw,relatime - ext4 /dev/vda rw",
        "41 27 254:0 /srv /srv rw,relatime - ext4 /dev/vda rw",
        "42 27 0:50 / /root/.halfpi/cache rw - tmpfs tmpfs rw",
    ])
    mounts = landlock.parse_mountinfo(mountinfo)
    assert sorted(landlock.aliases("/root/.halfpi", mounts)) == ["/mnt/root copy/.halfpi"]
    assert landlock.aliases("/srv/x", mounts) == []


def test_the_paths_to_hide_are_resolved_merged_with_their_bind_mount_aliases(
    files: Path,
) -> None:
    home = files / "home"
    (files / "to-home").symlink_to(home)
    mountinfo = "\n".join([
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
        f"40 27 254:0 {home} {files}/work/alias rw,relatime - ext4 /dev/vda rw",
    ])
    denied = landlock.denied_paths(
        [str(files / "to-home"), str(home / "token"), "/proc/1/environ", str(files / "gone")],
        mountinfo)
    assert denied == [str(files / "gone"), str(home), f"{files}/work/alias"]


def test_with_a_mount_namespace_landlock_allows_everything() -> None:
    """Its domain is still what forbids mount operations and other processes."""
    assert landlock.everything(ALL).rules == [("/", ALL)]
