"""The Hand's side of the tool policy (DESIGN §8), on a real filesystem.

Only the Hand can resolve a path on its disk: it follows symlinks before it
judges, refuses protected paths whatever a human approved, and checks again
the file it actually opened, so a path swapped between the check and the run
does not win.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.core.policy import FORBIDDEN_PATH, Rule, Verdict
from halfpi.hand.executor import ToolError, exec_command, read_file
from halfpi.hand.policy import HandPolicy, scrub_environment, without_secrets


class Disk:
    """A Hand's world: a work root, a halfpi home with a token, an outside."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "work"
        self.home = tmp / "home"
        self.outside = tmp / "outside"
        for d in (self.root, self.home, self.outside):
            d.mkdir()
        self.token = self.home / "face.token"
        self.token.write_text("hpf_secret\n")
        self.inside = self.root / "notes.txt"
        self.inside.write_text("inside\n")
        self.far = self.outside / "far.txt"
        self.far.write_text("far\n")

    def policy(self, **rules: Rule) -> HandPolicy:
        return HandPolicy([self.root], rules, [self.home])


@pytest.fixture
def disk(tmp_path: Path) -> Disk:
    return Disk(tmp_path)


async def read(policy: HandPolicy, path: Path | str, *, approved: bool) -> str:
    """read_file as the Hand runs it: the policy enforced, then the opened file checked."""
    args = {"path": str(path)}
    await asyncio.to_thread(policy.enforce, "read_file", args, approved=approved)
    outcome = await read_file(
        args, lambda *a: None, asyncio.Event(), None,
        open_file=lambda p: policy.open_checked("read_file", approved, p),
    )
    return outcome.stdout.decode()


@contextlib.contextmanager
def refused(category: str) -> Iterator[None]:
    """The block raises a :class:`ToolError` of that category."""
    with pytest.raises(ToolError) as info:
        yield
    assert info.value.category == category, info.value


async def test_read_file_inside_the_roots_runs_without_approval(disk: Disk) -> None:
    policy = disk.policy()
    assert policy.check("read_file", {"path": str(disk.inside)}).verdict is Verdict.ALLOW
    assert await read(policy, disk.inside, approved=False) == "inside\n"


async def test_read_file_outside_the_roots_asks_and_runs_once_approved(disk: Disk) -> None:
    policy = disk.policy()
    decision = policy.check("read_file", {"path": str(disk.far)})
    assert decision.verdict is Verdict.ASK and str(disk.far) in decision.reason
    with refused("approval_required"):
        await read(policy, disk.far, approved=False)
    assert await read(policy, disk.far, approved=True) == "far\n"


async def test_read_file_refuses_the_token_file_even_with_approval(disk: Disk) -> None:
    policy = disk.policy(read_file=Rule.NEVER)
    decision = policy.check("read_file", {"path": str(disk.token)})
    assert decision.verdict is Verdict.DENY and decision.category == FORBIDDEN_PATH
    with refused(FORBIDDEN_PATH):
        await read(policy, disk.token, approved=True)


@pytest.mark.parametrize("how", ["symlink", "symlinked_dir", "hard_link", "dotdot"])
async def test_read_file_refuses_every_way_round_to_the_token(disk: Disk, how: str) -> None:
    path = disk.root / "innocent.txt"
    if how == "symlink":
        path.symlink_to(disk.token)
    elif how == "symlinked_dir":
        (disk.root / "cfg").symlink_to(disk.home)
        path = disk.root / "cfg" / "face.token"
    elif how == "hard_link":
        os.link(disk.token, path)
    else:
        path = Path(f"{disk.root}/../home/face.token")
    policy = disk.policy(read_file=Rule.NEVER)
    assert policy.check("read_file", {"path": str(path)}).verdict is Verdict.DENY
    with refused(FORBIDDEN_PATH):
        await read(policy, path, approved=True)


async def test_a_symlink_inside_the_roots_to_a_file_outside_asks(disk: Disk) -> None:
    link = disk.root / "shortcut"
    link.symlink_to(disk.far)
    decision = disk.policy().check("read_file", {"path": str(link)})
    assert decision.verdict is Verdict.ASK and str(disk.far) in decision.reason


async def test_read_file_checks_the_file_it_opened_not_the_path_it_checked(disk: Disk) -> None:
    """The link is harmless when checked and swapped to the token before the
    file is opened: the open-time check refuses it."""
    link = disk.root / "swap"
    link.symlink_to(disk.inside)
    policy = disk.policy()
    args = {"path": str(link)}
    assert policy.check("read_file", args).verdict is Verdict.ALLOW
    policy.enforce("read_file", args, approved=False)
    link.unlink()
    link.symlink_to(disk.token)
    with refused(FORBIDDEN_PATH):
        await read_file(args, lambda *a: None, asyncio.Event(), None,
                        open_file=lambda p: policy.open_checked("read_file", False, p))


@pytest.mark.parametrize("path", ["/proc/self/environ", "/proc/thread-self/environ",
                                  f"/proc/{os.getpid()}/environ", "/dev/fd/../environ"])
async def test_read_file_refuses_the_hands_own_process_files(disk: Disk, path: str) -> None:
    if not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    policy = HandPolicy(["/"], {"read_file": Rule.NEVER}, [disk.home])
    assert policy.check("read_file", {"path": path}).verdict is Verdict.DENY
    with refused(FORBIDDEN_PATH):
        await read(policy, path, approved=True)


async def test_read_file_refuses_what_is_not_a_regular_file(disk: Disk) -> None:
    """/dev/zero would be read for ever (the digest covers the whole file)."""
    policy = HandPolicy(["/"], {"read_file": Rule.NEVER})
    with refused("bad_arguments"):
        await read(policy, "/dev/zero", approved=True)


def test_a_path_the_mind_names_at_welcome_becomes_protected(disk: Disk) -> None:
    mind_home = disk.root / "mind-home"
    mind_home.mkdir()
    (mind_home / "notes").write_text("x")
    policy = disk.policy()
    args = {"path": str(mind_home / "notes")}
    assert policy.check("read_file", args).verdict is Verdict.ALLOW
    policy.protect([str(mind_home)])
    assert policy.check("read_file", args).verdict is Verdict.DENY
    assert str(mind_home) in policy.deny_paths()


@pytest.mark.parametrize(
    "args",
    [
        {"command": "ls", "cwd": "{home}"},
        {"argv": ["cat", "{home}/face.token"]},
        {"argv": ["cat", "../home/face.token"], "cwd": "{root}"},
        {"command": "cat {home}/notes"},
        {"command": "wc -c <{home}/x"},
        {"command": "cat --file={home}/x"},
        {"command": "cat face.token"},
    ],
)
def test_exec_command_naming_a_protected_path_is_denied(
    disk: Disk, args: dict[str, Any]
) -> None:
    filled = {k: (v.format(home=disk.home, root=disk.root) if isinstance(v, str)
                  else [a.format(home=disk.home, root=disk.root) for a in v])
              for k, v in args.items()}
    policy = disk.policy(exec_command=Rule.NEVER)
    decision = policy.check("exec_command", filled)
    assert decision.verdict is Verdict.DENY, decision
    with refused(FORBIDDEN_PATH):
        policy.enforce("exec_command", filled, approved=True)


def test_exec_command_asks_by_default(disk: Disk) -> None:
    decision = disk.policy().check("exec_command", {"command": "ls -l", "cwd": str(disk.root)})
    assert decision.verdict is Verdict.ASK
    with refused("approval_required"):
        disk.policy().enforce("exec_command", {"command": "ls"}, approved=False)
    disk.policy().enforce("exec_command", {"command": "ls"}, approved=True)


def test_bad_arguments_are_refused_by_the_check_like_by_the_tool(disk: Disk) -> None:
    decision = disk.policy().check("read_file", {"path": 7})
    assert decision.verdict is Verdict.DENY and decision.category == "bad_arguments"


def test_unknown_tools_ask(disk: Disk) -> None:
    assert disk.policy().check("launch", {}).verdict is Verdict.ASK


def test_scrub_drops_secret_names_and_halfpi_variables() -> None:
    env = {
        "PATH": "/bin", "HOME": "/home/u", "LANG": "C",
        "HALFPI_HAND_TOKEN": "hph_x", "HALFPI_HOME": "/h", "GITHUB_TOKEN": "g",
        "MY_SECRET": "s", "DB_PASSWORD": "p", "OPENAI_API_KEY": "k", "api_key_file": "f",
    }
    assert scrub_environment(env) == {"PATH": "/bin", "HOME": "/home/u", "LANG": "C"}


@pytest.mark.parametrize("mode", ["command", "argv"])
async def test_exec_command_children_do_not_inherit_secrets(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("HALFPI_HAND_TOKEN", "hph_should_not_leak")
    monkeypatch.setenv("SOME_API_KEY", "key_should_not_leak")
    monkeypatch.setenv("HARMLESS_VALUE", "kept")
    args: dict[str, Any] = {"command": "env"} if mode == "command" else {"argv": ["env"]}
    outcome = await exec_command(without_secrets(args, os.environ), lambda *a: None,
                                 asyncio.Event())
    out = outcome.stdout.decode()
    assert outcome.status == "succeeded", outcome
    assert "HARMLESS_VALUE=kept" in out
    assert "should_not_leak" not in out


# -- a secret known by what it holds or where it was copied (issue 23, 3) ----------

def _token() -> str:
    import secrets

    return "hph_" + secrets.token_urlsafe(32)


@pytest.mark.parametrize("approved", [False, True])
async def test_a_file_holding_a_token_is_refused_whatever_its_name(
    disk: Disk, approved: bool
) -> None:
    """``halfpi hand add laptop > laptop.token``, as docs/hands.md says: no
    name the policy knows, but a token's shape inside."""
    for place in (disk.root / "laptop.token", disk.outside / "notes.txt"):
        place.write_text(_token() + "\n")
        decision = disk.policy(read_file=Rule.NEVER).check("read_file", {"path": str(place)})
        assert decision.verdict is Verdict.DENY, decision
        assert decision.category == FORBIDDEN_PATH and "token" in decision.reason
        with pytest.raises(ToolError) as refused:
            await read(disk.policy(read_file=Rule.NEVER), place, approved=approved)
        assert refused.value.category == FORBIDDEN_PATH


def _backup(folder: Path, *, secrets: list[str] | None) -> None:
    """A folder as ``halfpi backup`` leaves it (its manifest, its files)."""
    import json

    folder.mkdir()
    for name in ("halfpi.db", "agent.toml", "openai.key"):
        (folder / name).write_text(f"{name} content\n")
    manifest: dict[str, Any] = {"halfpi": "0", "schema": 5,
                                "files": ["halfpi.db", "agent.toml", "openai.key"]}
    if secrets is not None:
        manifest["secrets"] = secrets
    (folder / "backup.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("listed", ["secrets", "files only (an older backup)"])
async def test_the_secrets_of_a_backup_folder_are_refused_wherever_it_was_copied(
    disk: Disk, listed: str
) -> None:
    folder = disk.root / "copied" / "mind-backup"
    folder.parent.mkdir()
    _backup(folder, secrets=["halfpi.db", "openai.key"] if listed == "secrets" else None)
    policy = disk.policy(read_file=Rule.NEVER, exec_command=Rule.NEVER)
    key = folder / "openai.key"
    assert policy.check("read_file", {"path": str(key)}).verdict is Verdict.DENY
    with pytest.raises(ToolError) as refused:
        await read(policy, key, approved=True)
    assert refused.value.category == FORBIDDEN_PATH
    for args in ({"argv": ["cat", str(key)]}, {"command": "cat openai.key", "cwd": str(folder)}):
        decision = policy.check("exec_command", args)
        assert decision.verdict is Verdict.DENY and "backup" in decision.reason, (args, decision)
    if listed == "secrets":  # what the manifest does not call a secret stays readable
        assert "agent.toml content" in await read(policy, folder / "agent.toml", approved=False)


def test_a_json_file_named_like_a_manifest_protects_nothing(disk: Disk) -> None:
    (disk.root / "backup.json").write_text('{"files": ["notes.txt"]}')
    (disk.root / "notes.txt").write_text("plain\n")
    decision = disk.policy().check("read_file", {"path": str(disk.root / "notes.txt")})
    assert decision.verdict is Verdict.ALLOW, decision


def test_a_path_that_cannot_be_resolved_is_refused_at_once_with_its_reason(disk: Disk) -> None:
    """``/proc/1/root/…``: resolving it is not permitted (PermissionError). It
    is refused with a reason, never an exception that leaves the check
    unanswered."""
    blocked = disk.outside / "blocked"
    blocked.mkdir()
    (blocked / "inner").symlink_to(disk.far)
    os.chmod(blocked, 0)
    try:
        if os.geteuid() == 0 and os.access(blocked / "inner", os.R_OK):
            path = "/proc/1/root/etc/passwd"  # root passes mode 0: the kernel's own refusal
        else:
            path = str(blocked / "inner" / "x")
        for tool, args in (("read_file", {"path": path}),
                           ("exec_command", {"argv": ["cat", path]})):
            try:
                os.path.realpath(path)
            except PermissionError:
                pass
            else:
                pytest.skip("this machine resolves the path: nothing to refuse")
            decision = disk.policy().check(tool, args)
            assert decision.verdict is Verdict.DENY, decision
            assert "cannot be resolved" in decision.reason and path in decision.reason
            with pytest.raises(ToolError):
                disk.policy().enforce(tool, args, approved=True)
    finally:
        os.chmod(blocked, 0o700)
