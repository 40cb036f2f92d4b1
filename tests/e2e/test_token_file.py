"""Tokens from a file or the environment, never on a command line (``ps`` shows it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import face_add
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e


def headless(url: str, env: dict[str, str], *args: str,
             stdin: str = "") -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HALFPI_")}
    return subprocess.run(
        [sys.executable, "-m", "halfpi.cli", "face", "--mode", "headless", "--url", url, *args],
        env={**clean, **env}, input=stdin, capture_output=True, text=True, timeout=60,
    )


LIST = json.dumps({"type": "face.conversation.list", "payload": {"request_id": "l1"}}) + "\n"


def listed(run: subprocess.CompletedProcess[str]) -> bool:
    for line in run.stdout.splitlines():
        frame = json.loads(line)
        if frame["type"] == "face.result" and frame["payload"].get("request_id") == "l1":
            return frame["payload"]["status"] == "succeeded"
    return False


async def test_face_reads_its_token_from_token_file(
    tmp_path: Path, mind_proc: MindProcess
) -> None:
    added = await face_add(mind_proc.home, "script")
    token_file = tmp_path / "script.token"
    token_file.write_text(added.token + "\n")
    token_file.chmod(0o600)
    run = headless(mind_proc.url, {"HALFPI_HOME": str(tmp_path / "elsewhere")},
                   "--token-file", str(token_file), stdin=LIST)
    assert run.returncode == 0, run.stderr
    assert listed(run), run.stdout
    assert added.token not in run.stderr


async def test_face_reads_halfpi_token_file_from_the_environment(
    tmp_path: Path, mind_proc: MindProcess
) -> None:
    token_file = tmp_path / "env.token"
    token_file.write_text(mind_proc.token + "\n")
    token_file.chmod(0o600)
    run = headless(mind_proc.url, {"HALFPI_HOME": str(tmp_path / "elsewhere"),
                                   "HALFPI_TOKEN_FILE": str(token_file)}, stdin=LIST)
    assert run.returncode == 0, run.stderr
    assert listed(run), run.stdout


@pytest.mark.parametrize("case", ["missing", "empty", "both"])
def test_a_bad_token_file_is_one_clear_line(tmp_path: Path, case: str) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    args = {
        "missing": ["--token-file", str(tmp_path / "nope.token")],
        "empty": ["--token-file", str(empty)],
        "both": ["--token-file", str(empty), "--token", "hpf_x"],
    }[case]
    for command in (["face", "--mode", "headless"], ["hand", "--id", "h"]):
        run = subprocess.run([sys.executable, "-m", "halfpi.cli", *command, *args],
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items()
                                  if not k.startswith("HALFPI_")}, stdin=subprocess.DEVNULL)
        assert run.returncode == 64, (command, run)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("halfpi: "), (command, run.stderr)


def test_a_token_file_others_can_read_is_warned_about(tmp_path: Path,
                                                      mind_proc: MindProcess) -> None:
    token_file = tmp_path / "loose.token"
    token_file.write_text(mind_proc.token + "\n")
    token_file.chmod(0o644)
    run = headless(mind_proc.url, {"HALFPI_HOME": str(tmp_path / "elsewhere")},
                   "--token-file", str(token_file), stdin=LIST)
    assert run.returncode == 0, run.stderr
    assert "readable by others" in run.stderr
    assert mind_proc.token not in run.stderr
