"""Graceful shutdown: SIGTERM drains the Mind in bounded time, and nothing
that was running is left without a truthful end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.client import FaceClient, seq_of
from tests.support.mind import MindProcess


@pytest.mark.e2e
async def test_sigterm_closes_faces_1012_and_commits_interrupted_chats(
    tmp_path: Path, server_kind: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, server=server_kind).start()
    try:
        face = await FaceClient.connect(mind.url, mind.token)
        cid = await face.create_conversation("drain")
        await face.subscribe(cid)
        words = " ".join(f"w{i}" for i in range(200))
        chat = await face.command("face.chat", conversation_id=cid, content=f"/pace 50 {words}")
        await face.expect(lambda f: f["type"] == "face.chat.delta")
        started = time.monotonic()
        exit_code = mind.terminate(timeout=15)
        assert exit_code == 0
        assert time.monotonic() - started < 10, "draining must be bounded"
        assert await face.closed_with(5) == 1012
        # The chat's end was committed during the drain: it is there after a restart.
        mind.start()
        again = await FaceClient.connect(mind.url, mind.token)
        replay = await again.command("face.chat", chat, conversation_id=cid,
                                     content=f"/pace 50 {words}")
        result = await again.reply(replay)
        assert result["type"] == "face.result"
        assert result["payload"]["status"] == "interrupted"
        seen = [seq_of(f["payload"]["cursor"]) for f in face.events(cid)]
        assert seq_of(result["payload"]["data"]["cursor"]) > max(seen)
        await again.close()
    finally:
        mind.kill()
