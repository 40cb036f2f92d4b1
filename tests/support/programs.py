"""System programs some tests need (node, tmux, chromium, redis-server,
PostgreSQL, curl, ps): a test whose program is missing skips, and the run ends with
ONE line naming what to install (``pytest_terminal_summary`` in
tests/conftest.py); CI makes them required instead.

- :func:`require` skips a test without its program — or fails it when the
  program's ``HALFPI_*`` variable is ``required`` (``.ci/run`` sets them all).
- ``HALFPI_MINIMAL=1`` hides every program below from these checks, as on
  a machine with only Python: CI runs the suite's quick subset so once more
  to prove that it passes there, with skips and the summary line. It also
  overrides every ``required``.
- :func:`node_modules` installs a node test's npm packages (``npm ci``) once
  per run when node is present and they are missing or older than their
  lock file, so the suite prepares what it needs itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

MINIMAL = os.environ.get("HALFPI_MINIMAL") == "1"


@dataclass(frozen=True)
class Program:
    name: str  # what the tests run
    install: str  # the Debian package that brings it
    variable: str  # HALFPI_<X>=required makes its tests fail instead of skip

    @property
    def required(self) -> bool:
        return not MINIMAL and os.environ.get(self.variable) == "required"


PROGRAMS = {
    p.name: p
    for p in (
        Program("node", "nodejs", "HALFPI_NODE"),
        Program("npm", "npm", "HALFPI_NODE"),
        Program("tmux", "tmux", "HALFPI_TMUX"),
        Program("chromium", "chromium", "HALFPI_BROWSER"),
        Program("redis-server", "redis-server", "HALFPI_REDIS"),
        Program("initdb", "postgresql", "HALFPI_PG"),
        Program("curl", "curl", "HALFPI_CURL"),
        Program("ps", "procps", "HALFPI_PS"),
        Program("faketime", "faketime", "HALFPI_FAKETIME"),
    )
}

# Why this run skipped a test for a missing program → the package to install.
SKIPPED: dict[str, str] = {}


def which(name: str) -> str | None:
    """The program's path, or None when it is missing (or hidden: HALFPI_MINIMAL)."""
    if MINIMAL and name in PROGRAMS:
        return None
    return shutil.which(name)


def required(name: str) -> bool:
    return PROGRAMS[name].required


def skip_missing(name: str, why: str = "") -> None:
    """Skip (or, when its variable says ``required``, fail) a test whose
    program ``name`` is missing; the summary line counts it."""
    program = PROGRAMS[name]
    reason = why or f"{name} is not installed (apt-get install {program.install})"
    if program.required:
        pytest.fail(f"{program.variable}=required but {reason}")
    SKIPPED[reason] = program.install
    pytest.skip(reason)


def require(name: str) -> str:
    """The path of program ``name``; the test skips (or fails) without it."""
    path = which(name)
    if path is None:
        skip_missing(name)
    assert path is not None
    return path


def summary(skips: list[str]) -> str | None:
    """The one line that ends a run which skipped tests for missing
    programs; ``skips`` are the run's skip reasons, one per skipped test (a
    skip in a shared fixture skips several)."""
    ours = [why for why in skips if any(reason in why for reason in SKIPPED)]
    if not ours:
        return None
    packages = " ".join(sorted(set(SKIPPED.values())))
    tests = "1 test" if len(ours) == 1 else f"{len(ours)} tests"
    return (f"halfpi: {tests} skipped for missing system programs; to run them "
            f"too: apt-get install {packages} (README.md, \"Tests\")")


_INSTALLED: dict[Path, str | None] = {}


def node_modules(package_dir: Path) -> Path:
    """``package_dir/node_modules``, installed from its lock file by ``npm ci``
    when missing or stale (once per run). Skips (or fails) without node and
    npm; an install that fails is a failure that says why."""
    node, npm = require("node"), require("npm")
    del node
    modules = package_dir / "node_modules"
    if package_dir not in _INSTALLED:
        _INSTALLED[package_dir] = None
        if _stale(package_dir):
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--prefix", str(package_dir)],
                capture_output=True, text=True, timeout=600, check=False,
            )
            if done.returncode != 0:
                _INSTALLED[package_dir] = (f"`npm ci --prefix {package_dir}` failed "
                                           f"(exit {done.returncode}): {done.stderr[-2000:]}")
    problem = _INSTALLED[package_dir]
    if problem is not None:
        pytest.fail(problem)
    return modules


def _stale(package_dir: Path) -> bool:
    """npm ci writes node_modules/.package-lock.json: missing, or older than
    the lock file, the packages need installing."""
    stamp = package_dir / "node_modules" / ".package-lock.json"
    lock = package_dir / "package-lock.json"
    return not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime
