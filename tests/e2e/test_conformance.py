"""``halfpi conformance URL --token T`` run for real against ``halfpi mind``
on both servers: every check passes on a Mind that keeps the contract, and
the kit reports failures (exit 1) where the target breaks it. The passing
run is also made against a 2-node cluster behind a round-robin proxy
(tests/support/cluster_mind.py: every new connection of the kit lands on
the other node), with ``--node`` naming one node for the two checks a
proxy in the way spoils."""

from __future__ import annotations

import shlex
import socket
import sys
from pathlib import Path

import pytest

from tests.support.cli import face_add, halfpi_cli
from tests.support.cluster_mind import ClusterMind
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


@pytest.mark.servers("native", "asgi", "cluster")
async def test_every_check_passes_against_a_mind_that_keeps_the_contract(
    mind_proc: MindProcess,
) -> None:
    # A cluster behind its round-robin proxy: the two checks a proxy in the
    # way spoils dial node b, and credentials live in its PostgreSQL.
    cluster = isinstance(mind_proc, ClusterMind)
    node = ("--node", mind_proc.nodes[1].url) if cluster else ()
    store = ("--store", mind_proc.store_url) if cluster else ()
    victim = await face_add(mind_proc.home, "kit-victim", *store)
    revoke = shlex.join([sys.executable, "-m", "halfpi.cli", "face", "revoke", "kit-victim",
                         "--home", str(mind_proc.home), *store])
    run = await halfpi_cli("conformance", mind_proc.url, "--token", mind_proc.token, *node,
                           "--revocable-token", victim.token, "--revoke-command", revoke,
                           timeout=120)
    print(run.stdout)  # the table, shown by pytest -s (docs/operations.md has one)
    assert run.returncode == 0, run.stdout + run.stderr
    assert rows(run.stdout) == {**dict.fromkeys(CHECKS, "pass"), "revocation": "pass"}, run.stdout
    assert f"{len(CHECKS) + 1} passed, 0 failed, 0 skipped" in run.stdout


@pytest.mark.parametrize("delta_ms", [None, 400.0], ids=["default_flags", "slow_pace"])
async def test_every_check_passes_whatever_the_targets_pace(
    tmp_path: Path, server_kind: str, delta_ms: float | None,
) -> None:
    # `halfpi mind` as a user starts it: no flag, no pace in the environment
    # (the scripted agent's 20 ms per delta), and a pace as slow as a model's.
    # The kit asks for the replies it needs (/pace, /repeat) and waits on
    # what it sees arrive, so the target's own pace cannot fail a check.
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, server=server_kind, delta_ms=delta_ms).start()
    try:
        run = await halfpi_cli("conformance", mind.url, "--token", mind.token, timeout=120)
    finally:
        mind.terminate()
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert rows(run.stdout) == {**dict.fromkeys(CHECKS, "pass"), "revocation": "skip"}, run.stdout


async def test_without_a_revocable_token_the_revocation_check_is_skipped_saying_why(
    mind_proc: MindProcess,
) -> None:
    run = await halfpi_cli("conformance", mind_proc.url, "--token", mind_proc.token,
                           timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert rows(run.stdout) == {**dict.fromkeys(CHECKS, "pass"), "revocation": "skip"}, run.stdout
    assert "--revoke-command" in run.stdout


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


@pytest.mark.servers("native")
async def test_the_kit_fails_a_revocation_whose_command_revokes_nothing(
    mind_proc: MindProcess,
) -> None:
    victim = await face_add(mind_proc.home, "kit-victim")
    run = await halfpi_cli("conformance", mind_proc.url, "--token", mind_proc.token,
                           "--revocable-token", victim.token, "--revoke-command", "true",
                           timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert rows(run.stdout) == {**dict.fromkeys(CHECKS, "pass"), "revocation": "fail"}, run.stdout
    assert "the revoked credential's connection stayed open" in run.stdout


async def test_every_check_fails_against_something_that_is_not_a_mind() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = await halfpi_cli("conformance", f"http://127.0.0.1:{port}", "--token", "hpf_x",
                           timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert set(rows(run.stdout)[name] for name in CHECKS) == {"fail"}, run.stdout
    assert f"0 passed, {len(CHECKS)} failed, 1 skipped" in run.stdout
