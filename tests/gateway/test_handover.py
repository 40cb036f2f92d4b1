"""The native server hands every request that is not a WebSocket upgrade of
``/v1/face`` or ``/v1/hand`` to the HTTP door (uvicorn's HTTP protocol), on
the same port, and the WebSocket path is not disturbed by it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from halfpi.gateway.handover import MAX_REQUEST_LINE
from halfpi.gateway.native import FaceServer
from tests.support.client import FaceClient
from tests.support.mind import LocalMind, hand_ready, local_mind
from tests.support.procs import until

Response = tuple[int, dict[str, str], bytes]


@pytest.fixture
async def lmind(tmp_path: Path) -> AsyncIterator[LocalMind]:
    async with local_mind(tmp_path / "home") as running:
        assert isinstance(running.server, FaceServer)
        await hand_ready(running)  # its WebSocket is the one connection before the test's
        yield running


def server_of(lmind: LocalMind) -> FaceServer:
    assert isinstance(lmind.server, FaceServer)
    return lmind.server


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
    size = int(headers.get("content-length", 0))
    body = await asyncio.wait_for(reader.readexactly(size), 10)
    return int(status_line.split()[1]), headers, body


async def test_http_requests_are_served_on_the_faces_port_with_keep_alive(
    lmind: LocalMind,
) -> None:
    before = set(server_of(lmind).connections)  # the local Hand's
    reader, writer = await asyncio.open_connection("127.0.0.1", lmind.server.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"ok\n")
        # The same connection serves the next request: it is uvicorn's now.
        writer.write(
            b"POST /no/such/route HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"
        )
        status, _, _ = await read_response(reader)
        assert status == 404
        assert server_of(lmind).http.connections == 1
        assert server_of(lmind).connections == before, "a handed-over socket is no WebSocket's"
    finally:
        writer.close()


async def test_a_request_line_split_across_reads_is_still_routed(lmind: LocalMind) -> None:
    waiting = len(server_of(lmind).connections) + 1
    reader, writer = await asyncio.open_connection("127.0.0.1", lmind.server.port)
    try:
        for piece in (b"GE", b"T /heal", b"thz HTTP/1.1\r", b"\nHost: x\r\n\r\n"):
            writer.write(piece)
            await writer.drain()
            if piece != b"\nHost: x\r\n\r\n":
                # Nothing decided before the line is whole: still the native server's.
                await until(
                    lambda: len(server_of(lmind).connections) == waiting, 5, "the connection"
                )
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"ok\n")
    finally:
        writer.close()


async def test_a_request_line_too_long_is_refused_414_and_closed(lmind: LocalMind) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", lmind.server.port)
    try:
        writer.write(b"GET /" + b"a" * MAX_REQUEST_LINE)
        await writer.drain()
        status, _, _ = await read_response(reader)
        assert status == 414
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()


async def test_faces_still_connect_beside_http_requests(lmind: LocalMind) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", lmind.server.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        face = await FaceClient.connect(lmind.url, lmind.token)
        try:
            assert face.welcome is not None and face.welcome["type"] == "face.welcome"
        finally:
            await face.ws.close()
    finally:
        writer.close()


async def test_a_plain_get_of_the_face_path_stays_a_websocket_refusal(lmind: LocalMind) -> None:
    """``GET /v1/face`` without an upgrade is the WebSocket layer's to refuse."""
    reader, writer = await asyncio.open_connection("127.0.0.1", lmind.server.port)
    try:
        writer.write(b"GET /v1/face HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, _, _ = await read_response(reader)
        assert status == 426 or status == 400
        assert server_of(lmind).http.connections == 0
    finally:
        writer.close()


async def test_draining_closes_idle_http_connections(lmind: LocalMind) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", lmind.server.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        server = server_of(lmind)
        server.stop_accepting()
        await server.wait_closed(5)
        assert await asyncio.wait_for(reader.read(), 5) == b"", "the kept-alive socket is closed"
        assert server.http.connections == 0
    finally:
        writer.close()
