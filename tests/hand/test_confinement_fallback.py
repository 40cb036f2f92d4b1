"""Every confinement step falls back; none fails a command.

Where the kernel lets an ordinary user create a user namespace but not
write its id map (Ubuntu 24.04: AppArmor restricts unprivileged user
namespaces, ``unshare`` succeeds and the ``uid_map`` write is refused), a
Hand run by that user must still run every command: without a PID
namespace, confined by Landlock alone, and say so once, when it starts.

The refusal is injected into the command's supervisor (every open of an
``uid_map`` fails with EPERM, as the kernel would refuse it), which runs as
an ordinary user (``setpriv``) under a Hand run by root.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
from pathlib import Path

import pytest

from halfpi.hand import executor, landlock, tree
from halfpi.hand.executor import exec_command
from tests.hand.test_confinement import SRC, USER, python_for, unprivileged_home
from tests.support.procs import Marks

__all__ = ["unprivileged_home"]  # a fixture

# The supervisor, as an ordinary user, where writing an id map is refused.
REFUSED_MAPS = f"""
import errno, os, sys
sys.path.insert(0, {SRC!r})
plain_open = os.open
def refusing_open(path, *args, **kwargs):
    if str(path).endswith(("/uid_map", "/gid_map", "/setgroups")):
        raise PermissionError(errno.EPERM, "Operation not permitted", path)
    return plain_open(path, *args, **kwargs)
os.open = refusing_open
from halfpi.hand.reaper import main
main()
"""


@pytest.fixture
def refused_id_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.platform != "linux" or landlock.abi() == 0:
        pytest.skip("needs Landlock")
    python, setpriv = python_for(USER), shutil.which("setpriv")
    if python is None or setpriv is None:
        pytest.skip(f"needs root, setpriv(1) and a Python that uid {USER} can run")
    monkeypatch.setattr(tree, "supervisor_argv", lambda: [
        setpriv, f"--reuid={USER}", f"--regid={USER}", "--clear-groups",
        python, "-I", "-S", "-c", REFUSED_MAPS])
    monkeypatch.setattr(executor, "confinement_said", set())
    monkeypatch.setattr(executor, "pids_said", set())


async def test_a_user_namespace_without_an_id_map_falls_back_and_is_said_once_at_start(
    refused_id_maps: None, unprivileged_home: Path, marks: Marks,
    caplog: pytest.LogCaptureFixture,
) -> None:
    home = unprivileged_home
    deny = [str(home / ".halfpi")]
    with caplog.at_level(logging.INFO, logger="halfpi.hand"):
        await executor.announce_confinement(deny)
        said_at_start = [r.getMessage() for r in caplog.records]
        outcomes = [
            await asyncio.wait_for(exec_command(
                {"command": marks.export() + f"id -u; cat {home}/.halfpi/hand.token "
                 "|| echo read-denied"},
                lambda *_: None, asyncio.Event(), deny_paths=deny), 60)
            for _ in range(2)]
    for outcome in outcomes:
        assert outcome.status == "succeeded", outcome
        # Its own identity (not the overflow user of an unmapped namespace),
        # the denied file still denied.
        assert outcome.stdout.decode().splitlines() == [str(USER), "read-denied"], outcome
        assert outcome.extra == {"confined": True, "confinement": "landlock"}
    said = [r.getMessage() for r in caplog.records]
    assert said == said_at_start, "said again on a run"
    landlock_said = [m for m in said if "Landlock alone" in m]
    pids_said = [m for m in said if "every process of this machine" in m]
    assert len(landlock_said) == 1 and "Operation not permitted" in landlock_said[0], said
    assert len(pids_said) == 1 and "Operation not permitted" in pids_said[0], said
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], said


# The supervisor, as an ordinary user, whose first fork (the trial of the
# user namespace) fails as under a pids limit.
FIRST_FORK_FAILS = f"""
import errno, os, sys
sys.path.insert(0, {SRC!r})
plain_fork = os.fork
forks = []
def failing_fork():
    forks.append(1)
    if len(forks) == 1:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    return plain_fork()
os.fork = failing_fork
from halfpi.hand.reaper import main
main()
"""


async def test_a_user_namespace_that_cannot_be_tried_is_not_made(
    refused_id_maps: None, marks: Marks, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    argv = tree.supervisor_argv()  # as the ordinary user; its code replaced
    monkeypatch.setattr(tree, "supervisor_argv", lambda: [*argv[:-1], FIRST_FORK_FAILS])
    with caplog.at_level(logging.INFO, logger="halfpi.hand"):
        outcome = await asyncio.wait_for(exec_command(
            {"command": marks.export() + "id -u"}, lambda *_: None, asyncio.Event()), 60)
    assert outcome.status == "succeeded", outcome
    assert outcome.stdout.decode().split() == [str(USER)]
    said = [r.getMessage() for r in caplog.records if "every process" in r.getMessage()]
    assert len(said) == 1 and "no PID namespace (Resource temporarily unavailable)" in said[0], (
        said)
