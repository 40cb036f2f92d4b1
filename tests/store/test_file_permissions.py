"""The data directory and database files are private to their owner (docs/operations.md)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from halfpi.config import Config
from halfpi.wiring import run_on_store
from tests.support.client import FaceClient
from tests.support.mind import hand_ready, local_mind


def private(path: Path) -> bool:
    return path.stat().st_mode & 0o077 == 0


async def test_stored_tool_output_is_not_readable_by_other_users(tmp_path: Path) -> None:
    secret = tmp_path / "id_key"
    secret.write_text("PRIVATE-KEY-MATERIAL\n")
    secret.chmod(0o600)
    home = tmp_path / "home"
    old = os.umask(0o022)  # the usual default
    try:
        async with local_mind(home) as lmind:
            await hand_ready(lmind)
            face = await FaceClient.connect(lmind.url, lmind.token)
            cid = await face.create_conversation()
            content = "/tool read_file " + json.dumps({"path": str(secret)})
            result = await face.chat_to_end(cid, content)
            assert result["payload"]["status"] == "succeeded"
            await face.close()
            stored = [p for p in sorted(home.glob("halfpi.db*"))]
            assert any(b"PRIVATE-KEY-MATERIAL" in p.read_bytes() for p in stored)
            exposed = [p.name for p in stored if not private(p)]
            assert private(home) or not exposed, f"{exposed} readable by others"
    finally:
        os.umask(old)


def test_a_database_in_a_shared_folder_leaves_the_folder_alone(tmp_path: Path) -> None:
    """``--store sqlite:///srv/shared/minds.db``: the folder may be shared
    (``/srv``, ``/tmp``), so its mode stays as it was; the database's own
    files are private all the same."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    config = Config(home=tmp_path / "home", store_url=f"sqlite://{shared}/minds.db")
    old = os.umask(0o022)
    try:
        run_on_store(config, lambda store: store.credentials_version())
    finally:
        os.umask(old)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    files = sorted(shared.glob("minds.db*"))
    assert files and all(private(p) for p in files), files


def test_the_homes_database_folder_is_made_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    run_on_store(Config(home=home), lambda store: store.credentials_version())
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
