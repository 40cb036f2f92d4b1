"""A follower node writes an owner's fanned-out batch to each of its Faces
at once (DESIGN §10, I7): one write per connection and batch, not one per
entry, in seq order with the connection's own ``event_seq``. No socket:
a real Connection over a recording framing, its loop turn run by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from halfpi.core.events import Ping, to_message
from halfpi.core.limits import QueueLimits
from halfpi.core.outbound import DELTA, Message, OutboundQueue
from halfpi.journal.base import JournalEntry
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.auth import Credential
from halfpi.mind.connection import Connection, Liveness
from halfpi.mind.replica import Replica
from halfpi.mind.subscriptions import Subscriptions


@dataclass
class Framing:
    kind: str = "websocket"
    budget: int = 256 * 1024
    writes: list[list[bytes]] = field(default_factory=list)

    def write(self, frames: list[bytes]) -> None:
        self.writes.append(list(frames))

    def ping(self) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        pass


@dataclass
class Hub:
    """The Mind's side of a connection, with a loop turn run by hand."""

    pending: list[Connection] = field(default_factory=list)

    def ready(self, conn: Connection) -> None:
        self.pending.append(conn)

    def turn(self) -> None:
        pending, self.pending = self.pending, []
        for conn in pending:
            conn.flush()

    def bind(self, conn: Connection, credential: Credential) -> bool:
        return True

    def release(self, conn: Connection) -> None:
        pass

    def subscriptions(self, conn: Connection) -> Subscriptions:
        return Subscriptions(conn, MemoryJournal(), _no_spawn, 50)

    def wall(self) -> float:
        return 1_700_000_000.0

    def heartbeat(self, now: float) -> Message:
        return to_message(Ping(ts=self.wall()))


def _no_spawn(coro: Any, name: str) -> None:
    coro.close()


@dataclass
class Listener:
    session: Connection
    live: bool = True
    detail_mode: str = "transparent"
    owner: Any = None

    def wants(self, message: Message) -> bool:
        return True


class Journal:
    def followed(self, conversation_id: str, seq: int) -> None:
        pass


def delta(seq: int) -> JournalEntry:
    body = msgspec.json.encode({"conversation_id": "c_1", "seq": seq, "cursor": f"ep.{seq}",
                                "request_id": "r_1", "text": f"w{seq} "})
    return JournalEntry(seq, DELTA, "face.chat.delta", body, float(seq), request_id="r_1")


def follower() -> tuple[Replica, Framing, Hub]:
    hub, framing = Hub(), Framing()
    conn = Connection(hub, framing, Liveness(), OutboundQueue(QueueLimits()), 0.0)  # type: ignore[arg-type]
    replica = Replica("c_1", "ep", 0, Journal(), None, None, _no_spawn, None)  # type: ignore[arg-type]
    replica.add_listener("k", Listener(conn))
    return replica, framing, hub


def test_a_fanned_out_batch_is_one_write_per_connection_in_seq_order() -> None:
    replica, framing, hub = follower()
    replica.receive([delta(seq) for seq in range(1, 6)])
    assert framing.writes == []  # queued for the end of the loop turn
    hub.turn()
    assert len(framing.writes) == 1
    frames = [msgspec.json.decode(f)["payload"] for f in framing.writes[0]]
    assert [(p["seq"], p["event_seq"], p["text"]) for p in frames] == [
        (seq, seq, f"w{seq} ") for seq in range(1, 6)
    ]


def test_a_single_entry_is_written_at_once() -> None:
    replica, framing, hub = follower()
    replica.receive([delta(1)])
    assert len(framing.writes) == 1  # the idle connection's fast path, no loop turn
    replica.receive([delta(2)])
    assert [len(w) for w in framing.writes] == [1, 1]
    hub.turn()
    assert len(framing.writes) == 2
