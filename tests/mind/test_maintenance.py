"""The maintenance loop visits a session only when something is due for it.

Idle connections must cost nothing per maintenance round (a heap of
deadlines, see ``halfpi.core.timers``) while the behaviour stays: hello
timeout 4010, ``face.ping`` every heartbeat, presumed dead after
``dead_after_s`` without inbound traffic. Real sessions and a real Mind,
no sockets: a recording transport and a clock the test moves. The rounds
themselves are timers on the Mind's scheduler, so they follow that clock too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
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
from tests.support.clock import T0, FakeClock
from tests.support.rig import Rig, Wire, fake_time_mind
from tests.support.wait import until

Clock = FakeClock


@pytest.fixture
async def mind(tmp_path: Path) -> AsyncIterator[tuple[Mind, Clock]]:
    clock = FakeClock()
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
        clock=clock.wall,
        monotonic=clock,
    )
    clock.drives(m.scheduler)
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
    assert m.tick_connections(clock.now) == 300  # a new session is asked for its deadline once
    visits = 0
    while clock.now < T0 + heartbeat - 0.25:  # 4 rounds a second until the first ping
        clock.now += 0.25
        visits += m.tick_connections(clock.now)
    assert visits == 0
    assert all(not wire.of_type("face.ping") for _, wire in opened)
    clock.now = T0 + heartbeat
    assert m.tick_connections(clock.now) == 300
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
        if clock.now - talker.conn.last_inbound >= 10.0:
            talker.on_traffic()  # a pong, say: proof of life
        m.tick_connections(clock.now)
    assert len(wire.of_type("face.ping")) == int(config.dead_after_s // config.heartbeat_s) - 1
    assert wire.closed_with is None
    clock.now = end
    m.tick_connections(clock.now)
    assert wire.closed_with == CloseCode.GOING_AWAY
    assert session.conn not in m.connections and session.conn not in m.connections.deadlines
    assert talker_wire.closed_with is None  # traffic moved its deadline on
    assert talker.conn in m.connections.deadlines


async def test_a_face_without_hello_is_closed_4010_at_the_hello_timeout_not_before(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    wire = Wire()
    FaceSession(m, wire)
    m.tick_connections(clock.now)
    clock.now = T0 + m.config.hello_timeout_s - 0.01
    m.tick_connections(clock.now)
    assert wire.closed_with is None
    clock.now = T0 + m.config.hello_timeout_s
    m.tick_connections(clock.now)
    assert wire.closed_with == CloseCode.HELLO_TIMEOUT


async def test_a_hand_without_hello_is_closed_4010_and_leaves_the_schedule(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    wire = Wire()
    hand = HandSession(m, wire)
    m.tick_connections(clock.now)
    assert hand.conn in m.connections.deadlines
    clock.now = T0 + m.config.hello_timeout_s
    m.tick_connections(clock.now)
    assert wire.closed_with == CloseCode.HELLO_TIMEOUT
    assert hand.conn not in m.connections.deadlines and hand.conn not in m.connections


async def test_a_session_closed_by_its_peer_leaves_the_schedule(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    session, _ = await open_session(m)
    m.tick_connections(clock.now)
    assert session.conn in m.connections.deadlines
    session.on_closed()
    assert session.conn not in m.connections.deadlines
    clock.now += m.config.heartbeat_s
    assert m.tick_connections(clock.now) == 0


async def test_an_idle_face_gets_a_websocket_ping_each_heartbeat_from_the_schedule(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    _, wire = await open_session(m)
    m.tick_connections(clock.now)
    heartbeat = m.config.heartbeat_s
    clock.now = T0 + heartbeat - 0.01
    m.tick_connections(clock.now)
    assert wire.pings == 0
    for beat in (1, 2):
        clock.now = T0 + beat * heartbeat
        m.tick_connections(clock.now)
        assert wire.pings == beat


async def test_writes_blocked_for_dead_after_evict_at_that_moment_not_later(
    mind: tuple[Mind, Clock],
) -> None:
    m, clock = mind
    session, wire = await open_session(m)
    m.tick_connections(clock.now)
    clock.now = T0 + 1.0
    session.pause_writing()  # the peer stopped reading after the deadline was computed
    blocked_until = T0 + 1.0 + m.config.dead_after_s
    talk_every = m.config.heartbeat_s / 2
    while clock.now < blocked_until - 0.25:
        clock.now += 0.25
        if clock.now - session.conn.last_inbound >= talk_every:
            session.on_traffic()  # pings from the peer keep it "alive" but do not unblock
        m.tick_connections(clock.now)
    assert wire.closed_with is None
    clock.now = blocked_until
    m.tick_connections(clock.now)
    assert wire.closed_with == CloseCode.SLOW_CONSUMER
    assert wire.of_type("face.evicted")


# -- the rounds are timers on the Mind's scheduler ------------------------------------


async def maintenance_after(rig: Rig, seconds: float) -> None:
    """Move the Mind's clock; return once the round that came due has ended
    (it sets the next one as it ends)."""
    rig.advance(seconds)

    def next_round_set() -> bool:
        at = rig.mind.scheduler.next_deadline()
        return at is not None and at > rig.clock.now

    await until(next_round_set)


async def test_maintenance_rounds_follow_the_minds_clock(tmp_path: Path) -> None:
    liveness = Config(home=tmp_path)
    async with fake_time_mind(
        tmp_path / "home",
        heartbeat_s=liveness.heartbeat_s,
        dead_after_s=liveness.dead_after_s,
    ) as rig:
        period = rig.mind.config.credential_poll_s  # a round every 0.25 s of its clock
        face = await rig.face()
        await maintenance_after(rig, liveness.heartbeat_s - period)
        assert face.wire.pings == 0 and face.wire.of_type("face.ping") == []
        await maintenance_after(rig, period)
        assert face.wire.pings == 1 and len(face.wire.of_type("face.ping")) == 1
        assert face.wire.closed_with is None
        await maintenance_after(rig, liveness.dead_after_s - liveness.heartbeat_s)
        assert face.wire.closed_with == CloseCode.GOING_AWAY  # it never answered


class BeatingWire(Wire):
    """The native server's side: a heartbeat is one write (``beat``)."""

    def __init__(self) -> None:
        super().__init__()
        self.beats = 0

    def beat(self, frame: bytes) -> None:
        self.beats += 1
        self.write_frames([frame])


async def test_one_round_serves_every_heartbeat_due_in_it_with_one_face_ping(
    mind: tuple[Mind, Clock],
) -> None:
    """Faces whose heartbeats fall in one round get it in that round, each
    as one write (the face.ping and the ping together), the face.ping made
    once for all of them — even when a pong moved the ping 2 ms later."""
    m, clock = mind
    wires = []
    for _ in range(50):
        wire = BeatingWire()
        session = FaceSession(m, wire)
        token = m.config.face_token_path.read_text().strip()
        hello = {"token": token, "client": {"name": "t", "version": "1"}, "protocol": 3}
        session.on_frame(json.dumps({"type": "face.hello", "payload": hello}).encode())
        wires.append((session, wire))
    await until(lambda: all(w.of_type("face.welcome") for _, w in wires))
    heartbeat = m.config.heartbeat_s
    clock.now = T0 + heartbeat
    assert m.tick_connections(clock.now) == 50
    assert all(w.beats == 1 and w.pings == 0 for _, w in wires)
    stamps = {w.of_type("face.ping")[0]["payload"]["ts"] for _, w in wires}
    assert len(stamps) == 1  # one face.ping for the round
    clock.now = T0 + heartbeat + 0.002
    for session, _ in wires:
        session.on_traffic()  # the pongs
    clock.now = T0 + 2 * heartbeat
    assert m.tick_connections(clock.now) == 50  # one visit each, not two 2 ms apart
    assert all(w.beats == 2 and w.pings == 0 for _, w in wires)
