"""The ASGI adapter, driven without sockets: an ASGI server's side in memory.

The adapter only moves frames between ASGI messages and the same sessions
the native server drives, so these tests look at what it alone decides:
the pressure signal (a blocked send or a full buffer pauses the session), a
peer that takes nothing (released after the close timeout), refusals
before the handshake is accepted, the hard frame limit under a server that
allows more, and liveness left to the server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from halfpi.errors import CloseCode
from halfpi.gateway.asgi import AsgiConnection, AsgiGateway
from halfpi.gateway.native import HIGH_WATER
from halfpi.gateway.session import FaceSession
from tests.support.mind import LocalMind, local_mind

Message = dict[str, Any]
DENIAL = {"websocket.http.response": {}}


class AsgiPeer:
    """An ASGI server's side of one WebSocket call, in memory. ``gate``
    holds ``websocket.send`` back, as a server whose buffer is full does."""

    def __init__(self, path: str = "/v1/face", *, headers: list[tuple[bytes, bytes]] | None = None,
                 extensions: dict[str, Any] | None = None) -> None:
        self.scope: dict[str, Any] = {
            "type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1", "scheme": "ws", "path": path, "raw_path": path.encode(),
            "root_path": "", "query_string": b"", "headers": headers or [],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
            "subprotocols": [], "extensions": extensions if extensions is not None else DENIAL,
        }
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.sent: list[Message] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.task: asyncio.Task[None] | None = None

    async def receive(self) -> Message:
        return await self.inbox.get()

    async def send(self, message: Message) -> None:
        if message["type"] == "websocket.send":
            await self.gate.wait()  # returns at once while open, as uvicorn's does
        elif message["type"] == "websocket.close":  # as uvicorn does: the app hears it back
            self.inbox.put_nowait({"type": "websocket.disconnect", "code": message["code"]})
        self.sent.append(message)

    def start(self, app: AsgiGateway) -> AsgiPeer:
        self.inbox.put_nowait({"type": "websocket.connect"})
        self.task = asyncio.create_task(app(self.scope, self.receive, self.send))
        return self

    def say(self, type_: str, payload: dict[str, Any]) -> None:
        text = json.dumps({"type": type_, "payload": payload})
        self.inbox.put_nowait({"type": "websocket.receive", "text": text})

    def frames(self) -> list[dict[str, Any]]:
        return [json.loads(m["text"]) for m in self.sent if m["type"] == "websocket.send"]

    def types(self) -> list[str]:
        return [m["type"] for m in self.sent]


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


@pytest.fixture
async def mind(tmp_path: Path) -> AsyncIterator[LocalMind]:
    async with local_mind(tmp_path / "home", local_hand=False, max_frame_bytes=1024) as m:
        yield m


async def open_face(gateway: AsgiGateway, token: str) -> tuple[AsgiPeer, AsgiConnection]:
    known = set(gateway.connections)
    peer = AsgiPeer().start(gateway)
    peer.say("face.hello", {"token": token, "client": {"name": "t", "version": "0"},
                            "protocol": 3})
    await until(lambda: any(f["type"] == "face.welcome" for f in peer.frames()))
    (connection,) = gateway.connections - known
    return peer, connection


def session_of(connection: AsgiConnection) -> FaceSession:
    assert isinstance(connection.session, FaceSession)
    return connection.session


async def test_a_send_the_server_holds_back_pauses_the_session_until_it_completes(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    peer, connection = await open_face(gateway, mind.token)
    session = session_of(connection)
    peer.gate.clear()  # the server stops taking writes
    peer.say("face.ping", {"request_id": "p1"})
    await until(lambda: session.paused)
    peer.say("face.ping", {"request_id": "p2"})  # answered into the queue meanwhile
    await until(lambda: len(session.queue) == 1)
    peer.gate.set()
    await until(lambda: [f["payload"].get("request_id") for f in peer.frames()][-2:]
                == ["p1", "p2"])
    assert not session.paused


async def test_writes_beyond_the_high_water_mark_pause_the_session_at_once(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    peer, connection = await open_face(gateway, mind.token)
    session = session_of(connection)
    peer.gate.clear()
    frame = json.dumps({"type": "face.pong", "payload": {"pad": "x" * HIGH_WATER}}).encode()
    connection.write_frames([frame])
    assert session.paused  # before any send had a chance to block
    peer.gate.set()
    await until(lambda: not session.paused)
    assert peer.frames()[-1]["payload"]["pad"] == "x" * HIGH_WATER


async def test_a_peer_that_takes_nothing_is_released_after_the_close_timeout(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    gateway.close_timeout_s = 0.2
    peer, connection = await open_face(gateway, mind.token)
    session = session_of(connection)
    peer.gate.clear()  # and it never opens again
    session.evict()
    assert peer.task is not None
    await asyncio.wait_for(peer.task, 5)  # the ASGI call ended: the server may drop the socket
    assert session.closed and session.conn not in mind.mind.connections
    assert connection not in gateway.connections
    assert "websocket.close" not in peer.types()  # it could not even be written


async def test_the_evicted_frame_and_the_close_follow_what_was_already_written(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    peer, connection = await open_face(gateway, mind.token)
    session_of(connection).evict()
    await until(lambda: "websocket.close" in peer.types())
    assert peer.frames()[-1]["type"] == "face.evicted"
    assert peer.sent[-1] == {"type": "websocket.close", "code": CloseCode.SLOW_CONSUMER,
                             "reason": "slow consumer: resume from your cursors"}


async def test_a_message_over_the_hard_limit_closes_1009_under_a_laxer_server(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    peer, _ = await open_face(gateway, mind.token)
    peer.inbox.put_nowait({"type": "websocket.receive", "text": "x" * (4 * 1024 + 1)})
    await until(lambda: "websocket.close" in peer.types())
    assert peer.sent[-1]["code"] == 1009
    # Between max_frame_bytes and the hard limit: a face.error, the connection stays.
    other, _ = await open_face(gateway, mind.token)
    other.say("face.ping", {"request_id": "y" * 2000})
    await until(lambda: any(f["type"] == "face.error" for f in other.frames()))
    assert "websocket.close" not in other.types()


async def test_a_foreign_origin_is_refused_before_the_handshake_is_accepted(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    peer = AsgiPeer(headers=[(b"origin", b"https://evil.example")])
    peer.start(gateway)
    assert peer.task is not None
    await asyncio.wait_for(peer.task, 5)
    assert peer.types() == ["websocket.close"]  # before accept: servers answer it 403
    assert not gateway.connections
    assert not [c for c in mind.mind.connections if c.kind == "websocket"]


async def test_the_own_origin_is_the_port_the_host_server_listens_on(mind: LocalMind) -> None:
    gateway = AsgiGateway(mind.mind)
    peer = AsgiPeer(headers=[(b"origin", b"http://localhost:8000")])  # scope server port
    peer.start(gateway)
    await until(lambda: "websocket.accept" in peer.types())


async def test_handshakes_get_503_before_the_mind_starts_and_once_it_stops_accepting(
    mind: LocalMind,
) -> None:
    without_extension = AsgiPeer(extensions={}).start(AsgiGateway())
    assert without_extension.task is not None
    await asyncio.wait_for(without_extension.task, 5)
    assert without_extension.types() == ["websocket.close"]  # the server's 403: the best it has

    unstarted = AsgiGateway()
    early = AsgiPeer().start(unstarted)
    assert early.task is not None
    await asyncio.wait_for(early.task, 5)
    assert early.sent[0]["status"] == 503

    gateway = AsgiGateway(mind.mind)
    gateway.stop_accepting()
    late = AsgiPeer().start(gateway)
    assert late.task is not None
    await asyncio.wait_for(late.task, 5)
    assert late.sent[0]["status"] == 503
    assert "websocket.accept" not in late.types()


async def test_a_ping_request_counts_as_life_because_the_server_owns_liveness(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    _, connection = await open_face(gateway, mind.token)
    session = session_of(connection)
    session.conn.last_inbound = 0.0
    connection.ping()  # what the session asks for after a heartbeat of silence
    assert session.conn.last_inbound == pytest.approx(mind.mind.now(), abs=5)
    session.tick(session.conn.last_inbound + mind.config.dead_after_s - 1)
    assert not session.closed


def writer_tasks() -> list[asyncio.Task[Any]]:
    """The adapter's writer tasks alive now (one per connection at most)."""
    return [t for t in asyncio.all_tasks()
            if getattr(t.get_coro(), "__qualname__", "") == "AsgiConnection._write"]


async def test_a_stream_of_frames_is_written_by_one_writer_task_not_one_per_frame(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    peer, connection = await open_face(gateway, mind.token)
    await until(lambda: not writer_tasks())
    loop = asyncio.get_running_loop()
    created: list[str] = []
    default = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", ""))
        return default(loop, coro) if default else asyncio.Task(coro, loop=loop)

    loop.set_task_factory(counting)
    try:
        for index in range(50):  # as an agent streams: one frame, then a yield to the loop
            connection.write_frames([b'{"type":"face.pong","payload":{"n":%d}}' % index])
            await asyncio.sleep(0)
        await until(lambda: len(peer.frames()) >= 51)
    finally:
        loop.set_task_factory(default)
    assert [f["payload"]["n"] for f in peer.frames()[-50:]] == list(range(50))
    assert created.count("AsgiConnection._write") == 1


async def test_an_idle_connection_keeps_no_writer_task(mind: LocalMind) -> None:
    gateway = AsgiGateway(mind.mind)
    peer, connection = await open_face(gateway, mind.token)
    connection.write_frames([b'{"type":"face.pong","payload":{}}'])
    await until(lambda: peer.frames()[-1]["type"] == "face.pong")
    await until(lambda: not writer_tasks())
    assert not session_of(connection).paused


async def test_sends_held_back_on_several_connections_pause_each_session(
    mind: LocalMind,
) -> None:
    gateway = AsgiGateway(mind.mind)
    peers = [await open_face(gateway, mind.token) for _ in range(3)]
    held, (free_peer, free) = peers[:2], peers[2]
    for peer, _ in held:
        peer.gate.clear()
    for index, (peer, _) in enumerate(peers):
        peer.say("face.ping", {"request_id": f"p{index}"})
    await until(lambda: all(session_of(c).paused for _, c in held))
    await until(lambda: free_peer.frames()[-1]["payload"].get("request_id") == "p2")
    assert not session_of(free).paused
    for peer, _ in held:
        peer.gate.set()
    await until(lambda: not any(session_of(c).paused for _, c in held))
