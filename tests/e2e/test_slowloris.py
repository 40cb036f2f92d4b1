"""Anyone who reaches the port cannot lock the Faces out (docs/operations.md,
"Limits"), on both servers: a real ``halfpi mind`` that may open only 256
files gets 400 sockets that never finish their request head, from five
addresses, and a Face still says hello and is welcomed within a second;
the log tells of it in a few lines, never a traceback per socket."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from tests.e2e.test_tls import Tls, authority, tls
from tests.support.mind import MindProcess
from tests.support.slowloris import flood
from tests.support.wait import until

pytestmark = pytest.mark.e2e

__all__ = ["authority", "tls"]  # fixtures

DESCRIPTORS = 256
SOURCES = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.1"]
PER_SOURCE = 80  # 400 in all: more than the Mind may open


@pytest.fixture
def small_mind(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, server=server_kind, nofile=DESCRIPTORS).start()
    try:
        yield mind
    finally:
        mind.kill()


async def welcome_latency(url: str, token: str) -> float:
    """Seconds from connect to ``face.welcome``."""
    started = time.monotonic()
    async with websockets.connect(url, open_timeout=5) as ws:
        await ws.send(json.dumps({"type": "face.hello", "payload": {
            "token": token, "client": {"name": "test", "version": "0"}, "protocol": 3}}))
        frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert frame["type"] == "face.welcome", frame
    return time.monotonic() - started


async def test_a_face_is_welcomed_while_more_sockets_than_descriptors_dribble(
    small_mind: MindProcess,
) -> None:
    async with flood(small_mind.port, SOURCES, PER_SOURCE) as dribblers:
        # The Mind holds no more unauthenticated connections than its caps
        # (half its descriptors): the oldest of each address were closed.
        await until(lambda: sum(not d.closed for d in dribblers) <= DESCRIPTORS // 2, 30)
        latency = await welcome_latency(small_mind.url, small_mind.token)
        assert latency < 1.0, f"the Face waited {latency:.2f} s"
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"http://127.0.0.1:{small_mind.port}/v1/conversations",
                                    headers={"Authorization": f"Bearer {small_mind.token}"},
                                    timeout=5)
        assert answer.status_code == 200
        closed = sum(d.closed for d in dribblers)
    log = (small_mind.home / "mind.log").read_text()
    assert "Traceback" not in log
    assert log.count("\n") < 60, log[-3000:]
    assert closed >= len(dribblers) - DESCRIPTORS // 2
    assert "connections not yet authenticated: at most 128, 16 per address" in log


async def test_a_face_is_welcomed_over_tls_while_more_handshakes_than_descriptors_stall(
    tmp_path: Path, tls: Tls, server_kind: str,
) -> None:
    """With ``--tls-cert`` a connection is pending from its accept, before
    its TLS handshake ends: one displaced then must be closed then too, not
    when its handshake times out."""
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, server=server_kind, nofile=DESCRIPTORS, extra_args=(
        "--tls-cert", str(tls.cert), "--tls-key", str(tls.key))).start()
    try:
        async with flood(mind.port, SOURCES, PER_SOURCE, tls=True) as dribblers:
            # Closed when displaced, not when their handshake times out (10 s).
            await until(lambda: sum(not d.closed for d in dribblers) <= DESCRIPTORS // 2, 5)
            started = time.monotonic()
            async with websockets.connect(mind.url, open_timeout=5, ssl=tls.context()) as ws:
                await ws.send(json.dumps({"type": "face.hello", "payload": {
                    "token": mind.token, "client": {"name": "test", "version": "0"},
                    "protocol": 3}}))
                frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert frame["type"] == "face.welcome", frame
            latency = time.monotonic() - started
            assert latency < 1.0, f"the Face waited {latency:.2f} s"
        log = (home / "mind.log").read_text()
        assert "Traceback" not in log
    finally:
        mind.kill()


MANY_SOURCES = [f"127.0.1.{n}" for n in range(1, 11)]


async def test_a_flood_from_ten_addresses_does_not_displace_a_face_mid_handshake(
    small_mind: MindProcess,
) -> None:
    """Ten addresses fill the total cap (128) that one address could not
    (16 each); a Face whose request head is half sent while 300 more of
    their sockets arrive is still the one that gets its upgrade."""
    async with flood(small_mind.port, MANY_SOURCES, 15):  # the total is full
        reader, writer = await asyncio.open_connection("127.0.0.1", small_mind.port)
        try:
            writer.write(b"GET /v1/face HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
            await writer.drain()
            async with flood(small_mind.port, MANY_SOURCES, 30) as more:
                # Every one of them accepted, or closed to make room.
                await until(lambda: sum(not d.closed for d in more) <= DESCRIPTORS // 2, 30)
                writer.write(b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
                await writer.drain()
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert answer.startswith(b"HTTP/1.1 101"), answer
        finally:
            writer.close()
