"""``halfpi conformance URL --token T`` run for real against ``halfpi mind``
on both servers: every check passes on a Mind that keeps the contract, and
the kit reports failures (exit 1) where the target breaks it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.cli import halfpi_cli
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e

CHECKS = ("request replay and conflict", "break before the answer", "resume mid-reply",
          "reset on an unknown epoch", "bad input", "approvals race", "slow consumer")


def rows(stdout: str) -> dict[str, str]:
    """check name → result, from the printed table."""
    found: dict[str, str] = {}
    for line in stdout.splitlines()[1:]:
        for name in (*CHECKS, "revocation"):
            if line.startswith(name + "  "):
                found[name] = line[len(name):].split()[0]
    return found


async def test_every_check_passes_against_a_mind_that_keeps_the_contract(
    mind_proc: MindProcess,
) -> None:
    run = await halfpi_cli("conformance", mind_proc.url, "--token", mind_proc.token,
                           timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert rows(run.stdout) == {**dict.fromkeys(CHECKS, "pass"), "revocation": "skip"}, run.stdout
    assert f"{len(CHECKS)} passed, 0 failed, 1 skipped" in run.stdout


@pytest.mark.servers("native")
async def test_the_kit_fails_the_approvals_race_when_a_credential_may_hold_one_connection(
    tmp_path: Path, server_kind: str,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, server=server_kind,
                       extra_args=("--max-connections-per-principal", "1")).start()
    try:
        run = await halfpi_cli("conformance", mind.url, "--token", mind.token, timeout=120)
    finally:
        mind.terminate()
    assert run.returncode == 1, run.stdout + run.stderr
    assert rows(run.stdout)["approvals race"] == "fail", run.stdout
    assert "rate_limited" in run.stdout


async def test_every_check_fails_against_something_that_is_not_a_mind() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = await halfpi_cli("conformance", f"http://127.0.0.1:{port}", "--token", "hpf_x",
                           timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert set(rows(run.stdout)[name] for name in CHECKS) == {"fail"}, run.stdout
    assert f"0 passed, {len(CHECKS)} failed, 1 skipped" in run.stdout
