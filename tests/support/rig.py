"""A whole Mind on a fake clock, with no sockets: sessions over recording wires.

The real Mind (store, actors, approvals, the Hand registry, the scripted
agent) runs in the test's loop on a :class:`FakeClock`; Faces and Hands are
real :class:`FaceSession` / :class:`HandSession` objects whose transport
records what they are sent. The test feeds frames in, reads frames out and
moves the clock (STYLE: "sessions testable without sockets").

Only the store answers in real time (its writer thread): a test waits for
the frames it expects with :meth:`Rig.expect`, a polled condition with a
deadline, never a sleep.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from halfpi.agents.base import Agent
from halfpi.agents.scripted import ScriptedAgent
from halfpi.config import Config
from halfpi.gateway.hand_session import HandSession
from halfpi.gateway.session import FaceSession
from halfpi.journal.base import Journal
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.auth import make_credential
from halfpi.mind.service import Mind
from halfpi.store.sqlite import SQLiteStore
from tests.support.clock import FakeClock
from tests.support.hand import allow_check, hello_payload
from tests.support.wait import until

Frame = dict[str, Any]


@dataclass
class Wire:
    """A session's transport: frames out are recorded, pings counted, the close noted."""

    frames: list[Frame] = field(default_factory=list)
    closed_with: int | None = None
    address: str = "192.0.2.1"
    pings: int = 0

    def ping(self) -> None:
        self.pings += 1

    def write_frames(self, frames: list[bytes]) -> None:
        self.frames.extend(json.loads(f) for f in frames)

    def close(self, code: int, reason: str) -> None:
        self.closed_with = code

    def of_type(self, type_: str) -> list[Frame]:
        return [f for f in self.frames if f["type"] == type_]


@dataclass
class Peer:
    """One session and its wire."""

    session: FaceSession | HandSession
    wire: Wire
    taken: set[int] = field(default_factory=set)  # frames :meth:`Rig.take` returned

    def send(self, type_: str, payload: dict[str, Any]) -> None:
        self.session.on_frame(json.dumps({"type": type_, "payload": payload}).encode())

    def seen(self, match: Callable[[Frame], bool]) -> list[Frame]:
        return [f for f in self.wire.frames if match(f)]


_ids = itertools.count(1)


@dataclass
class Rig:
    mind: Mind
    clock: FakeClock
    face_token: str
    hand_tokens: dict[str, str] = field(default_factory=dict)

    def advance(self, seconds: float) -> int:
        """The Mind's time passes: its due timers run. Returns how many."""
        return self.clock.advance(seconds)

    async def expect(
        self, peer: Peer, match: Callable[[Frame], bool], timeout: float = 10.0
    ) -> Frame:
        """The first frame ``peer`` received that matches, once it is there."""
        await until(lambda: bool(peer.seen(match)), timeout)
        return peer.seen(match)[0]

    async def take(
        self, peer: Peer, match: Callable[[Frame], bool], timeout: float = 10.0
    ) -> Frame:
        """The first matching frame ``peer`` received that was not taken yet."""

        def untaken() -> int | None:
            return next(
                (i for i, f in enumerate(peer.wire.frames) if i not in peer.taken and match(f)),
                None,
            )

        await until(lambda: untaken() is not None, timeout)
        index = untaken()
        assert index is not None
        peer.taken.add(index)
        return peer.wire.frames[index]

    async def face(self) -> Peer:
        """A Face session, welcomed."""
        peer = Peer(FaceSession(self.mind, wire := Wire()), wire)
        hello = {"token": self.face_token, "client": {"name": "t", "version": "1"}, "protocol": 3}
        peer.send("face.hello", hello)
        await self.expect(peer, lambda f: f["type"] == "face.welcome")
        return peer

    async def command(self, face: Peer, type_: str, **payload: Any) -> str:
        """Send a command; its request_id."""
        request_id = payload.pop("request_id", None) or f"q{next(_ids)}"
        face.send(type_, {"request_id": request_id, **payload})
        return request_id

    async def reply(self, face: Peer, request_id: str, types: tuple[str, ...] = (
        "face.result", "face.error", "face.snapshot")) -> Frame:
        return await self.expect(
            face,
            lambda f: f["type"] in types and f["payload"].get("request_id") == request_id,
        )

    async def conversation(self, face: Peer) -> str:
        """A new conversation, which ``face`` follows."""
        created = await self.reply(face, await self.command(face, "face.conversation.create"))
        cid = str(created["payload"]["data"]["conversation_id"])
        subscribed = await self.command(face, "face.subscribe", conversation_ids=[cid])
        await self.reply(face, subscribed, ("face.accepted",))
        return cid

    async def hand(self, hand_id: str = "dev", instance: str = "1", **hello: Any) -> Peer:
        """A Hand session, welcomed: the process ``instance`` of Hand ``hand_id``
        (its credential is made on first use). Its tools need no approval of
        its own (``hello_payload``)."""
        token = self.hand_tokens.get(hand_id)
        if token is None:
            now = self.mind.wall()
            credential, token = make_credential("hand", hand_id, "hand", frozenset(), now)
            await self.mind.store.add_credential(credential)
            await self.mind.refresh_credentials()
            self.hand_tokens[hand_id] = token
        peer = Peer(HandSession(self.mind, wire := Wire()), wire)
        peer.send("hand.hello", hello_payload(token, hand_id, f"{hand_id}-{instance}", **hello))
        await self.expect(peer, lambda f: f["type"] == "hand.welcome")
        return peer

    async def dispatched(self, hand: Peer) -> tuple[str, int]:
        """Play the Hand: allow the next policy check, take the order; its
        ``(run_id, generation)``."""
        check = await self.take(hand, lambda f: f["type"] == "hand.check")
        hand.send("hand.checked", allow_check(check["payload"]))
        order = await self.take(hand, lambda f: f["type"] == "hand.run")
        return order["payload"]["run_id"], order["payload"]["generation"]


@contextlib.asynccontextmanager
async def fake_time_mind(
    home: Path, agent: Agent | None = None, *, journal: Journal | None = None, **overrides: Any
) -> AsyncIterator[Rig]:
    """A started Mind on a :class:`FakeClock`, no local Hand, no server
    (a journal of the test's, if given: one that outlived a Mind).

    Its sessions' liveness is a day: a test that moves the clock by minutes
    in one step (one maintenance round) is not about Faces that go silent —
    ``tests/mind/test_maintenance.py`` is."""
    clock = FakeClock()
    quiet = {"heartbeat_s": 86_400.0, "dead_after_s": 3 * 86_400.0}
    config = replace(Config(home=home, port=0, local_hand=False), **{**quiet, **overrides})
    home.mkdir(parents=True, exist_ok=True)
    mind = Mind(
        config,
        SQLiteStore(config.db_path),
        journal or MemoryJournal(config.journal),
        agent or ScriptedAgent(0.0),
        clock=clock.wall,
        monotonic=clock,
    )
    clock.drives(mind.scheduler)
    await mind.start()
    try:
        yield Rig(mind, clock, config.face_token_path.read_text().strip())
    finally:
        await mind.drain()
