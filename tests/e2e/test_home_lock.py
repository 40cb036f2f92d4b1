"""Two ``halfpi mind`` on one home (DESIGN §12): the second exits at once with
one line naming the holder, and the first keeps serving a log with exactly
one outcome per run."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from halfpi.core.states import CHAT_EVENT_FOR_STATUS
from tests.support.cli import halfpi_cli
from tests.support.client import FaceClient
from tests.support.mind import MindProcess


def outcomes_per_run(db: Path) -> Counter[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        types = tuple(set(CHAT_EVENT_FOR_STATUS.values()))
        rows = conn.execute(
            f"SELECT data FROM events WHERE type IN ({', '.join('?' for _ in types)})", types
        ).fetchall()
    finally:
        conn.close()
    return Counter(json.loads(data)["run_id"] for (data,) in rows)


@pytest.mark.e2e
async def test_a_second_mind_on_a_home_in_use_exits_naming_the_holder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    first = MindProcess(home, delta_ms=20).start()
    try:
        assert first.proc is not None
        face = await FaceClient.connect(first.url, first.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        chat = await face.command("face.chat", conversation_id=cid, content="/repeat 60 word")
        await face.expect(lambda f: f["type"] == "face.chat.delta")  # streaming now

        second = await halfpi_cli("mind", "--port", "0", "--home", str(home),
                                  "--log-level", "info", timeout=20)
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"pid {first.proc.pid}" in lines[0]
        assert "in use by another Mind" in lines[0]
        assert second.stdout == ""

        # The first Mind never noticed: its chat ends as it would have.
        result = await face.reply(chat, timeout=30)
        assert result["payload"]["status"] == "succeeded", result
        again = await face.chat_to_end(cid, "still serving")
        assert again["payload"]["status"] == "succeeded"
        await face.close()
        outcomes = outcomes_per_run(home / "halfpi.db")
        assert len(outcomes) == 2
        assert set(outcomes.values()) == {1}, outcomes
    finally:
        first.kill()
