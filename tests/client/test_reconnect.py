"""The shared reconnect loop, over in-memory transports and a recording sleep."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import pytest

from halfpi.client.errors import ConnectionLost
from halfpi.client.memory import MemoryTransport, memory_connector
from halfpi.client.reconnect import Reconnect
from halfpi.client.redial import Retry
from halfpi.client.transport import Transport
from halfpi.core.backoff import backoff
from tests.support.wait import until

URL = "ws://mind.test/v1/x"


async def handshake(transport: Transport) -> str:
    """Say hello; the welcome's text, or ConnectionLost."""
    await transport.send(json.dumps({"type": "hello", "payload": {}}))
    frame = json.loads(await transport.recv())
    if frame["type"] != "welcome":
        raise ConnectionLost(None, f"got {frame['type']}")
    return str(frame["payload"]["text"])


def welcoming(link: MemoryTransport) -> None:
    link.feed("welcome", {"text": f"hi #{link.url}"})


class Rig:
    def __init__(
        self, script: list[str | None], on_open: Callable[[MemoryTransport], None] = welcoming
    ) -> None:
        self.links: list[MemoryTransport] = []
        self.slept: list[float] = []
        self.retries: list[Retry] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.reconnect: Reconnect[str] = Reconnect(
            URL, memory_connector(script, self.links, on_open), handshake,
            sleep=self.sleep, clock=lambda: 50.0, delays=lambda: backoff(jitter=False),
            on_retry=self.retries.append,
        )

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await self.hold.wait()


async def test_failed_dials_are_waited_out_then_a_welcomed_link_is_yielded() -> None:
    rig = Rig(["refused", "no route", None])
    async with contextlib.aclosing(rig.reconnect.links()) as links:
        link = await anext(links)
    assert (link.url, link.welcome) == (URL, f"hi #{URL}")
    assert rig.slept == [0.25, 0.5]
    assert [(r.attempt, r.why, r.next_at) for r in rig.retries] == [
        (1, "refused", 50.25), (2, "no route", 50.5)]
    assert rig.links[0].closed  # closed with the generator


async def test_a_failed_hello_is_a_failed_attempt_and_its_link_is_closed() -> None:
    def answer(link: MemoryTransport) -> None:
        link.feed("nope" if len(rig.links) == 1 else "welcome", {"text": "ok"})

    rig = Rig([], on_open=answer)
    async with contextlib.aclosing(rig.reconnect.links()) as links:
        link = await anext(links)
        assert link.welcome == "ok"
        assert rig.links[0].closed and not rig.links[1].closed
    assert [r.why for r in rig.retries] == ["got nope"]


async def test_the_end_of_a_session_says_why_and_the_backoff_starts_over() -> None:
    rig = Rig(["refused", "refused", None])
    async with contextlib.aclosing(rig.reconnect.links()) as links:
        first = await anext(links)
        first.lost = ConnectionLost(1012, "restart")
        second = await anext(links)
    assert first.transport.closed and second is not first
    assert rig.slept == [0.25, 0.5, 0.25]
    assert (rig.retries[-1].why, rig.retries[-1].lost) == ("the Mind is restarting", True)


@pytest.mark.parametrize("code", [4001, 4003])
async def test_a_refusal_ends_the_loop_in_the_hello_or_in_a_session(code: int) -> None:
    rig = Rig([], on_open=lambda link: link.cut(code, "no"))
    with pytest.raises(ConnectionLost) as info:
        async for _ in rig.reconnect:
            pass
    assert info.value.code == code and rig.slept == []

    rig = Rig([])
    with pytest.raises(ConnectionLost):
        async for link in rig.reconnect:
            link.lost = ConnectionLost(code, "revoked")
    assert rig.slept == [] and len(rig.links) == 1


async def test_wake_cuts_a_wait_short_and_close_ends_the_loop() -> None:
    rig = Rig(["refused", "refused"])
    rig.hold.clear()  # no wait ends on its own
    links = rig.reconnect.links()
    task = asyncio.ensure_future(anext(links))
    await until(lambda: len(rig.slept) == 1)
    rig.reconnect.wake()
    await until(lambda: len(rig.slept) == 2)
    rig.reconnect.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(task, 5)
    assert len(rig.links) == 0 and rig.slept == [0.25, 0.5]
