"""The maintenance loop visits a session only when something is due for it.

Idle connections must cost nothing per maintenance round (a heap of
deadlines, see ``halfpi.core.timers``) while the behaviour stays: hello
timeout 4010, ``face.ping`` every heartbeat, presumed dead after
``dead_after_s`` without inbound traffic. Real sessions and a real Mind,
no sockets: a recording transport and a clock the test moves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config
from halfpi.errors import CloseCode
from halfpi.gateway.hand_session import HandSession
from halfpi.gateway.session import FaceSession
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.service import Mind
from halfpi.store.sqlite import SQLiteStore

T0 = 1_000_000.0


@dataclass
class Wire:
    """The session's transport: frames out are recorded, close is noted."""

    frames: list[dict[str, object]] = field(default_factory=list)
    closed_with: int | None = None
    address: str = "192.0.2.1"
    pings: int = 0

    def ping(self) -> None:
        self.pings += 1

    def write_frames(self, frames: list[bytes]) -> None:
        self.frames.extend(json.loads(f) for f in frames)

    def close(self, code: int, reason: str) -> None:
        self.closed_with = code

    def of_type(self, type_: str) -> list[dict[str, object]]:
        return [f for f in self.frames if f["type"] == type_]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def mind(tmp_path: Path) -> AsyncIterator[tuple[Mind, Clock]]:
    clock = Clock()
    # The loop's own rounds never come during a test: the test runs them.
    config = Config(
        home=tmp_path,
        port=0,
        credential_poll_s=3600.0,
        local_hand=False,
        max_connections_per_principal=0,  # 300 sessions of one credential
    )
    m = Mind(
        config,
        SQLiteStore(config.db_path),
        MemoryJournal(config.journal),
        ScriptedAgent(0.0),
        clock=clock,
    )
    await m.start()
    try:
        yield m, clock
    finally:
        await m.drain()


async def open_session(m: Mind) -> tuple[FaceSession, Wire]:
    wire = Wire()
    session = FaceSession(m, wire)
    token = m.config.face_token_path.read_text().strip()
    hello = {"token": token, "client": {"name": "t", "version": "1"}, "protocol": 3}
    session.on_frame(json.dumps({"type": "face.hello", "payload": hello}).encode())
    for _ in range(200):
        if wire.of_type("face.welcome"):
            return session, wire
        await asyncio.sleep(0.005)
    raise AssertionError(f"no welcome: {wire.frames}")


async def test_idle_sessions_are_not_visited_between_their_deadlines(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    opened = [await open_session(m) for _ in range(300)]
    heartbeat = m.config.heartbeat_s
    assert m.tick_sessions(clock.now) == 300  # a new session is asked for its deadline once
    visits = 0
    while clock.now < T0 + heartbeat - 0.25:  # 4 rounds a second until the first ping
        clock.now += 0.25
        visits += m.tick_sessions(clock.now)
    assert visits == 0
    assert all(not wire.of_type("face.ping") for _, wire in opened)
    clock.now = T0 + heartbeat
    assert m.tick_sessions(clock.now) == 300
    assert all(len(wire.of_type("face.ping")) == 1 for _, wire in opened)
    assert all(wire.closed_with is None for _, wire in opened)


async def test_heartbeats_continue_and_a_silent_face_is_closed_after_dead_after(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    session, wire = await open_session(m)
    talker, talker_wire = await open_session(m)
    config = m.config
    step = 0.25  # the default maintenance period
    end = T0 + config.dead_after_s
    while clock.now < end - step:
        clock.now += step
        if clock.now - talker.last_inbound >= 10.0:
            talker.on_traffic()  # a pong, say: proof of life
        m.tick_sessions(clock.now)
    assert len(wire.of_type("face.ping")) == int(config.dead_after_s // config.heartbeat_s) - 1
    assert wire.closed_with is None
    clock.now = end
    m.tick_sessions(clock.now)
    assert wire.closed_with == CloseCode.GOING_AWAY
    assert session not in m.sessions and session not in m.session_deadlines
    assert talker_wire.closed_with is None  # traffic moved its deadline on
    assert talker in m.session_deadlines


async def test_a_face_without_hello_is_closed_4010_at_the_hello_timeout_not_before(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    wire = Wire()
    FaceSession(m, wire)
    m.tick_sessions(clock.now)
    clock.now = T0 + m.config.hello_timeout_s - 0.01
    m.tick_sessions(clock.now)
    assert wire.closed_with is None
    clock.now = T0 + m.config.hello_timeout_s
    m.tick_sessions(clock.now)
    assert wire.closed_with == CloseCode.HELLO_TIMEOUT


async def test_a_hand_without_hello_is_closed_4010_and_leaves_the_schedule(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    wire = Wire()
    hand = HandSession(m, wire)
    m.tick_sessions(clock.now)
    assert hand in m.session_deadlines
    clock.now = T0 + m.config.hello_timeout_s
    m.tick_sessions(clock.now)
    assert wire.closed_with == CloseCode.HELLO_TIMEOUT
    assert hand not in m.session_deadlines and hand not in m.sessions


async def test_a_session_closed_by_its_peer_leaves_the_schedule(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    session, _ = await open_session(m)
    m.tick_sessions(clock.now)
    assert session in m.session_deadlines
    session.on_closed()
    assert session not in m.session_deadlines
    clock.now += m.config.heartbeat_s
    assert m.tick_sessions(clock.now) == 0


async def test_an_idle_face_gets_a_websocket_ping_each_heartbeat_from_the_schedule(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    _, wire = await open_session(m)
    m.tick_sessions(clock.now)
    heartbeat = m.config.heartbeat_s
    clock.now = T0 + heartbeat - 0.01
    m.tick_sessions(clock.now)
    assert wire.pings == 0
    for beat in (1, 2):
        clock.now = T0 + beat * heartbeat
        m.tick_sessions(clock.now)
        assert wire.pings == beat


async def test_writes_blocked_for_dead_after_evict_at_that_moment_not_later(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    session, wire = await open_session(m)
    m.tick_sessions(clock.now)
    clock.now = T0 + 1.0
    session.pause_writing()  # the peer stopped reading after the deadline was computed
    blocked_until = T0 + 1.0 + m.config.dead_after_s
    talk_every = m.config.heartbeat_s / 2
    while clock.now < blocked_until - 0.25:
        clock.now += 0.25
        if clock.now - session.last_inbound >= talk_every:
            session.on_traffic()  # pings from the peer keep it "alive" but do not unblock
        m.tick_sessions(clock.now)
    assert wire.closed_with is None
    clock.now = blocked_until
    m.tick_sessions(clock.now)
    assert wire.closed_with == CloseCode.SLOW_CONSUMER
    assert wire.of_type("face.evicted")
