"""``halfpi mind --server asgi``: the ASGI adapter under uvicorn, as the Mind
configures it. Control frames are the server's under ASGI, so what the
native adapter does for them (tests/gateway/test_native.py) the Mind asks
of uvicorn here: a ping flood from a peer that never reads holds bounded
memory, only the latest ping is answered, and other Faces do not notice.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from tests.support.client import FaceClient
from tests.support.mind import LocalMind, local_mind
from tests.support.raw import RawFace

KiB = 1024
MiB = 1024 * KiB
FLOOD_BYTES = 12 * MiB
PING_WIRE = 2 + 4 + 125  # header, mask, payload of one client ping
BATCH = 2000
# uvicorn's transport pauses its writer above asyncio's default 64 KiB.
TRANSPORT_HIGH_WATER = 64 * KiB


def uvicorn_connections(lmind: LocalMind) -> set[Any]:
    return set(lmind.server.server.server_state.connections)  # type: ignore[attr-defined]


async def watch(protocol: Any, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], protocol.transport.get_write_buffer_size())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.002)


async def test_a_ping_flood_that_never_reads_holds_bounded_memory_under_uvicorn(
    tmp_path: Path,
) -> None:
    async with local_mind(tmp_path / "home", local_hand=False, server="asgi") as lmind:
        other = await FaceClient.connect(lmind.url, lmind.token)
        cid = await other.create_conversation()
        known = uvicorn_connections(lmind)
        flooder = await RawFace.connect(lmind.url, rcvbuf=4096)
        await flooder.hello(lmind.token)
        (protocol,) = uvicorn_connections(lmind) - known

        peak = [0]
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(protocol, peak, stop))
        words = " ".join(f"w{i}" for i in range(40))
        chat = asyncio.create_task(other.chat_to_end(cid, f"/pace 20 {words}", "c1"))
        try:
            for _ in range(FLOOD_BYTES // (BATCH * PING_WIRE)):
                await flooder.send_pings(BATCH)
        finally:
            stop.set()
            await watcher
        assert peak[0] <= TRANSPORT_HIGH_WATER + 4 * KiB, f"held {peak[0]} bytes"

        # The other Face did not notice.
        result = await chat
        assert result["payload"]["status"] == "succeeded"
        assert result["payload"]["content"] == words
        flooder.close()
        await other.close()


async def test_only_the_latest_ping_is_answered_once_writes_flow_again(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", local_hand=False, server="asgi") as lmind:
        known = uvicorn_connections(lmind)
        face = await RawFace.connect(lmind.url, rcvbuf=4096)
        await face.hello(lmind.token)
        (protocol,) = uvicorn_connections(lmind) - known
        (session,) = [c for c in lmind.mind.connections if not c.closed]
        protocol.pause_writing()  # as the transport does when its buffer is full
        await face.send_pings(50, numbered=True)
        await face.send("face.ping", {"request_id": "while-paused"})
        # Its answer cannot be written either: the session feels the pressure,
        # so the Mind has read the command, and every ping before it.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not session.paused:
            assert loop.time() < deadline, "the command was never read"
            await asyncio.sleep(0.01)
        protocol.resume_writing()
        await face.expect(lambda f: f["payload"].get("request_id") == "while-paused")
        await face.send("face.ping", {"request_id": "after"})
        await face.expect(lambda f: f["payload"].get("request_id") == "after")
        assert face.pongs == [b"ping-49"]
        face.close()
