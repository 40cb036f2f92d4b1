"""The Mind mounted in a FastAPI app next to the app's own routes (DESIGN §9).

``examples/fastapi_app.py`` is loaded as a user would write it, served by
uvicorn on a real port, and driven with the SDK: the app's own route
answers, a chat runs through the mounted ``/halfpi/v1/face``, the local
Hand connects through ``/halfpi/v1/hand``, and stopping the app drains the
Mind in the app's lifespan (a chat still running ends ``interrupted``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvicorn

from halfpi.asgi import MindApp
from halfpi.config import Config
from halfpi.face.client import FaceClient
from tests.support.client import FaceClient as RawClient
from tests.support.mind import local_mind

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app.py"
WORDS = " ".join(f"w{i}" for i in range(200))


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_app_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def get(url: str) -> tuple[int, bytes]:
    def fetch() -> tuple[int, bytes]:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), bytes(response.read())

    return await asyncio.to_thread(fetch)


async def until_true(check: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


class Served:
    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], port: int) -> None:
        self.server = server
        self.task = task
        self.base = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.task, 30)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = Config(home=tmp_path / "home", port=port, scripted_delta_ms=0.0)
    app = load_example().create_app(config, hand_url=f"ws://127.0.0.1:{port}/halfpi/v1/hand")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=4 * 1024 * 1024))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "uvicorn stopped before it started"
        await asyncio.sleep(0.01)
    running = Served(server, task, port)
    try:
        yield running
    finally:
        if not task.done():
            await running.stop()
        sock.close()


async def test_the_mind_mounted_in_fastapi_serves_a_chat_beside_the_apps_own_routes(
    served: Served, tmp_path: Path
) -> None:
    assert await get(f"{served.base}/hello") == (200, b'{"hello":"from the host app"}')
    assert await get(f"{served.base}/halfpi/healthz") == (200, b"ok\n")

    token = (tmp_path / "home" / "face.token").read_text().strip()
    async with FaceClient(f"{served.ws}/halfpi/v1/face", token) as face:
        cid = await face.create_conversation("mounted")
        view = await face.subscribe(cid)
        result = await face.ask(cid, "hello through fastapi")
        assert result.ok and result.content == "hello through fastapi"
        await face.wait_view(cid, lambda v: any(
            m.role == "assistant" and m.content == "hello through fastapi"
            for m in v.messages), timeout=10)
        assert view.conversation_id == cid

    async def hand_connected() -> bool:
        status, body = await get(f"{served.base}/mind")
        return status == 200 and bool(json.loads(body)["local_hand"])

    await until_true(hand_connected)


async def test_stopping_the_app_drains_the_mounted_mind_in_its_lifespan(
    served: Served, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    token = (home / "face.token").read_text().strip()
    face = await RawClient.connect(f"{served.ws}/halfpi/v1/face", token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    chat = await face.command("face.chat", conversation_id=cid, content=f"/pace 50 {WORDS}")
    await face.expect(lambda f: f["type"] == "face.chat.delta")
    await served.stop()
    assert await face.closed_with(5) == 1012  # the host server said goodbye

    # The chat's end was committed by the drain: a Mind on the same home knows it.
    async with local_mind(home, local_hand=False) as again:
        probe = await RawClient.connect(again.url, token)
        replay = await probe.command("face.chat", chat, conversation_id=cid,
                                     content=f"/pace 50 {WORDS}")
        result = await probe.reply(replay)
        assert result["payload"]["status"] == "interrupted", result
        # Ended by the drain, not found open by recovery: the text shown is kept.
        content = result["payload"].get("content") or ""
        assert content and WORDS.startswith(content), result
        await probe.close()


async def test_a_mind_app_served_on_its_own_runs_its_own_lifespan(tmp_path: Path) -> None:
    home = tmp_path / "home"
    app = MindApp(Config(home=home, scripted_delta_ms=0.0, local_hand=False))
    with pytest.raises(RuntimeError, match="not started"):
        app.mind  # noqa: B018 - the property is the check
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "uvicorn stopped before it started"
            await asyncio.sleep(0.01)
        token = (home / "face.token").read_text().strip()
        face = await RawClient.connect(f"ws://127.0.0.1:{port}/v1/face", token)
        cid = await face.create_conversation()
        result = await face.chat_to_end(cid, "on its own")
        assert result["payload"]["content"] == "on its own"
        assert app.mind.connections
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        sock.close()
    with pytest.raises(RuntimeError, match="not started"):
        app.mind  # noqa: B018 - drained by the lifespan's end


async def test_a_second_mind_app_on_the_same_home_refuses_to_start(tmp_path: Path) -> None:
    from halfpi.errors import HomeInUse

    config = Config(home=tmp_path / "home", port=0, scripted_delta_ms=0.0, local_hand=False)
    first, second = MindApp(config), MindApp(config)
    await first.start()
    try:
        with pytest.raises(HomeInUse, match="in use by another Mind"):
            await second.start()
        with pytest.raises(RuntimeError):
            second.mind  # noqa: B018 - never started: no Mind to reach
    finally:
        await first.stop()
    await second.start()  # the home is free once the first has stopped
    await second.stop()
