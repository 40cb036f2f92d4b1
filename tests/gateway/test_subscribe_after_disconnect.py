"""A subscription whose connection closed while it was being set up is never installed."""

from __future__ import annotations

import asyncio

from tests.support.client import FaceClient
from tests.support.mind import LocalMind
from tests.support.store import HeldReads
from tests.support.wait import until


async def test_subscribe_finishing_after_disconnect_leaves_no_subscriber(
    lmind: LocalMind,
) -> None:
    mind = lmind.mind
    owner = await FaceClient.connect(lmind.url, lmind.token)
    cid = await owner.create_conversation()
    actor = await mind.actor(cid)
    before = set(mind.connections)
    leaving = await FaceClient.connect(lmind.url, lmind.token)
    (conn,) = [c for c in set(mind.connections) - before if c.kind == "websocket"]
    session = conn.framing.transport.session  # type: ignore[attr-defined]
    held = HeldReads(mind.store)
    mind.store = held  # type: ignore[assignment]
    await leaving.command("face.subscribe", conversation_ids=[cid], snapshot=True)
    await asyncio.wait_for(held.arrived.wait(), 10)
    await leaving.close()  # the network drops while the snapshot is read
    await until(lambda: session.closed)
    mind.store = held.inner
    held.gate.set()
    await until(lambda: session._worker is None)
    # The conversation keeps a dead connection as a subscriber for ever.
    assert session not in actor.subscribers
    await owner.close()
