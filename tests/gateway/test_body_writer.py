"""A streamed body written straight to the socket (``bounded_http.BodyWriter``)
keeps HTTP's framing exact: chunked for HTTP/1.1 (every chunk's length
right, no empty chunk that would end the body early), as-is for HTTP/1.0,
on both of our servers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.client import FaceClient
from tests.support.mind import local_mind


async def _open(port: int, target: str, token: str, version: str
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/{version}\r\nHost: 127.0.0.1\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    return reader, writer, head


async def _chunks_until(reader: asyncio.StreamReader, mark: bytes) -> bytes:
    """Read chunks (checking each one's framing) until ``mark`` was seen."""
    body = b""
    while mark not in body:
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        size = int(size_line.strip(), 16)
        assert size > 0, "an empty chunk would have ended the body"
        chunk = await asyncio.wait_for(reader.readexactly(size + 2), 10)
        assert chunk.endswith(b"\r\n")
        body += chunk[:-2]
    return body


@pytest.mark.parametrize("server", ["native", "asgi"])
async def test_an_sse_body_is_exactly_chunked_for_http_1_1_and_plain_for_1_0(
    tmp_path: Path, server: str
) -> None:
    async with local_mind(tmp_path / "home", local_hand=False, server=server) as lmind:
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        port = int(lmind.url.split(":")[2].split("/")[0])
        target = f"/v1/conversations/{cid}/events"

        reader, writer, head = await _open(port, target, lmind.token, "1.1")
        assert b"transfer-encoding: chunked" in head.lower()
        assert b"event: face.snapshot" in await _chunks_until(reader, b"event: face.snapshot")
        # Events written while the stream is idle: straight to the socket.
        await face.chat_to_end(cid, "/repeat 30 word")
        body = await _chunks_until(reader, b'"type":"chat.completed"')
        assert body.count(b"event: face.chat.delta") + body.count(b"event: face.event") >= 30
        writer.close()

        reader, writer, head = await _open(port, target, lmind.token, "1.0")
        assert b"transfer-encoding" not in head.lower()
        body = b""
        while b"event: face.snapshot" not in body:
            body += await asyncio.wait_for(reader.read(65536), 10)
        assert body.startswith(b"retry: ")  # the body itself, no chunk sizes
        writer.close()
        await face.close()
