"""`halfpi mind` loads, before it says ``listening``, only what the
configuration it runs uses (docs/performance.md, "Start-up").

Each test starts a real ``halfpi mind`` in a child Python whose stdout
notes ``sys.modules`` the moment the ``listening`` line is written: before
the native server builds its HTTP door in the background
(``process.build_http_door_ahead``), so what the door imports is not in it.
"""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

# The child: `halfpi mind ARGS`, with its stdout noting sys.modules.
_CHILD = '''\
import sys

OUT = sys.argv.pop(1)


class _Note:
    def __init__(self, inner):
        self.inner = inner

    def write(self, text):
        if '"listening"' in text:
            with open(OUT, "w") as out:
                out.write("\\n".join(sorted(sys.modules)))
        return self.inner.write(text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


sys.stdout = _Note(sys.stdout)
from halfpi.cli import main

sys.exit(main(sys.argv[1:]))
'''

# Never needed before ``listening`` by the embedded default: the optional
# extras and the features they serve, the HTTP door (built after, off the
# loop), the ASGI server, the Faces, and the TOML parser (no agent.toml).
NOT_BEFORE_LISTENING = (
    "openai", "redis", "asyncpg", "textual",
    "starlette", "uvicorn", "pydantic", "ag_ui",
    "halfpi.agents.openai", "halfpi.journal.redis", "halfpi.store.postgres",
    "halfpi.cluster", "halfpi.mind.cluster_node", "halfpi.face",
    "halfpi.gateway.http", "halfpi.gateway.asgi", "halfpi.gateway.asgi_server",
    "halfpi.gateway.bounded_http",
    "tomllib",
)

# What only the local Hand needs: its code, and the WebSocket client it
# dials with (with what websockets' client pulls in: HTTP proxies' urllib).
LOCAL_HAND_ONLY = (
    "halfpi.hand", "halfpi.client",
    "websockets.asyncio.client", "urllib.request", "http.client",
)


def modules_when_listening(tmp_path: Path, *args: str) -> set[str]:
    """``sys.modules`` of ``halfpi mind --port 0 ARGS`` on a new home, as it
    says ``listening``; the Mind is then stopped and must stop cleanly."""
    home, out = tmp_path / "home", tmp_path / "modules.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(out), "mind", "--home", str(home), "--port", "0",
         "--log-level", "warning", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(30.0), "the Mind did not say listening within 30 s"
        line = proc.stdout.readline()
        assert b'"listening"' in line, line
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    return set(out.read_text().split())


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` (or their submodules) are in ``modules``."""
    return sorted(m for m in modules for n in names if m == n or m.startswith(n + "."))


def test_the_embedded_default_loads_no_optional_feature_before_listening(
    tmp_path: Path,
) -> None:
    modules = modules_when_listening(tmp_path)
    assert "halfpi.hand.node" in modules  # the probe sees the local Hand's code
    assert loaded(modules, NOT_BEFORE_LISTENING) == []


def test_a_mind_without_a_local_hand_loads_no_hand_code(tmp_path: Path) -> None:
    modules = modules_when_listening(tmp_path, "--no-local-hand")
    assert "halfpi.gateway.native" in modules
    assert loaded(modules, LOCAL_HAND_ONLY) == []
