"""A single ``halfpi mind --redis …`` node: its journal in a real Redis (DESIGN §10)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client import FaceClient, seq_of
from tests.support.mind import MindProcess
from tests.support.redis import RedisServer, redis_server  # noqa: F401
from tests.support.stream import assert_contiguous, delta_text, is_terminal_event, positioned

pytestmark = pytest.mark.e2e


@pytest.fixture
def redis_mind(tmp_path: Path, redis_server: RedisServer) -> Iterator[MindProcess]:  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    proc = MindProcess(home, extra_args=("--redis", redis_server.url, "--node-id", "n1"))
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


WORDS = " ".join(f"w{i}" for i in range(40))


async def test_a_chat_resumes_exactly_from_a_cursor_through_the_redis_journal(
    redis_mind: MindProcess,
) -> None:
    face = await FaceClient.connect(redis_mind.url, redis_mind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    await face.command("face.chat", "q1", conversation_id=cid, content=f"/pace 30 {WORDS}")
    await face.expect(lambda f: f["type"] == "face.chat.delta"
                      and f["payload"]["text"].strip() == "w3")
    await face.close()
    before = positioned(face.seen, cid)
    cursor = before[-1]["payload"]["cursor"]

    again = await FaceClient.connect(redis_mind.url, redis_mind.token)
    sub = await again.subscribe(cid, since=cursor)
    assert sub["payload"]["replay"] == "exact", sub
    done = await again.expect(lambda f: is_terminal_event(f, "q1"), 20)
    after = positioned(again.seen, cid)
    assert_contiguous(after, seq_of(cursor) + 1, done["payload"]["seq"])
    assert delta_text(before, "q1") + delta_text(after, "q1") == WORDS
    await again.close()


async def test_I4_redis_restarted_without_its_data_gives_the_resumed_face_an_honest_reset(
    redis_mind: MindProcess, redis_server: RedisServer,  # noqa: F811
) -> None:
    face = await FaceClient.connect(redis_mind.url, redis_mind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    await face.command("face.chat", "q1", conversation_id=cid, content="/pace 1 a b c")
    await face.expect(lambda f: is_terminal_event(f, "q1"), 20)
    await face.close()
    cursor = positioned(face.seen, cid)[0]["payload"]["cursor"]

    redis_server.kill()
    redis_server.start()

    again = await FaceClient.connect(redis_mind.url, redis_mind.token)
    sub = await again.subscribe(cid, since=cursor)
    assert sub["type"] == "face.accepted", sub
    assert sub["payload"]["conversations"][cid] == "reset", sub  # said so, not "exact"
    reset = await again.expect(lambda f: f["type"] == "face.reset")
    assert reset["payload"]["conversation_id"] == cid
    assert reset["payload"]["reason"] in ("cursor_expired", "epoch_changed"), reset
    await again.close()
