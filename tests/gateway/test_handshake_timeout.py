"""The hello timeout (DESIGN §4, §11) also ends connections that never upgrade."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.client import FaceClient
from tests.support.mind import local_mind


async def test_connection_without_handshake_is_closed_after_the_hello_timeout(
    tmp_path: Path,
) -> None:
    async with local_mind(tmp_path / "home", hello_timeout_s=0.2, local_hand=False) as lmind:
        port = lmind.server.port
        # Control: an upgraded connection that never says hello is closed (4010).
        ws = await FaceClient.connect(lmind.url, hello=False)
        assert await ws.closed_with(timeout=5) == 4010
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/face HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(), 3.0)
        except TimeoutError:
            data = None
        finally:
            writer.close()
        assert data is not None, "the Mind still holds a connection that never upgraded"
