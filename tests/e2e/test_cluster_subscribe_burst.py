"""A burst of Faces subscribing on a node that does not own the conversation
(found by benchmarks/cluster_fanout.py: past the node's Redis pool it used
to fail with internal_error): two real ``halfpi mind`` nodes on one
PostgreSQL and one Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client import FaceClient
from tests.support.mind import MindProcess
from tests.support.postgres import pg_url  # noqa: F401
from tests.support.redis import RedisServer, redis_server  # noqa: F401

pytestmark = pytest.mark.e2e

BURST = 120  # Faces subscribing at once on node b


@pytest.fixture
def two_nodes(tmp_path: Path, pg_url: str,  # noqa: F811
              redis_server: RedisServer) -> Iterator[tuple[MindProcess, MindProcess]]:  # noqa: F811
    nodes = []
    try:
        for name in ("a", "b"):  # one after the other: a makes the schema and the Face token
            home = tmp_path / name
            home.mkdir()
            node = MindProcess(home, extra_args=(
                "--store", pg_url, "--redis", redis_server.url, "--node-id", name,
                "--lease-ms", "2000", "--no-local-hand", "--max-connections-per-principal", "0"))
            nodes.append(node.start())
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.kill()


async def test_a_burst_of_faces_subscribing_on_a_node_not_owning_the_conversation_is_accepted(
    two_nodes: tuple[MindProcess, MindProcess],
) -> None:
    a, b = two_nodes
    token = a.token  # credentials live in PostgreSQL: a's Face token works on b
    owner = await FaceClient.connect(a.url, token)
    cid = await owner.create_conversation()
    faces = await asyncio.gather(*(FaceClient.connect(b.url, token) for _ in range(BURST)))
    try:
        replies = await asyncio.gather(*(face.subscribe(cid) for face in faces))
        refused = [r["payload"] for r in replies if r["type"] != "face.accepted"]
        assert refused == []
    finally:
        await asyncio.gather(*(face.close() for face in (owner, *faces)))
