"""The Durable Streams ecosystem's own client (``@durable-streams/client``,
run by node) follows a conversation of a real ``halfpi mind`` through a
cut connection (DESIGN §9, docs/protocol.md §20), on both servers.

The reader starts at ``-1`` (history first: a chat from before it came),
goes live (long-poll or SSE), has its connection cut by the fault proxy in
the middle of a streamed reply, follows on from its offset, and in the end
has seen exactly the events of the log the snapshot reflects: every seq
once, no gap, the messages the snapshot lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import programs
from tests.support.http_door import Door, door_client, key
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy
from tests.support.stream import assert_contiguous, delta_text
from tests.support.wait import until

NODE_DIR = Path(__file__).resolve().parents[1] / "durable" / "node"


def driver() -> Path:
    """The node driver, its client installed (``npm ci``, once per run); skips
    without node, named in the run's summary (CI requires it: HALFPI_NODE)."""
    programs.node_modules(NODE_DIR)
    return NODE_DIR / "driver.mjs"


class Follower:
    """The node reader: every line it printed, parsed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    @property
    def frames(self) -> list[dict[str, Any]]:
        return [item for line in self.lines for item in line.get("items", ())]

    def events(self, type_: str) -> list[dict[str, Any]]:
        return [f for f in self.frames
                if f["type"] == "face.event" and f["payload"]["type"] == type_]

    def completed(self, request_id: str) -> bool:
        return any(f["payload"]["data"].get("request_id") == request_id
                   for f in self.events("chat.completed"))

    def max_seq(self) -> int:
        return max((f["payload"]["seq"] for f in self.frames), default=0)


@contextlib.asynccontextmanager
async def follow(base: str, cid: str, token: str, live: str) -> AsyncIterator[Follower]:
    proc = await asyncio.create_subprocess_exec(
        "node", str(driver()), base, cid, token, live,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=NODE_DIR,
    )
    follower = Follower(proc)
    try:
        yield follower
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        follower.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower.task


async def chat(door: Door, cid: str, content: str, wait: float) -> str:
    request_id = key("chat")
    answer = await door.command("face.chat", {"conversation_id": cid, "content": content},
                                idempotency_key=request_id, wait=wait)
    assert answer.status_code in (200, 202), answer.text
    return request_id


@pytest.mark.parametrize("live", ["long-poll", "sse"])
async def test_the_durable_streams_client_follows_from_the_start_through_a_cut_exactly(
    tmp_path: Path, server_kind: str, live: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, delta_ms=15, server=server_kind).start()
    proxy = await FaultProxy(mind.port).start()
    try:
        async with door_client(mind.url, mind.token) as door:
            cid = await door.create_conversation("followed")
            before = await chat(door, cid, "/repeat 5 history", wait=30)
            async with follow(f"http://127.0.0.1:{proxy.port}", cid, mind.token, live) as reader:
                # History first, from -1; then up to date.
                await until(lambda: reader.completed(before)
                            and any(line.get("upToDate") for line in reader.lines), 30)
                during = await chat(door, cid, "/repeat 80 streamed", wait=0)
                await until(lambda: delta_text(reader.frames, during).count("streamed") >= 10, 30)
                assert proxy.links, "the reader holds a connection to cut"
                proxy.cut_all()  # in the middle of the reply
                await until(lambda: reader.completed(during), 30)
                assert proxy.links, "the reader came back on a new connection"
                snapshot = (await door.get(f"/v1/conversations/{cid}")).json()
                head = int(snapshot["cursor"].rsplit(".", 1)[1])
                await until(lambda: reader.max_seq() >= head, 30)
                seen = [f for f in reader.frames if f["payload"]["seq"] <= head]
    finally:
        await proxy.stop()
        mind.kill()
    # Every seq of the log once, from the first: no duplicate, no gap.
    assert_contiguous(seen, 1, head)
    # The messages the reader assembled are the snapshot's.
    logged = [(f["payload"]["seq"], f["payload"]["data"]["content"]) for f in seen
              if f["type"] == "face.event"
              and f["payload"]["type"] in ("chat.message", "chat.completed")]
    assert logged == [(m["seq"], m["content"]) for m in snapshot["messages"]]
    assert delta_text(seen, during) == " ".join(["streamed"] * 80)
    assert delta_text(seen, before) == "history history history history history"
