"""A Hand's way back to the Mind: the shared reconnect loop, and what it says.

While it cannot reach the Mind a Hand says what it tries and why it fails,
one line per change of reason — not one per attempt — and one line when it
is back. Driven through the connector seam with a scripted Mind (no
sockets) and a recording ``sleep`` (no waiting).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from halfpi.client.memory import MemoryTransport, memory_connector
from halfpi.client.transport import Connector
from halfpi.core.backoff import backoff
from halfpi.hand.node import HandNode

URL = "ws://mind.test/v1/hand"
Frame = dict[str, Any]


def welcome(link: MemoryTransport) -> None:
    link.feed("hand.welcome", {"hand_id": "dev", "generation": 1, "adopted": [],
                               "abandon": [], "protect": []})


def scripted(plan: list[str | None], links: list[MemoryTransport]) -> Connector:
    """Each attempt fails with the next reason of ``plan``, or (``None``)
    connects to a Mind that welcomes the Hand; then every attempt connects."""
    return memory_connector(plan, links, welcome)


async def serve_until(node: HandNode, done: Callable[[], bool]) -> list[float]:
    """Run the node; every backoff wait is recorded, and the one after
    ``done()`` holds stops it."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if done():
            await node.stop()
        await asyncio.sleep(0)

    node.sleep = sleep
    assert await asyncio.wait_for(node.run_forever(), 10) is True
    return slept


def hand_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "halfpi.hand"]


async def test_a_hand_says_why_it_cannot_reach_the_mind_once_per_change_of_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="halfpi.hand")
    refused = "connection refused (nothing listening there: is the Mind running?)"
    plan: list[str | None] = [refused] * 4 + ["no answer within 10 s"] * 3 + [None]
    links: list[MemoryTransport] = []
    node = HandNode(URL, "hph_x", "dev", connector=scripted(plan, links),
                    delays=lambda: backoff(jitter=False))

    async def cut_once_connected() -> None:
        await asyncio.wait_for(node.connected.wait(), 10)
        links[-1].cut(1012, "restarting")

    cutter = asyncio.create_task(cut_once_connected())
    slept = await serve_until(node, lambda: len(links) == 1 and cutter.done())
    await cutter
    assert slept == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 0.25]  # reset after the welcome
    lines = hand_lines(caplog)
    failures = [line for line in lines if "cannot reach" in line]
    assert failures == [
        f"cannot reach the Mind at {URL}: {refused}; retrying in 0.2 s (attempt 1)",
        f"cannot reach the Mind at {URL}: no answer within 10 s; retrying in 4.0 s (attempt 5)",
    ]
    assert f"connected to the Mind at {URL}" in lines
    assert lines.index(f"connected to the Mind at {URL}") > lines.index(failures[-1])
    assert [line for line in lines if "lost the connection" in line] == [
        f"lost the connection to the Mind at {URL}: the Mind is restarting;"
        " reconnecting in 0.2 s"
    ]


async def test_a_hand_that_connects_at_once_says_nothing_about_retrying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="halfpi.hand")
    links: list[MemoryTransport] = []
    node = HandNode(URL, "hph_x", "dev", connector=scripted([], links))

    async def stop_once_connected() -> None:
        await asyncio.wait_for(node.connected.wait(), 10)
        await node.stop()

    stopper = asyncio.create_task(stop_once_connected())
    assert await asyncio.wait_for(node.run_forever(), 10) is True
    await stopper
    assert [line for line in hand_lines(caplog) if "cannot reach" in line
            or "connected to" in line or "lost" in line] == []


async def test_a_hand_on_this_machine_retries_at_least_every_two_seconds() -> None:
    local = "ws://127.0.0.1:15707/v1/hand"
    links: list[MemoryTransport] = []
    node = HandNode(local, "hph_x", "dev", connector=scripted(["refused"] * 12, links))

    async def stop_once_connected() -> None:
        await asyncio.wait_for(node.connected.wait(), 10)
        await node.stop()

    stopper = asyncio.create_task(stop_once_connected())
    slept = await serve_until(node, lambda: False)
    await stopper
    assert len(slept) == 12
    assert max(slept) <= 2.0


async def test_a_hand_refused_by_the_mind_stops_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    links: list[MemoryTransport] = []

    refusing = memory_connector([], links, lambda link: link.cut(4001, "unauthorized"))
    node = HandNode(URL, "hph_x", "dev", connector=refusing)
    slept = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    node.sleep = sleep
    assert await asyncio.wait_for(node.run_forever(), 10) is False
    assert (len(links), slept) == (1, [])
    assert any("refused this Hand (4001)" in line for line in hand_lines(caplog))
