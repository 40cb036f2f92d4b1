"""`pip install halfpi` without extras runs `halfpi mind` and a headless
chat, and a feature whose extra is missing says which extra in one line.

Each child Python runs behind an import blocker (tests/support/plain_install.py)
that refuses redis, asyncpg, openai, textual and playwright as a machine
without them would. CI proves the same with a real plain install in
a fresh venv (.ci/run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mind import MindProcess
from tests.support.plain_install import plain_env

pytestmark = pytest.mark.e2e

HALFPI = [sys.executable, "-m", "halfpi.cli"]


def test_a_plain_install_runs_the_mind_and_a_headless_chat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = plain_env(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        chat = json.dumps({"type": "face.chat", "payload": {"content": "hello plain install"}})
        face = subprocess.run(
            [*HALFPI, "face", "--mode", "headless", "--home", str(home),
             "--new-conversation", "plain", "--connect-timeout", "20"],
            input=chat + "\n", capture_output=True, text=True, env=env, timeout=60,
        )
        assert face.returncode == 0, face.stderr
        results = [json.loads(line) for line in face.stdout.splitlines()]
        contents = [m["payload"].get("content") for m in results if m["type"] == "face.result"]
        assert "hello plain install" in contents, face.stdout
    finally:
        status = mind.terminate()
    assert status == 0, mind.log()
    assert "Traceback" not in mind.log()
    assert "not prepared ahead" not in mind.log()  # the HTTP door's packages are core


def _in_a_terminal(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``args`` with stdin and stdout on a pseudo-terminal (the terminal face
    asks for one before anything else); stderr captured."""
    primary, secondary = os.openpty()
    try:
        return subprocess.run(args, stdin=secondary, stdout=secondary, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=60)
    finally:
        os.close(secondary)
        os.close(primary)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["face", "--url", "ws://127.0.0.1:9/v1/face", "--token", "t"],
         "halfpi: the terminal face needs textual: pip install 'halfpi[face]'"),
        (["mind", "--port", "0", "--agent", "openai", "--model", "m"],
         "halfpi: the model provider (--agent openai) needs openai: "
         "pip install 'halfpi[openai]'"),
        (["mind", "--port", "0", "--store", "postgresql://u@127.0.0.1:9/db"],
         "halfpi: the PostgreSQL store (--store postgresql://…) needs asyncpg: "
         "pip install 'halfpi[postgresql]'"),
        (["mind", "--port", "0", "--redis", "redis://127.0.0.1:9"],
         "halfpi: the Redis journal (--redis) needs redis: pip install 'halfpi[cluster]'"),
    ],
    ids=["face", "openai", "postgresql", "redis"],
)
def test_a_missing_extra_is_one_line_naming_it(
    tmp_path: Path, args: list[str], line: str
) -> None:
    env = plain_env(tmp_path / "site")
    env["HALFPI_HOME"] = str(tmp_path / "home")
    run = _in_a_terminal([*HALFPI, *args], env)
    assert run.stderr.splitlines() == [line]
    assert run.returncode == 1  # "it could not be done" (docs/operations.md)
    assert not (tmp_path / "home" / "halfpi.db").exists()  # refused before it began
