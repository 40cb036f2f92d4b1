"""Denied paths are enforced by the kernel on a command's whole tree (Landlock).

Real commands through ``exec_command(..., deny_paths=...)``; the plan of
rules is also checked on its own (``landlock.plan``), without a kernel.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from halfpi.hand import executor, landlock
from halfpi.hand.executor import Outcome, exec_command
from tests.support.procs import Marks

linux_with_landlock = pytest.mark.skipif(
    sys.platform != "linux" or landlock.abi() == 0, reason="needs Landlock")


async def run(command: str, deny_paths: list[str], cwd: Path | None = None) -> Outcome:
    args: dict[str, Any] = {"command": command}
    if cwd is not None:
        args["cwd"] = str(cwd)
    return await asyncio.wait_for(
        exec_command(args, lambda kind, text, gap: None, asyncio.Event(), deny_paths=deny_paths),
        30)


def lines(outcome: Outcome) -> list[str]:
    return outcome.stdout.decode().splitlines()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
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


# -- the kernel enforces them ------------------------------------------------------------


@linux_with_landlock
async def test_a_denied_file_cannot_be_read_or_written_while_its_sibling_can(
    tree: Path, marks: Marks,
) -> None:
    token, notes = tree / "home" / "token", tree / "home" / "notes.txt"
    outcome = await run(
        marks.export() + f"cat {token} || echo read-denied; (echo x >> {token}) || echo "
        f"write-denied; (true > {token}) || echo truncate-denied; cat {notes}",
        [str(token)])
    assert outcome.extra == {"confined": True}
    assert lines(outcome) == ["read-denied", "write-denied", "truncate-denied", "notes"]
    assert outcome.stderr.decode().count("Permission denied") == 3, outcome.stderr
    assert token.read_text() == "hph_secret\n"


@linux_with_landlock
async def test_a_denied_directory_cannot_be_listed_read_or_written(
    tree: Path, marks: Marks,
) -> None:
    home, work = tree / "home", tree / "work"
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
    script = marks.export() + " ".join(
        f"if {cmd} >/dev/null 2>&1; then echo {name}=allowed; else echo {name}=denied; fi;"
        for name, cmd in checks.items())
    script += f" echo hi > {work}/mine && cat {work}/mine {work}/readme && ls {work} | wc -l"
    outcome = await run(script, [str(home)])
    assert outcome.extra == {"confined": True}
    assert lines(outcome)[: len(checks)] == [f"{name}=denied" for name in checks]
    # Everything beside it works as before.
    assert lines(outcome)[len(checks):] == ["hi", "readme", "3"], outcome.stderr
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "sub", "token"]
    assert (home / "notes.txt").read_text() == "notes\n"


@linux_with_landlock
async def test_confinement_holds_for_every_descendant(tree: Path, marks: Marks) -> None:
    token = tree / "home" / "token"
    outcome = await run(
        marks.export()
        + f"setsid sh -c 'cat {token} || echo setsid-denied'; "
        f"(sh -c 'cat {token} || echo daemon-denied' &); sleep 0.2; wait",
        [str(token)])
    assert "hph_secret" not in outcome.stdout.decode()
    assert sorted(lines(outcome)) == ["daemon-denied", "setsid-denied"]


@linux_with_landlock
async def test_the_hands_memory_is_out_of_reach_through_proc(marks: Marks) -> None:
    """Outside its domain a confined command may not ptrace a process nor
    open its memory. (The environment of a process of the same user stays
    readable on this kernel: the Hand takes its token out of it, see
    test_conceal.py.)"""
    mem = f"/proc/{os.getpid()}/mem"
    script = marks.export() + f"(exec 3<{mem}) 2>/dev/null && echo open || echo denied; "
    script += "ps -p $$ | wc -l"
    free = await run(script, [])
    assert lines(free) == ["open", "2"], "without confinement it can (so the test can fail)"
    confined = await run(script, [f"/proc/{os.getpid()}"])
    assert confined.extra == {"confined": True}
    assert lines(confined) == ["denied", "2"]  # its own processes are still visible


@linux_with_landlock
async def test_in_an_ancestor_directory_existing_entries_work_but_none_can_be_created(
    tree: Path, marks: Marks,
) -> None:
    """The documented limit: rights on an ancestor would cascade into the
    denied path, so none that create, remove or (above a denied directory)
    list are granted there."""
    ancestor = tree / "a"
    outcome = await run(
        marks.export()
        + f"cat {ancestor}/existing; echo more >> {ancestor}/existing; echo append=$?; "
        f"touch {ancestor}/new 2>/dev/null; echo create=$?; "
        f"ls {ancestor} >/dev/null 2>&1; echo list=$?; "
        f"touch {tree}/work/new; echo sibling_create=$?",
        [str(ancestor / "secret")])
    assert lines(outcome) == ["existing", "append=0", "create=1", "list=2", "sibling_create=0"]
    # Above a denied *file* the directories can be listed (names, not contents).
    listed = await run(marks.export() + f"ls {tree / 'home'}", [str(tree / "home" / "token")])
    assert lines(listed) == ["notes.txt", "sub", "token"]


@linux_with_landlock
async def test_no_denied_paths_means_no_confinement(tree: Path, marks: Marks) -> None:
    outcome = await run(marks.export() + f"cat {tree}/home/token", [])
    assert outcome.extra == {}
    assert lines(outcome) == ["hph_secret"]


async def test_without_landlock_the_run_goes_on_unconfined_and_the_hand_says_so_once(
    tree: Path, marks: Marks, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("HALFPI_LANDLOCK", "off")
    monkeypatch.setattr(executor, "unconfined_warned", False)
    token = tree / "home" / "token"
    with caplog.at_level(logging.WARNING, logger="halfpi.hand"):
        first = await run(marks.export() + f"cat {token}", [str(token)])
        second = await run(marks.export() + "true", [str(token)])
    assert first.status == second.status == "succeeded"
    assert first.extra == second.extra == {"confined": False}
    assert lines(first) == ["hph_secret"]
    said = [r.getMessage() for r in caplog.records if "confinement" in r.getMessage()]
    assert len(said) == 1, said
    assert "HALFPI_LANDLOCK=off" in said[0]


# -- the plan, without a kernel -----------------------------------------------------------

ALL = landlock.handled_rights(7)


def rules(plan: landlock.Plan, top: Path) -> dict[str, int]:
    return {path: rights for path, rights in plan.rules if landlock._under(path, str(top))}


def test_plan_allows_every_sibling_fully_and_ancestors_only_what_exposes_nothing(
    tree: Path,
) -> None:
    home = tree / "home"
    (tree / "link").symlink_to(home)
    plan = landlock.plan([str(home)], ALL, mountinfo="")
    assert plan.denied == [str(home)]
    got = rules(plan, tree)
    assert got == {str(tree / "work"): ALL, str(tree / "a"): ALL}  # no link, no home, no tree
    assert str(tree) in plan.ancestors and "/" in plan.ancestors
    assert not [p for p, _ in plan.rules if p in plan.ancestors], "a denied directory below"

    only_file = landlock.plan([str(home / "token")], ALL, mountinfo="")
    got = rules(only_file, home)
    assert got[str(home)] == landlock.READ_DIR
    assert got[str(home / "notes.txt")] == ALL & landlock.FILE_RIGHTS
    assert got[str(home / "sub")] == ALL
    assert str(home / "token") not in got


def test_plan_merges_nested_denied_paths_and_resolves_symlinks(tree: Path) -> None:
    home = tree / "home"
    (tree / "work" / "to-home").symlink_to(home)
    plan = landlock.plan([str(home / "sub"), str(tree / "work" / "to-home"), "/proc/1"], ALL,
                         mountinfo="")
    assert plan.denied == [str(home)]


def test_plan_skips_a_hard_link_of_a_denied_file_and_notes_it(tree: Path) -> None:
    token = tree / "home" / "token"
    os.link(token, tree / "home" / "token-again")
    plan = landlock.plan([str(token)], ALL, mountinfo="")
    assert str(tree / "home" / "token-again") not in dict(plan.rules)
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
