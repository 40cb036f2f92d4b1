"""A Face session without sockets: frames in, frames out, a fake clock.

Liveness (docs/protocol.md §11): the Mind pings idle connections at the
WebSocket level and counts any pong or frame as life, so a client that
only reads — a browser cannot send WebSocket pings, and most libraries
answer the server's pings by themselves — is never cut off; one that
answers nothing is closed after ``dead_after_s``. A connection whose writes
stay blocked that long is a slow consumer (4008), pings or not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config
from halfpi.gateway.session import FaceSession
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.service import Mind
from halfpi.store.sqlite import SQLiteStore

Frame = dict[str, Any]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeTransport:
    address: str = "192.0.2.7"
    frames: list[Frame] = field(default_factory=list)
    pings: int = 0
    closed: tuple[int, str] | None = None

    def write_frames(self, frames: list[bytes]) -> None:
        self.frames.extend(json.loads(f) for f in frames)

    def ping(self) -> None:
        self.pings += 1

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def types(self) -> list[str]:
        return [f["type"] for f in self.frames]


@dataclass
class Rig:
    mind: Mind
    clock: FakeClock
    token: str

    def session(self) -> tuple[FaceSession, FakeTransport]:
        transport = FakeTransport()
        return FaceSession(self.mind, transport), transport

    async def hello(self, **payload: Any) -> tuple[FaceSession, FakeTransport]:
        session, transport = self.session()
        body = {"token": self.token, "client": {"name": "t", "version": "0"}, "protocol": 3}
        body.update(payload)
        session.on_frame(json.dumps({"type": "face.hello", "payload": body}).encode())
        await settle(session)
        return session, transport

    def advance(self, seconds: float, *sessions: FaceSession) -> None:
        self.clock.now += seconds
        for session in sessions:
            session.tick(self.clock.now)


async def settle(session: FaceSession) -> None:
    """Let the session's worker handle what it was fed (a condition, polled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while session.busy:  # the store answers from its own thread: real time passes
        assert loop.time() < deadline, "the session never finished its work"
        await asyncio.sleep(0.001)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    clock = FakeClock()
    # The maintenance loop is far away: the test calls tick itself.
    config = Config(home=tmp_path, credential_poll_s=3600.0, local_hand=False)
    mind = Mind(config, SQLiteStore(config.db_path), MemoryJournal(config.journal),
                ScriptedAgent(0.0), clock=clock, monotonic=clock)
    await mind.start()
    try:
        yield Rig(mind, clock, config.face_token_path.read_text().strip())
    finally:
        await mind.drain()


HEARTBEAT = Config(home=Path()).heartbeat_s
DEAD_AFTER = Config(home=Path()).dead_after_s


async def test_a_face_that_only_reads_but_answers_pings_is_never_cut_off(rig: Rig) -> None:
    session, transport = await rig.hello()
    assert transport.types() == ["face.welcome"]
    for _ in range(20):  # five minutes of a client that never sends a frame
        rig.advance(HEARTBEAT, session)
        session.on_traffic()  # its library answers the WebSocket ping: a pong
    assert transport.closed is None
    assert transport.pings == 20


async def test_a_face_that_answers_nothing_is_closed_after_dead_after(rig: Rig) -> None:
    session, transport = await rig.hello()
    rig.advance(DEAD_AFTER - 0.5, session)
    assert transport.closed is None
    assert transport.pings == 1  # asked once it was idle for a heartbeat
    rig.advance(0.5, session)
    assert transport.closed is not None and transport.closed[0] == 1001


async def test_a_busy_connection_gets_no_websocket_ping(rig: Rig) -> None:
    session, transport = await rig.hello()
    for _ in range(10):
        rig.advance(HEARTBEAT / 2, session)
        session.on_traffic()
    assert transport.pings == 0  # never idle for a whole heartbeat
    assert transport.closed is None


async def test_application_ping_is_still_answered(rig: Rig) -> None:
    session, transport = await rig.hello()
    session.on_frame(b'{"type": "face.ping", "payload": {"request_id": "p1"}}')
    await settle(session)
    assert transport.frames[-1]["type"] == "face.pong"
    assert transport.frames[-1]["payload"]["request_id"] == "p1"


async def test_writes_blocked_for_dead_after_close_4008_with_the_cursors(rig: Rig) -> None:
    session, transport = await rig.hello()
    session.pause_writing()
    for _ in range(int(DEAD_AFTER) - 1):
        rig.advance(1.0, session)
        session.on_traffic()  # pings keep arriving: they are not reading
    assert transport.closed is None
    rig.advance(1.0, session)
    assert transport.closed is not None and transport.closed[0] == 4008
    assert transport.frames[-1]["type"] == "face.evicted"
    assert transport.frames[-1]["payload"]["cursors"] == {}


async def test_writes_that_flow_again_in_time_keep_the_connection(rig: Rig) -> None:
    session, transport = await rig.hello()
    for _ in range(5):
        session.pause_writing()
        rig.advance(DEAD_AFTER - 1, session)
        session.on_traffic()
        session.resume_writing()
    assert transport.closed is None


async def test_blocked_writes_before_hello_close_4008_without_cursors(tmp_path: Path) -> None:
    clock = FakeClock()
    config = Config(home=tmp_path, credential_poll_s=3600.0, local_hand=False,
                    hello_timeout_s=1000.0)
    mind = Mind(config, SQLiteStore(config.db_path), MemoryJournal(config.journal),
                ScriptedAgent(0.0), clock=clock, monotonic=clock)
    await mind.start()
    try:
        rig = Rig(mind, clock, "")
        session, transport = rig.session()
        session.pause_writing()
        rig.advance(DEAD_AFTER, session)
        assert transport.closed is not None and transport.closed[0] == 4008
        assert "face.evicted" not in transport.types()
    finally:
        await mind.drain()


# -- every failed hello answers face.error, then closes 4001 ---------------------------

FAILED_HELLOS = [
    ("no_client", {"client": None}, ("invalid_request", "client")),
    ("wrong_protocol", {"protocol": 2}, ("invalid_request", "protocol")),
    ("unknown_token", {"token": "hpf_not-a-token"}, ("unauthorized", None)),
    ("empty_token", {"token": ""}, ("invalid_request", "token")),
]


@pytest.mark.parametrize(("case", "change", "error"), FAILED_HELLOS,
                         ids=[c[0] for c in FAILED_HELLOS])
async def test_every_failed_hello_answers_face_error_then_closes_4001(
    rig: Rig, case: str, change: dict[str, Any], error: tuple[str, str | None]
) -> None:
    body = {k: v for k, v in change.items() if v is not None}
    session, transport = rig.session()
    payload = {"token": rig.token, "client": {"name": "t", "version": "0"}, "protocol": 3}
    payload.update(body)
    for key, value in change.items():
        if value is None:
            del payload[key]
    session.on_frame(json.dumps({"type": "face.hello", "payload": payload}).encode())
    await settle(session)
    assert transport.types() == ["face.error"]
    got = transport.frames[0]["payload"]
    assert (got["code"], got.get("field")) == error
    assert transport.closed is not None and transport.closed[0] == 4001


async def test_garbage_before_hello_is_a_failed_hello(rig: Rig) -> None:
    session, transport = rig.session()
    session.on_frame(b"{not json")
    await settle(session)
    assert transport.types() == ["face.error"]
    assert transport.frames[0]["payload"]["code"] == "invalid_request"
    assert transport.closed is not None and transport.closed[0] == 4001


async def test_a_hello_that_fails_inside_the_mind_is_answered_and_closed(rig: Rig) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the store fell over")

    rig.mind.authenticate = broken  # type: ignore[method-assign,assignment]
    _, transport = await rig.hello()
    assert transport.types() == ["face.error"]
    assert transport.frames[0]["payload"]["code"] == "internal_error"
    assert transport.closed is not None and transport.closed[0] == 1011


# -- commands: decode, authorise, call the Mind API, write what it sends --------------


async def send(session: FaceSession, type_: str, **payload: Any) -> None:
    session.on_frame(json.dumps({"type": type_, "payload": payload}).encode())
    await settle(session)


async def until_sent(transport: FakeTransport, type_: str, request_id: str) -> Frame:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        for frame in transport.frames:
            if frame["type"] == type_ and frame["payload"].get("request_id") == request_id:
                return frame
        assert loop.time() < deadline, f"no {type_} for {request_id}"
        await asyncio.sleep(0.001)


async def conversation_with_a_reply(
    session: FaceSession, transport: FakeTransport, words: int
) -> tuple[str, str]:
    """A conversation, its cursor before anything was said, then a reply of
    ``words`` deltas, finished."""
    await send(session, "face.conversation.create", request_id="c1")
    cid = (await until_sent(transport, "face.result", "c1"))["payload"]["data"]["conversation_id"]
    await send(session, "face.subscribe", request_id="s0", conversation_ids=[cid], snapshot=True)
    start = (await until_sent(transport, "face.snapshot", "s0"))["payload"]["cursor"]
    await send(session, "face.chat", request_id="q1", conversation_id=cid,
               content=f"/repeat {words} w")
    await until_sent(transport, "face.result", "q1")
    return cid, start


async def test_a_resumed_subscription_is_written_after_its_accepted_in_order(rig: Rig) -> None:
    writer, written = await rig.hello()
    cid, start = await conversation_with_a_reply(writer, written, 20)
    reader, transport = await rig.hello()
    await send(reader, "face.subscribe", request_id="s1", conversation_ids=[cid],
               since={cid: start})
    await until_sent(transport, "face.accepted", "s1")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while reader.subscriptions.replaying:  # the flush pulls as the transport takes it
        assert loop.time() < deadline
        await asyncio.sleep(0.001)
    types = transport.types()
    assert types[:2] == ["face.welcome", "face.accepted"]
    replayed = transport.frames[2:]
    assert [f["payload"]["seq"] for f in replayed] == list(range(1, len(replayed) + 1))
    assert replayed[-1]["payload"]["type"] == "chat.completed"
    event_seqs = [f["payload"]["event_seq"] for f in transport.frames]
    assert event_seqs == list(range(1, len(event_seqs) + 1))


async def test_I7_an_eviction_while_replaying_hands_over_the_replay_position(rig: Rig) -> None:
    writer, written = await rig.hello()
    cid, start = await conversation_with_a_reply(writer, written, 5)
    reader, transport = await rig.hello()
    reader.pause_writing()  # nothing flows: the replay cannot start
    await send(reader, "face.subscribe", request_id="s1", conversation_ids=[cid],
               since={cid: start})
    reader.evict()
    assert transport.frames[-1]["type"] == "face.evicted"
    assert transport.frames[-1]["payload"]["cursors"] == {cid: start}
    assert transport.closed is not None and transport.closed[0] == 4008


async def test_a_refusal_of_the_mind_is_one_face_error_naming_the_request(rig: Rig) -> None:
    session, transport = await rig.hello()
    await send(session, "face.chat", request_id="q9", conversation_id="c_nowhere",
               content="hello")
    error = await until_sent(transport, "face.error", "q9")
    assert error["payload"]["code"] == "conversation_not_found"
    assert error["payload"]["field"] == "conversation_id"
    assert transport.closed is None


async def test_I8_a_command_after_revocation_closes_4003_and_reaches_no_handler(
    rig: Rig,
) -> None:
    session, transport = await rig.hello()
    rig.mind.auth.load([], rig.mind.auth.version + 1)  # the credential is gone
    await send(session, "face.conversation.create", request_id="c1")
    assert transport.closed is not None and transport.closed[0] == 4003
    assert "face.accepted" not in transport.types()
    assert await rig.mind.store.list_conversations(10, None) == []
