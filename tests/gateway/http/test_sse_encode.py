"""A one-conversation stream's fast encoding (``SseStream._encode_one``)
gives byte for byte what the general one (``encode_each``) gives, whatever
the frames: events, deltas, progress, snapshots, resets, evictions, news,
frames of another conversation, and text that looks like a position."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from halfpi.core.outbound import DELTA, Message
from halfpi.core.sse import Grant
from halfpi.gateway.http.sse_stream import SseStream
from halfpi.mind.auth import Credential

CID = "c_a"
CREDENTIAL = Credential("p_1", "laptop", "face", "operator", frozenset(), "x", 0.0)


def stream(grant: Grant | None, cursors: dict[str, str]) -> SseStream:
    mind: Any = SimpleNamespace(tickets=SimpleNamespace(key=b"k" * 32))
    return SseStream(mind, CREDENTIAL, (CID,), dict(cursors), grant)


def frames(rng: random.Random, n: int) -> list[bytes]:
    out: list[bytes] = []
    for i in range(n):
        seq = i + 1
        cid = CID if rng.random() < 0.9 else "c_other"
        cursor = f"e{seq // 50}.{seq}"
        pick = rng.random()
        if pick < 0.45:
            body = msgspec.json.encode({"conversation_id": cid, "seq": seq, "cursor": cursor,
                                        "type": "chat.message",
                                        "data": {"text": 'a "cursor":"x.1" b'}})
            out.append(Message("face.event", body, conversation_id=cid, seq=seq,
                               cursor=cursor).frame(i + 1))
        elif pick < 0.8:
            out.append(Message("face.chat.delta", None, kind=DELTA, conversation_id=cid,
                               seq=seq, cursor=cursor, request_id="r",
                               text='"conversation_id":"c_a"').frame(i + 1))
        elif pick < 0.86:
            out.append(msgspec.json.encode({"type": "face.snapshot", "payload": {
                "event_seq": i + 1, "conversation": {"id": CID}, "cursor": cursor}}))
        elif pick < 0.9:
            out.append(msgspec.json.encode({"type": "face.reset", "payload": {
                "event_seq": i + 1, "conversation_id": CID, "reason": "cursor_expired",
                "snapshot": {"conversation": {"id": CID}, "cursor": cursor}}}))
        elif pick < 0.94:
            out.append(msgspec.json.encode({"type": "face.evicted", "payload": {
                "event_seq": i + 1, "cursors": {CID: f"e0.{seq - 3}"}}}))
        else:
            out.append(msgspec.json.encode({"type": "face.conversation.changed", "payload": {
                "event_seq": i + 1, "change": "created", "conversation": {"id": "c_new"}}}))
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("grant", [None, Grant("p_1", 1_000_600, "summary")])
async def test_the_fast_encoding_is_the_general_one(seed: int, grant: Grant | None) -> None:
    rng = random.Random(seed)
    start = {} if seed % 2 else {CID: "e0.0"}
    fast, general = stream(grant, start), stream(grant, start)
    for _ in range(6):
        batch = frames(rng, rng.randrange(1, 60))
        assert fast.encode(batch) == general.encode_each(batch)
        assert fast.cursors == general.cursors and fast.token == general.token


@pytest.mark.parametrize("grant", [None, Grant("p_1", 1_000_600, "summary")])
async def test_a_replay_batch_of_one_conversation_is_framed_in_one_pass_alike(
    grant: Grant | None,
) -> None:
    rng = random.Random(7)
    batch = [f for f in frames(rng, 400)
             if b'"conversation_id":"c_a"' in f[:80]
             and (b'"type":"face.event"' in f[:20] or b'"type":"face.chat.delta"' in f[:26])]
    assert len(batch) > 200
    fast, general = stream(grant, {}), stream(grant, {})
    assert fast.encode(batch) == general.encode_each(batch)
    assert fast.cursors == general.cursors and fast.token == general.token
