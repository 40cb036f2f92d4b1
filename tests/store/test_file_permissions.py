"""The data directory and database files are private to their owner (docs/operations.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

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
