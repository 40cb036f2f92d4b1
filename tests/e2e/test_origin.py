"""Browsers are checked by Origin (DESIGN §4); scripts send none and are not browsers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import websockets
from websockets.typing import Origin

from tests.support.client import FaceClient
from tests.support.mind import local_mind


async def test_foreign_origin_is_refused_at_the_handshake(tmp_path: Path, server_kind: str) -> None:
    async with local_mind(tmp_path / "home", server=server_kind) as lm:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(lm.url, origin=Origin("https://evil.example"))
        assert refused.value.response.status_code == 403


async def test_own_and_configured_origins_and_no_origin_are_accepted(
    tmp_path: Path, server_kind: str
) -> None:
    async with local_mind(tmp_path / "home", server=server_kind,
                          allowed_origins=("https://faces.example",)) as lm:
        port = lm.server.port
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                       "https://faces.example", None):
            extra = {"origin": Origin(origin)} if origin else {}
            face = await FaceClient.connect(lm.url, lm.token, **extra)
            assert face.welcome is not None and face.welcome["payload"]["profile"] == "operator"
            await face.close()


def test_terminal_face_without_a_terminal_points_to_headless(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "face.token").write_text("hpf_unused\n")
    done = subprocess.run(
        [sys.executable, "-m", "halfpi.cli", "face", "--home", str(home)],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert "--mode headless" in done.stderr
    assert done.stdout == ""
