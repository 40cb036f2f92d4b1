"""Liveness on a shrunken heartbeat (docs/protocol.md §11).

The Mind pings idle connections with WebSocket pings; a client library
answers them by itself, so a Face that only reads is never cut off, even
while the Mind streams to it. A peer that answers nothing is closed (1001).
Under ASGI the server sends the pings and closes the silent peer itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.client import FaceClient
from tests.support.mind import local_mind
from tests.support.raw import RawFace

WORDS = " ".join(f"w{i}" for i in range(30))


async def test_a_face_that_only_reads_is_not_cut_off_while_the_mind_streams(
    tmp_path: Path, server_kind: str,
) -> None:
    async with local_mind(tmp_path / "home", server=server_kind, heartbeat_s=0.1, dead_after_s=0.3,
                          credential_poll_s=0.02, local_hand=False) as m:
        # ping_interval=None: the client never pings on its own; it only
        # answers the Mind's pings, as a browser does.
        face = await FaceClient.connect(m.url, m.token, ping_interval=None)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        # One command, then only reading for 1.5 s: five times dead_after.
        result = await face.chat_to_end(cid, f"/pace 50 {WORDS}", "long", timeout=30)
        assert result["payload"]["status"] == "succeeded"
        assert result["payload"]["content"] == WORDS
        assert face.ws.close_code is None
        # And it keeps being served afterwards.
        request_id = await face.command("face.conversation.list")
        assert (await face.reply(request_id))["payload"]["status"] == "succeeded"
        await face.close()


# Who closes a peer that answers no ping: the Mind's session natively (1001);
# under ASGI the server, which alone sees pings and pongs (uvicorn: 1011,
# "keepalive ping timeout"; docs/asgi.md).
SILENT_PEER_CLOSE = {"native": 1001, "asgi": 1011}


async def test_a_peer_that_answers_no_ping_is_closed_1001_or_by_the_asgi_server_1011(
    tmp_path: Path, server_kind: str
) -> None:
    async with local_mind(tmp_path / "home", heartbeat_s=0.1, dead_after_s=0.3,
                          credential_poll_s=0.02, local_hand=False, server=server_kind) as m:
        silent = await RawFace.connect(m.url)  # reads, but never answers a ping
        await silent.hello(m.token)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ConnectionError):
            await silent.expect(lambda f: False, 10)
        assert silent.close_code == SILENT_PEER_CLOSE[server_kind]
        assert loop.time() - started < 5  # dead_after is 0.3 s
        silent.close()
