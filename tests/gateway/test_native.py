"""The native WebSocket adapter: control frames are bounded like everything else.

A client that floods WebSocket pings and never reads must not make the Mind
keep every pong (RFC 6455 lets an endpoint answer only the most recent
ping): the Mind's memory for that connection stays bounded, the connection
is closed as a slow consumer (4008), and other Faces do not notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from halfpi.gateway.native import HIGH_WATER, WebSocketConnection
from halfpi.gateway.session import FaceSession
from tests.support.client import FaceClient
from tests.support.mind import LocalMind, local_mind
from tests.support.raw import RawFace

KiB = 1024
MiB = 1024 * KiB
FLOOD_BYTES = 12 * MiB
PING_WIRE = 2 + 4 + 125  # header, mask, payload of one client ping
BATCH = 2000


def held_bytes(connection: WebSocketConnection) -> int:
    """What the Mind holds for this connection on its way out: the transport's
    write buffer plus anything the protocol has queued and not handed over."""
    assert connection.transport is not None
    return connection.transport.get_write_buffer_size() + sum(len(b) for b in connection.ws.writes)


async def watch(lmind: LocalMind, known: set[WebSocketConnection], peak: list[int],
                stop: asyncio.Event) -> None:
    """Sample what every new connection holds until ``stop``."""
    while not stop.is_set():
        for connection in lmind.server.connections - known:
            if connection.transport is not None:
                peak[0] = max(peak[0], held_bytes(connection))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.002)


async def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("after_hello", [False, True], ids=["before_hello", "after_hello"])
async def test_a_ping_flood_that_never_reads_holds_bounded_memory(
    tmp_path: Path, after_hello: bool
) -> None:
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        other = await FaceClient.connect(lmind.url, lmind.token)
        cid = await other.create_conversation()
        known = set(lmind.server.connections)
        flooder = await RawFace.connect(lmind.url, rcvbuf=4096)
        if after_hello:
            await flooder.hello(lmind.token)
        (connection,) = lmind.server.connections - known

        peak = [0]
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(lmind, known, peak, stop))
        words = " ".join(f"w{i}" for i in range(40))
        chat = asyncio.create_task(other.chat_to_end(cid, f"/pace 20 {words}", "c1"))
        try:
            for _ in range(FLOOD_BYTES // (BATCH * PING_WIRE)):
                await flooder.send_pings(BATCH)
        finally:
            stop.set()
            await watcher
        assert peak[0] <= HIGH_WATER + 4 * KiB, f"held {peak[0]} bytes for one connection"
        assert connection.ws.pending_pong is None or held_bytes(connection) > 0

        # The other Face did not notice.
        result = await chat
        assert result["payload"]["status"] == "succeeded"
        assert result["payload"]["content"] == words
        flooder.close()
        await other.close()


async def test_a_face_that_pings_but_never_reads_is_closed_4008(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", heartbeat_s=0.3, dead_after_s=1.0,
                          credential_poll_s=0.05,
                          local_hand=False) as lmind:
        other = await FaceClient.connect(lmind.url, lmind.token)
        known = set(lmind.server.connections)
        stalled = await RawFace.connect(lmind.url, rcvbuf=4096)
        await stalled.hello(lmind.token)
        (connection,) = lmind.server.connections - known
        session = connection.session
        assert isinstance(session, FaceSession) and connection.transport is not None
        # A small kernel buffer on the Mind's side: its own buffer fills sooner.
        sock = connection.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        await stalled.send("face.conversation.create", {"request_id": "c"})
        created = await stalled.expect(lambda f: f["type"] == "face.result")
        cid = created["payload"]["data"]["conversation_id"]
        await stalled.send("face.subscribe", {"request_id": "s", "conversation_ids": [cid]})
        await stalled.expect(lambda f: f["type"] == "face.accepted")
        # A reply bigger than every buffer on the way, but well inside the
        # queue's bounds: nothing overflows, the writes just stay blocked …
        await stalled.send("face.chat", {"request_id": "q", "conversation_id": cid,
                                         "content": "/repeat 30 " + "x" * 9999})
        # … while the Face keeps pinging, and never reads again.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not session.closed:
            assert loop.time() < deadline, "a Face that never reads was never closed"
            await stalled.send_pings(1)
            await asyncio.sleep(0.05)  # the pace of its pings
        assert session.paused
        assert await stalled.read_until_closed(15) == 4008
        assert [f["type"] for f in stalled.frames][-1] == "face.evicted"
        stalled.close()
        await still_served(other)
        await other.close()


async def still_served(face: FaceClient) -> None:
    request_id = await face.command("face.conversation.list")
    assert (await face.reply(request_id))["payload"]["status"] == "succeeded"


async def test_only_the_most_recent_ping_is_answered_while_writes_are_blocked(
    tmp_path: Path,
) -> None:
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        known = set(lmind.server.connections)
        face = await RawFace.connect(lmind.url, rcvbuf=4096)
        await face.hello(lmind.token)
        (connection,) = lmind.server.connections - known
        connection.pause_writing()  # as the transport does when its buffer is full
        await face.send_pings(50, numbered=True)
        await until(lambda: connection.ws.pending_pong == b"ping-49")
        assert held_bytes(connection) == 0  # nothing written while blocked
        connection.resume_writing()
        assert connection.ws.pending_pong is None
        # A text command after the pings: its answer comes after any pong.
        await face.send("face.ping", {"request_id": "after"})
        await face.expect(lambda f: f["type"] == "face.pong")
        assert face.pongs == [b"ping-49"]
        face.close()
