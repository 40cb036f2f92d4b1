"""A cluster node that cannot start says why in one line (DESIGN §12)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.postgres import fresh_database, require_postgres
from tests.support.redis import free_port

pytestmark = pytest.mark.e2e


def test_a_node_whose_redis_is_not_there_exits_with_one_line(tmp_path: Path) -> None:
    require_postgres()
    store = fresh_database()  # PostgreSQL answers; nothing listens on the Redis port
    port = free_port()
    run = subprocess.run(
        [sys.executable, "-m", "halfpi.cli", "mind", "--port", "0", "--store", store,
         "--redis", f"redis://127.0.0.1:{port}", "--node-id", "a"],
        env=dict(os.environ, HALFPI_HOME=str(tmp_path / "home")),
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 1, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[-1].startswith("halfpi: cannot reach Redis: "), run.stderr
    assert f"127.0.0.1:{port}" in lines[-1]
    assert "Traceback" not in run.stderr
    assert '"event": "listening"' not in run.stdout  # it never served
