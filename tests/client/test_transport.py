"""The WebSocket transport says why a connection failed, in words."""

from __future__ import annotations

import socket

import pytest

from halfpi.client.transport import ConnectionLost, websocket_connector


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_refused_connection_says_nothing_is_listening() -> None:
    with pytest.raises(ConnectionLost) as info:
        await websocket_connector(f"ws://127.0.0.1:{free_port()}/v1/face")
    assert info.value.code is None
    assert info.value.describe() == (
        "connection refused (nothing listening there: is the Mind running?)"
    )


async def test_a_bad_url_is_a_lost_connection_not_a_crash() -> None:
    with pytest.raises(ConnectionLost) as info:
        await websocket_connector("http://127.0.0.1/v1/face")
    assert info.value.describe()
