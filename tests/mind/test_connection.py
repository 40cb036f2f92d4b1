"""The one connection life of every door (``mind/connection.py``): liveness,
eviction, revocation, the cap and closing once, for every kind, on a fake
clock and with no socket — the Connection is Sans-I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from halfpi.core.events import Error, Ping, Pong, Result, to_message
from halfpi.core.limits import QueueLimits
from halfpi.core.outbound import Message, OutboundQueue
from halfpi.errors import CloseCode, ErrorCode, HalfpiError
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.auth import Credential
from halfpi.mind.connection import TIME_UP, Connection, Liveness, Replies
from halfpi.mind.subscriptions import Subscriptions

KINDS = ("websocket", "hand", "sse", "agui", "durable_sse", "durable", "http")
FACE = Liveness(hello_s=10, ping_s=15, dead_after_s=45, blocked_s=45, news_ping_s=15)
HAND = Liveness(hello_s=10, ping_s=15, dead_after_s=45, blocked_s=45, evicts=False)
STREAM = Liveness(ping_s=15, blocked_s=45)
LIVENESS = {"websocket": FACE, "hand": HAND, "sse": STREAM, "agui": STREAM,
            "durable_sse": STREAM, "durable": Liveness(lifetime_s=20, evicts=False),
            "http": Liveness()}


@dataclass
class Framing:
    kind: str
    budget: int = 256 * 1024
    written: list[bytes] = field(default_factory=list)
    writes: int = 0
    pings: int = 0
    closes: list[tuple[int, str]] = field(default_factory=list)

    def write(self, frames: list[bytes]) -> None:
        self.writes += 1
        self.written.extend(frames)

    def ping(self) -> None:
        self.pings += 1

    def close(self, code: int, reason: str) -> None:
        self.closes.append((code, reason))

    def types(self) -> list[str]:
        return [msgspec.json.decode(f)["type"] for f in self.written]


@dataclass
class Hub:
    """The Mind's side, as the connection sees it: a cap of ``cap`` per
    principal, and a loop turn that tests run by hand (``turn``)."""

    cap: int = 2
    live: dict[str, int] = field(default_factory=dict)
    released: list[Connection] = field(default_factory=list)
    pending: list[Connection] = field(default_factory=list)

    def ready(self, conn: Connection) -> None:
        self.pending.append(conn)

    def turn(self) -> None:
        pending, self.pending = self.pending, []
        for conn in pending:
            conn.flush()

    def bind(self, conn: Connection, credential: Credential) -> bool:
        n = self.live.get(credential.principal_id, 0)
        if n >= self.cap:
            return False
        self.live[credential.principal_id] = n + 1
        return True

    def release(self, conn: Connection) -> None:
        self.released.append(conn)
        if conn.bound and conn.principal_id is not None:
            self.live[conn.principal_id] -= 1

    def subscriptions(self, conn: Connection) -> Subscriptions:
        return Subscriptions(conn, MemoryJournal(), _no_spawn, 50)

    def wall(self) -> float:
        return 1_700_000_000.0

    def heartbeat(self, now: float) -> Message:
        return to_message(Ping(ts=self.wall()))


def _no_spawn(coro: Any, name: str) -> None:
    coro.close()


def credential(principal_id: str = "p_1") -> Credential:
    return Credential(principal_id=principal_id, kind="face", label="laptop",
                      profile="operator", scopes=frozenset({"sessions:read"}),
                      token_hash="x", created_at=0.0)


LIMITS = QueueLimits(reliable_messages=4, reliable_bytes=1 << 20,
                     transient_messages=4, transient_bytes=1 << 20)


def make(kind: str, hub: Hub | None = None, now: float = 0.0,
         collect: Replies | None = None) -> tuple[Connection, Framing, Hub]:
    hub = hub or Hub()
    framing = Framing(kind)
    conn = Connection(hub, framing, LIVENESS[kind], OutboundQueue(LIMITS), now, collect)
    return conn, framing, hub


def event(seq: int, conv: str = "c_1") -> Message:
    cursor = f"ep.{seq}"
    body = msgspec.json.encode({"conversation_id": conv, "seq": seq, "cursor": cursor,
                                "type": "chat.message", "data": {}})
    return Message("face.event", body, conversation_id=conv, seq=seq, cursor=cursor)


@pytest.mark.parametrize("kind", KINDS)
def test_close_is_once_and_releases_once(kind: str) -> None:
    conn, framing, hub = make(kind)
    assert conn.welcome(credential())
    conn.close(CloseCode.REVOKED, "credential revoked")
    conn.close(CloseCode.REVOKED, "again")
    conn.gone()
    assert framing.closes == [(CloseCode.REVOKED, "credential revoked")]
    assert hub.released == [conn]
    assert hub.live["p_1"] == 0  # uncapped exactly once
    conn.send(event(1))
    assert framing.written == []  # a closed connection writes nothing


@pytest.mark.parametrize("kind", KINDS)
def test_the_cap_refuses_beyond_it_and_binds_nothing(kind: str) -> None:
    hub = Hub(cap=1)
    first, _, _ = make(kind, hub)
    second, _, _ = make(kind, hub)
    assert first.welcome(credential())
    assert not second.welcome(credential())
    assert second.principal_id is None and not second.bound
    second.gone()
    assert hub.live["p_1"] == 1  # the refused one never counted
    first.gone()
    assert hub.live["p_1"] == 0
    assert make(kind, hub)[0].welcome(credential())  # room again


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_gone_releases_without_closing_the_transport(kind: str) -> None:
    conn, framing, hub = make(kind)
    conn.welcome(credential())
    conn.gone()
    conn.close(CloseCode.NORMAL, "late")
    assert framing.closes == [] and hub.released == [conn] and conn.state == "closed"


def test_an_idle_connection_writes_at_once_and_a_busy_one_once_per_turn() -> None:
    conn, framing, hub = make("sse")
    conn.welcome(credential())
    conn.send(event(1))
    assert framing.writes == 1  # nothing waited: it overtakes nothing
    conn.pause(0.0)
    conn.send(event(2))
    conn.send(event(3))
    conn.resume()
    assert framing.writes == 1
    hub.turn()
    assert framing.writes == 2 and len(framing.written) == 3  # two frames, one write


def test_I7_overflow_evicts_with_the_cursors_then_closes_4008() -> None:
    conn, framing, _ = make("websocket")
    conn.welcome(credential())
    conn.pause(0.0)
    for seq in range(40):  # far past the reliable bound
        conn.send(event(seq + 1))  # far past the reliable bound
    assert framing.types() == ["face.evicted"]
    assert framing.closes == [(CloseCode.SLOW_CONSUMER, "slow consumer: resume from your cursors")]


def test_a_hand_that_does_not_read_is_closed_not_evicted() -> None:
    conn, framing, _ = make("hand")
    conn.welcome(credential())
    conn.pause(5.0)
    conn.heard(40.0)  # it talks, but does not read
    assert conn.tick(5.0 + 44) is not None
    assert conn.tick(5.0 + 45) is None
    assert framing.written == []
    assert framing.closes == [(CloseCode.SLOW_CONSUMER, "slow consumer: it does not read")]


def test_the_face_rule_hello_ping_and_dead_after_silence() -> None:
    conn, framing, _ = make("websocket")
    assert conn.tick(0.0) == 10  # the hello is due
    assert conn.tick(10.0) is None
    assert framing.closes == [(CloseCode.HELLO_TIMEOUT, "no hello in time")]

    conn, framing, _ = make("websocket")
    conn.checking(1.0)  # a hello being checked waits, unhurried
    assert conn.tick(12.0) == 27.0 and not framing.closes
    conn.welcome(credential())
    conn.heard(20.0)
    assert conn.tick(20.0) == 35.0  # a face.ping now (15 s after it opened), the next at 35
    assert framing.types() == ["face.ping"]  # a news ping once welcomed
    assert conn.tick(35.0) is not None and framing.pings == 1  # idle 15 s: a wire ping
    assert conn.tick(65.0) is None  # 45 s of silence
    assert framing.closes == [(CloseCode.GOING_AWAY, "no traffic: connection presumed dead")]


def test_a_stream_pings_every_heartbeat_and_never_dies_of_silence() -> None:
    conn, framing, _ = make("sse")
    conn.welcome(credential())
    now = 0.0
    for _ in range(10):
        deadline = conn.tick(now)
        assert deadline is not None
        now = deadline
    assert framing.pings == 9 and not framing.closes  # 150 s and never a word from it


def test_I7_a_stream_whose_writes_stay_blocked_is_evicted() -> None:
    conn, framing, _ = make("sse")
    conn.welcome(credential())
    conn.pause(3.0)
    assert conn.tick(3.0) == 15.0
    assert conn.tick(48.0) is None
    assert framing.types() == ["face.evicted"]
    assert framing.closes[0][0] == CloseCode.SLOW_CONSUMER


def test_a_long_poll_ends_at_its_lifetime() -> None:
    conn, framing, _ = make("durable", now=100.0)
    conn.welcome(credential())
    assert conn.tick(100.0) == 120.0
    assert conn.tick(120.0) is None
    assert framing.closes == [(CloseCode.NORMAL, TIME_UP)]


def test_a_one_shot_caller_collects_its_replies_typed() -> None:
    replies = Replies()
    conn, framing, _ = make("http", collect=replies)
    conn.welcome(credential(), capped=False)
    conn.send(event(1))  # not a reply: a one-shot caller follows nothing
    conn.reply(Pong(request_id="r_1"))
    conn.reply_stored("face.result", {"request_id": "r_2", "status": "succeeded",
                                      "data": {"conversation_id": "c_1"}})
    assert replies.items == [
        Pong(request_id="r_1"),
        Result(request_id="r_2", status="succeeded", data={"conversation_id": "c_1"}),
    ]
    assert framing.written == [] and replies.final() == Pong(request_id="r_1")
    assert conn.tick(1e9) is None or not framing.closes  # no liveness of its own


def test_a_refusal_that_came_encoded_is_raised_with_its_code() -> None:
    replies = Replies()
    conn, _, _ = make("http", collect=replies)
    conn.welcome(credential(), capped=False)
    # A command forwarded to another node: its face.error comes back as bytes.
    conn.send(to_message(Error(code="conversation_not_found", message="no such",
                               retryable=False, field="conversation_id")))
    with pytest.raises(HalfpiError) as refused:
        replies.outcome("face.chat")
    assert refused.value.code is ErrorCode.CONVERSATION_NOT_FOUND
    assert refused.value.field == "conversation_id"


def test_close_writes_what_is_queued_before_the_close() -> None:
    conn, framing, _ = make("websocket")
    conn.welcome(credential())
    conn.pause(0.0)
    conn.send(event(1))
    conn.close(CloseCode.RESTARTING, "mind restarting")
    assert framing.types() == ["face.event"]
    assert framing.closes == [(CloseCode.RESTARTING, "mind restarting")]


@dataclass
class BeatingFraming(Framing):
    """A framing that sends a heartbeat as one write (the WebSocket's does)."""

    beats: list[bytes] = field(default_factory=list)

    def beat(self, frame: bytes) -> None:
        self.beats.append(frame)


def test_a_heartbeat_is_one_write_its_ping_and_face_ping_together() -> None:
    hub = Hub()
    framing = BeatingFraming("websocket")
    conn = Connection(hub, framing, FACE, OutboundQueue(LIMITS), 0.0)
    conn.welcome(credential())
    assert conn.tick(15.0) == 30.0
    assert len(framing.beats) == 1 and framing.pings == 0 and framing.writes == 0
    assert msgspec.json.decode(framing.beats[0])["type"] == "face.ping"
    # The pong comes back a moment later: the transport ping would next be
    # due 15 s after it, the face.ping 15 s after the last one. They still
    # leave together, in one write, at one visit — not two, 2 ms apart.
    conn.heard(15.002)
    assert conn.tick(30.0) == 45.0
    assert len(framing.beats) == 2 and framing.pings == 0 and framing.writes == 0
    assert [msgspec.json.decode(b)["payload"]["event_seq"] for b in framing.beats] == [1, 2]


def test_a_heartbeat_behind_queued_frames_keeps_their_order() -> None:
    hub = Hub()
    framing = BeatingFraming("websocket")
    conn = Connection(hub, framing, FACE, OutboundQueue(LIMITS), 0.0)
    conn.welcome(credential())
    conn.pause(1.0)
    conn.send(event(1))  # held back: the face.ping must not overtake it
    conn.resume()
    conn.tick(15.0)
    assert framing.beats == [] and framing.pings == 1  # the ping alone, at once
    hub.turn()
    assert framing.types() == ["face.event", "face.ping"]


def test_only_pings_go_early_a_close_waits_for_its_time() -> None:
    conn, framing, _ = make("websocket")
    conn.welcome(credential())
    conn.heard(0.5)
    assert conn.tick(15.0) == 30.0  # face.ping due, the wire ping 0.5 s later: both now
    assert framing.pings == 1
    assert conn.tick(45.49) is not None  # silent since 0.5: dead at 45.5, not before
    assert not framing.closes
    assert conn.tick(45.5) is None
    assert framing.closes == [(CloseCode.GOING_AWAY, "no traffic: connection presumed dead")]
