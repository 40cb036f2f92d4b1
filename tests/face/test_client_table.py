"""FaceClient against a scripted Mind: backoff, URLs, the outstanding table (I6),
auth refusals, connection generations, event_seq gaps, resume and reset.

No sockets: the client's ``connector`` seam hands it :class:`FakeLink` objects
whose frames the test reads and writes. Time is injected too: ``sleep`` only
records the delay (or waits until the test releases it) and ``rng`` is seeded,
so every delay is known in advance. Nothing here waits on the clock: each
wait is for a condition the test can name, bounded by ``TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from halfpi.config import PROTOCOL_VERSION
from halfpi.core.backoff import backoff
from halfpi.core.events import Accepted, ApprovalPending, Snapshot
from halfpi.face.client import ConnectionLost, FaceClient, Result, Status
from halfpi.face.errors import AuthError, CommandError, OutcomeUnknown, RequestConflict
from halfpi.face.view import TERMINAL_EVENTS, ConversationView

Payload = dict[str, Any]

TIMEOUT = 2.0
SEED = 20240607
URL = "ws://mind.test/v1/face"
EPOCH = "e1"
LIMITS = {"max_frame_bytes": 1 << 20, "max_chat_bytes": 1 << 16,
          "reliable_queue_messages": 1000, "reliable_queue_bytes": 1 << 24,
          "transient_queue_messages": 100, "transient_queue_bytes": 1 << 20}
REPLAY_SAFE = [
    "face.chat",
    "face.chat.cancel",
    "face.conversation.create",
    "face.approval.resolve",
    "face.run.cancel",
    "face.task.cancel",
    "face.conversation.list",
    "face.conversation.snapshot",
    "face.conversation.messages",
    "face.subscribe",
    "face.unsubscribe",
]


# -- a scripted Mind -----------------------------------------------------------


class Changes:
    """Wakes waiters whenever something observable happens; no polling."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def bump(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def until(self, predicate: Callable[[], bool], what: str = "") -> None:
        async def wait() -> None:
            while not predicate():
                await self._event.wait()

        try:
            await asyncio.wait_for(wait(), TIMEOUT)
        except TimeoutError:
            pytest.fail(f"timed out waiting for {what or predicate}")


class Conv:
    """One conversation's log as the Mind holds it."""

    def __init__(self, cid: str, epoch: str = EPOCH) -> None:
        self.cid = cid
        self.epoch = epoch
        self.seq = 0
        self.events: list[Payload] = []

    def cursor(self, seq: int | None = None) -> str:
        return f"{self.epoch}.{self.seq if seq is None else seq}"

    def add(self, kind: str, **data: Any) -> Payload:
        self.seq += 1
        payload = {
            "conversation_id": self.cid,
            "seq": self.seq,
            "cursor": self.cursor(),
            "type": kind,
            "data": data,
            "ts": 1.0,
        }
        self.events.append(payload)
        return payload

    def say(self, request_id: str, content: str) -> Payload:
        return self.add("chat.message", request_id=request_id, role="user", content=content)

    def after(self, seq: int) -> list[Payload]:
        return [e for e in self.events if e["seq"] > seq]

    def snapshot(self) -> Payload:
        messages: list[Payload] = []
        pending: dict[str, Payload] = {}
        for e in self.events:
            kind, data = e["type"], e["data"]
            if kind == "chat.message":
                messages.append(_message(e["seq"], "user", data["content"], data["request_id"]))
            elif kind == "chat.started":
                pending[data["request_id"]] = {
                    "request_id": data["request_id"],
                    "run_id": data.get("run_id"),
                    "status": "running",
                    "text_so_far": "",
                    "started_at": 1.0,
                }
            elif kind in TERMINAL_EVENTS:
                pending.pop(data["request_id"], None)
                messages.append(
                    _message(
                        e["seq"], "assistant", data["content"], data["request_id"], data["status"]
                    )
                )
        return {
            "conversation": {"id": self.cid, "name": self.cid, "created_at": 1.0},
            "cursor": self.cursor(),
            "epoch": self.epoch,
            "messages": messages,
            "has_more_older": False,
            "pending_chats": list(pending.values()),
            "pending_approvals": [],
            "active_runs": [],
            "tasks": [],
            "tool_history": [],
            "detail_mode": "transparent",
        }


def _message(
    seq: int, role: str, content: str, request_id: str, status: str | None = None
) -> Payload:
    return {
        "seq": seq,
        "role": role,
        "content": content,
        "request_id": request_id,
        "status": status,
        "ts": 1.0,
    }


class FakeLink:
    """One connection as the client sees it through the ``connector`` seam."""

    def __init__(self, mind: FakeMind, url: str, action: Any, hold: set[str]) -> None:
        self.mind = mind
        self.url = url
        self.action = action
        self.sent: list[Payload] = []
        self.event_seq = 0
        self.closed = False
        self.subscribed: set[str] = set()
        self.hold = hold  # frame types whose send waits until ``released``
        self.holding = asyncio.Event()
        self.released = asyncio.Event()
        self._inbox: asyncio.Queue[str | ConnectionLost] = asyncio.Queue()

    # the Transport protocol
    async def send(self, text: str) -> None:
        if self.closed:
            raise ConnectionLost(1006, "closed")
        frame = json.loads(text)
        assert set(frame) == {"type", "payload"}, frame
        if frame["type"] in self.hold:
            self.holding.set()
            self.mind.changes.bump()
            await self.released.wait()
        self.sent.append(frame)
        self.mind.changes.bump()
        self.mind.received(self, frame)

    async def recv(self) -> str:
        item = await self._inbox.get()
        if isinstance(item, ConnectionLost):
            self._inbox.put_nowait(item)  # a dead link stays dead
            raise item
        return item

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._inbox.put_nowait(ConnectionLost(1000, "closed by the client"))

    # the test's side
    def push(
        self, type_: str, payload: Payload | None = None, *, event_seq: int | None = None
    ) -> int:
        self.event_seq = self.event_seq + 1 if event_seq is None else event_seq
        body = dict(payload or {})
        body["event_seq"] = self.event_seq
        self._inbox.put_nowait(json.dumps({"type": type_, "payload": body}))
        return self.event_seq

    def cut(self, code: int | None = 1006, reason: str = "cut") -> None:
        self._inbox.put_nowait(ConnectionLost(code, reason))

    def frames(self, type_: str) -> list[Payload]:
        return [f["payload"] for f in self.sent if f["type"] == type_]

    def types(self) -> list[str]:
        return [f["type"] for f in self.sent]


class FakeMind:
    """Answers hello, optionally answers subscribe from its logs; the rest is scripted."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self.replay_safe = list(REPLAY_SAFE)
        # one action per connect attempt, then "accept" forever:
        # "accept" | "refuse" (connector fails) | "silent" (hello unanswered)
        # | ("close", code) (hello answered by a close)
        # | ("error", code, error_code) (hello answered by face.error, then a close)
        self.plan: list[Any] = []
        self.down: set[str] = set()  # URLs whose connector fails
        self.attempts: list[str] = []
        self.links: list[FakeLink] = []
        self.convs: dict[str, Conv] = {}
        self.auto_subscribe = True
        self.next_link_holds: set[str] = set()
        # What the welcome grants, and the lists the Mind answers (docs/protocol.md §16).
        self.scopes: list[str] = []
        self.features = ["resume", "snapshot", "coalesced_deltas"]
        self.answer_lists = True
        self.listed: dict[str, Payload] = {}
        self.pending_approvals: dict[str, Payload] = {}

    @property
    def link(self) -> FakeLink:
        return self.links[-1]

    async def connect(self, url: str) -> FakeLink:
        # An attempt is a scheduling point, as on a real network: a client that
        # retried without end could otherwise starve every other task.
        await asyncio.sleep(0)
        self.attempts.append(url)
        self.changes.bump()
        action = self.plan.pop(0) if self.plan else "accept"
        if url in self.down or action == "refuse":
            raise ConnectionLost(None, f"{url}: connection refused")
        link = FakeLink(self, url, action, self.next_link_holds)
        self.next_link_holds = set()
        self.links.append(link)
        return link

    def received(self, link: FakeLink, frame: Payload) -> None:
        type_, payload = frame["type"], frame["payload"]
        if type_ == "face.hello":
            if link.action == "accept":
                link.push(
                    "face.welcome",
                    {
                        "principal_id": "p_1",
                        "label": "test",
                        "profile": "operator",
                        "scopes": list(self.scopes),
                        "protocol": PROTOCOL_VERSION,
                        "node_id": "n_1",
                        "heartbeat_s": 3600.0,
                        "limits": LIMITS,
                        "replay_safe": list(self.replay_safe),
                        "features": list(self.features),
                    },
                    event_seq=1,
                )
            elif isinstance(link.action, tuple):
                if link.action[0] == "error":
                    link.push("face.error", {"code": link.action[2], "message": "refused",
                                             "retryable": link.action[2] == "rate_limited"})
                link.cut(link.action[1], "refused")
        elif type_ == "face.conversation.snapshot":
            conv = self.convs.get(payload["conversation_id"])
            if conv is None:
                link.push("face.error", {"request_id": payload["request_id"],
                                         "code": "conversation_not_found", "message": "",
                                         "retryable": False})
            else:
                link.push("face.snapshot", {"request_id": payload["request_id"],
                                            **conv.snapshot()})
        elif type_ == "face.conversation.list" and self.answer_lists:
            self.answer_list(link, payload["request_id"])
        elif type_ == "face.approval.list" and self.answer_lists:
            approvals = list(self.pending_approvals.values())
            link.push("face.result", {"request_id": payload["request_id"], "status": "succeeded",
                                      "data": {"approvals": approvals}})
        elif (
            type_ == "face.subscribe"
            and self.auto_subscribe
            and all(cid in self.convs for cid in payload["conversation_ids"])
        ):
            self.answer_subscribe(link, payload)

    def answer_list(self, link: FakeLink, request_id: str) -> None:
        rows = sorted(self.listed.values(), key=lambda c: c["id"], reverse=True)
        link.push("face.result", {"request_id": request_id, "status": "succeeded",
                                  "data": {"conversations": rows, "has_more": False}})

    def answer_subscribe(self, link: FakeLink, p: Payload) -> None:
        """DESIGN §4.2: exact replay when the cursor is in the window, else reset."""
        rid, modes, heads, then = p["request_id"], {}, {}, []
        for cid in p["conversation_ids"]:
            conv = self.convs[cid]
            heads[cid] = conv.cursor()
            since = (p.get("since") or {}).get(cid)
            if since is None:
                modes[cid] = "live"
                if p.get("snapshot"):
                    then.append(("face.snapshot", {"request_id": rid, **conv.snapshot()}))
                continue
            epoch, _, seq = since.rpartition(".")
            if epoch == conv.epoch and int(seq) <= conv.seq:
                modes[cid] = "exact"
                then.extend(("face.event", e) for e in conv.after(int(seq)))
            else:
                modes[cid] = "reset"
                reset = {"conversation_id": cid, "reason": "epoch_changed"}
                then.append(("face.reset", {**reset, "snapshot": conv.snapshot()}))
        exact = bool(p.get("since")) and all(m == "exact" for m in modes.values())
        link.push(
            "face.accepted",
            {
                "request_id": rid,
                "operation": "subscribe",
                "replay": "exact" if exact else "live",
                "conversations": modes,
                "heads": heads,
            },
        )
        for type_, payload in then:
            link.push(type_, payload)
        link.subscribed.update(p["conversation_ids"])

    def publish(self, cid: str, kind: str, **data: Any) -> Payload:
        """Log an event; only a live link subscribed to it sees it."""
        event = self.convs[cid].add(kind, **data)
        if self.links and not self.links[-1].closed and cid in self.links[-1].subscribed:
            self.links[-1].push("face.event", event)
        return event


class FakeSleep:
    """Records every backoff delay; returns at once unless held."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self.delays: list[float] = []
        self._open = asyncio.Event()
        self._open.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.changes.bump()
        await self._open.wait()


@dataclass
class Rig:
    changes: Changes
    mind: FakeMind
    sleep: FakeSleep
    statuses: list[Status] = field(default_factory=list)
    messages: list[tuple[str, Payload]] = field(default_factory=list)
    clients: list[FaceClient] = field(default_factory=list)
    updates: list[tuple[str, str]] = field(default_factory=list)

    def client(self, urls: str | list[str] = URL, **kw: Any) -> FaceClient:
        def on_status(status: Status) -> None:
            self.statuses.append(status)
            self.changes.bump()

        def on_message(type_: str, payload: Payload) -> None:
            self.messages.append((type_, payload))
            self.changes.bump()

        kw.setdefault("rng", random.Random(SEED))
        client = FaceClient(
            urls,
            "hpf_secret",
            connector=self.mind.connect,
            sleep=self.sleep,
            on_status=on_status,
            on_message=on_message,
            on_update=lambda kind, cid: (self.updates.append((kind, cid)), self.changes.bump()),
            **kw,
        )
        self.clients.append(client)
        return client

    async def live(self, **kw: Any) -> tuple[FaceClient, FakeLink]:
        client = self.client(**kw)
        await client.connect(timeout=TIMEOUT)
        return client, self.mind.link

    async def follow(self, client: FaceClient, conv: Conv) -> ConversationView:
        self.mind.convs[conv.cid] = conv
        view = await client.subscribe(conv.cid)
        await client.wait_view(conv.cid, lambda v: v.ready, timeout=TIMEOUT)
        return view

    async def relink(self, link: FakeLink, code: int | None = 1012) -> FakeLink:
        """Cut ``link``; return the next link once the client is on it and settled."""
        count = len(self.mind.links)
        link.cut(code, "going away")
        await self.changes.until(
            lambda: (
                len(self.mind.links) > count
                and self.statuses[-1].state not in ("connecting", "reconnecting")
            ),
            "a new live connection",
        )
        return self.mind.link

    def received(self, type_: str, request_id: str | None = None) -> list[Payload]:
        return [
            p
            for t, p in self.messages
            if t == type_ and (request_id is None or p.get("request_id") == request_id)
        ]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    changes = Changes()
    r = Rig(changes, FakeMind(changes), FakeSleep(changes))
    try:
        yield r
    finally:
        r.sleep.release()
        for client in r.clients:
            await client.close()


def conv_with(cid: str, *contents: str) -> Conv:
    conv = Conv(cid)
    for i, content in enumerate(contents, 1):
        conv.say(f"{cid}-q{i}", content)
    return conv


def message_seqs(view: ConversationView) -> list[int]:
    return [m.seq for m in view.messages]


# -- the handshake -------------------------------------------------------------


async def test_hello_is_the_first_frame_on_every_connection(rig: Rig) -> None:
    client, link1 = await rig.live(client_name="table-face")
    link2 = await rig.relink(link1)
    for link in (link1, link2):
        first = link.sent[0]
        assert first["type"] == "face.hello"
        assert first["payload"]["token"] == "hpf_secret"
        assert first["payload"]["protocol"] == PROTOCOL_VERSION
        assert first["payload"]["client"]["name"] == "table-face"
    assert client.welcome.replay_safe == REPLAY_SAFE
    assert client.status == Status("live", url=URL)


# -- (a) backoff ---------------------------------------------------------------


def expected_delays(rng: random.Random, n: int) -> list[float]:
    return list(itertools.islice(backoff(rng=rng), n))


async def test_backoff_delays_follow_the_backoff_generator(rig: Rig) -> None:
    rig.mind.plan = ["refuse"] * 10
    client = rig.client()
    await client.connect(timeout=TIMEOUT)
    assert rig.sleep.delays == expected_delays(random.Random(SEED), 10)
    ceilings = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    for delay, ceiling in zip(rig.sleep.delays, ceilings, strict=True):
        assert 0.0 <= delay <= ceiling
    # Full jitter: the delays are drawn, not the ceilings themselves.
    assert rig.sleep.delays != ceilings
    reconnecting = [s for s in rig.statuses if s.state == "reconnecting"]
    assert [s.attempt for s in reconnecting] == list(range(1, 11))
    assert [s.next_in for s in reconnecting] == rig.sleep.delays
    assert len(rig.mind.attempts) == 11
    assert client.status == Status("live", url=URL)


async def test_backoff_ceilings_double_from_a_quarter_second_up_to_thirty(rig: Rig) -> None:
    rig.mind.plan = ["refuse"] * 10
    client = rig.client(delays=lambda: backoff(jitter=False))
    await client.connect(timeout=TIMEOUT)
    assert rig.sleep.delays == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


async def test_failed_hello_counts_as_a_failed_attempt(rig: Rig) -> None:
    rig.mind.plan = ["refuse", ("close", 1012), ("close", 4009)]
    client = rig.client(delays=lambda: backoff(jitter=False))
    await client.connect(timeout=TIMEOUT)
    assert rig.sleep.delays == [0.25, 0.5, 1.0]
    assert len(rig.mind.links) == 3  # two refused hellos, then the live one
    assert all(link.closed for link in rig.mind.links[:2])


async def test_backoff_resets_after_a_successful_hello(rig: Rig) -> None:
    rig.mind.plan = ["refuse"] * 3
    client, link1 = await rig.live()
    rig.mind.plan = ["refuse"] * 2
    await rig.relink(link1)
    rng = random.Random(SEED)
    first = expected_delays(rng, 3)
    second = expected_delays(rng, 3)  # same rng, a fresh generator: ceilings restart
    assert rig.sleep.delays == first + second
    assert second[0] <= 0.25 and second[1] <= 0.5 and second[2] <= 1.0
    reconnecting = [s.attempt for s in rig.statuses if s.state == "reconnecting"]
    assert reconnecting == [1, 2, 3, 1, 2, 3]
    assert client.status == Status("live", url=URL)


# -- (b) several URLs ---------------------------------------------------------------


async def test_urls_are_tried_in_turn_on_failure(rig: Rig) -> None:
    urls = ["ws://a/v1/face", "ws://b/v1/face", "ws://c/v1/face"]
    rig.mind.down = {urls[0], urls[1]}
    _client, link = await rig.live(urls=urls)
    assert rig.mind.attempts == urls
    assert link.url == urls[2]
    assert len(rig.sleep.delays) == 2

    # c goes away: the next one in turn is a (still down), then b (back up).
    rig.mind.down = {urls[0]}
    link2 = await rig.relink(link)
    assert rig.mind.attempts == [*urls, urls[0], urls[1]]
    assert link2.url == urls[1]


async def test_first_url_is_used_while_it_answers(rig: Rig) -> None:
    urls = ["ws://a/v1/face", "ws://b/v1/face"]
    _client, link = await rig.live(urls=urls)
    assert rig.mind.attempts == [urls[0]]
    assert link.url == urls[0]
    assert rig.sleep.delays == []


async def test_a_single_url_is_retried(rig: Rig) -> None:
    rig.mind.plan = ["refuse"] * 3
    await rig.live()
    assert rig.mind.attempts == [URL] * 4


# -- (c) the outstanding table (I6) ---------------------------------------------

COMMANDS = [
    ("face.chat", {"conversation_id": "c_1", "content": "hello"}),
    ("face.chat.cancel", {"conversation_id": "c_1", "target_request_id": "q-0"}),
    ("face.conversation.create", {"name": "plans"}),
    ("face.approval.resolve", {"approval_id": "a_1", "decision": "allow_once"}),
]


@pytest.mark.parametrize(("type_", "fields"), COMMANDS, ids=[c[0] for c in COMMANDS])
async def test_I6_replay_safe_command_is_resent_with_the_same_request_id(
    rig: Rig, type_: str, fields: Payload
) -> None:
    client, link1 = await rig.live()
    task = asyncio.create_task(client.request(type_, request_id="r-1", **fields))
    await rig.changes.until(lambda: bool(link1.frames(type_)), "the command on the wire")
    link2 = await rig.relink(link1)

    assert link2.frames(type_) == link1.frames(type_)  # same payload, same request_id
    assert link2.frames(type_)[0]["request_id"] == "r-1"
    assert link2.types().count(type_) == 1
    assert not task.done()

    link2.push("face.accepted", {"request_id": "r-1", "operation": type_})
    link2.push("face.result", {"request_id": "r-1", "status": "succeeded"})
    result = await asyncio.wait_for(task, TIMEOUT)
    assert result == Result("r-1", "succeeded")


@pytest.mark.parametrize(
    ("first_welcome", "second_welcome"),
    [([], []), (REPLAY_SAFE, ["face.conversation.create"])],
    ids=["never-safe", "safe-no-longer"],
)
async def test_I6_unsafe_command_on_the_wire_is_not_resent_and_its_outcome_is_unknown(
    rig: Rig, first_welcome: list[str], second_welcome: list[str]
) -> None:
    # Only the Mind on the new connection can say what it may replay.
    rig.mind.replay_safe = list(first_welcome)
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    assert [f["request_id"] for f in link1.frames("face.chat")] == ["q-1"]

    rig.mind.replay_safe = list(second_welcome)
    link2 = await rig.relink(link1)
    with pytest.raises(OutcomeUnknown) as info:
        await asyncio.wait_for(handle.result(), TIMEOUT)
    assert (info.value.request_id, info.value.type) == ("q-1", "face.chat")
    with pytest.raises(OutcomeUnknown):
        await asyncio.wait_for(handle.accepted(), TIMEOUT)
    assert link2.frames("face.chat") == []


async def test_I6_unsafe_command_accepted_before_the_cut_keeps_its_acceptance(rig: Rig) -> None:
    rig.mind.replay_safe = []
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    link1.push("face.accepted", {"request_id": "q-1", "operation": "chat", "run_id": "r_1"})
    accepted = await asyncio.wait_for(handle.accepted(), TIMEOUT)
    assert accepted is not None and accepted.run_id == "r_1"

    link2 = await rig.relink(link1)
    with pytest.raises(OutcomeUnknown):
        await asyncio.wait_for(handle.result(), TIMEOUT)
    assert link2.frames("face.chat") == []


async def test_I6_command_submitted_while_disconnected_is_sent_once_connected(rig: Rig) -> None:
    rig.mind.replay_safe = []  # nothing is replay-safe: it still goes, it never went
    client, link1 = await rig.live()
    rig.sleep.hold()
    link1.cut(1012)
    await rig.changes.until(lambda: len(rig.sleep.delays) == 1, "the client backing off")
    assert client.status.state == "reconnecting"

    handle = await client.chat("c_1", "typed while offline", request_id="q-off")
    assert link1.frames("face.chat") == []
    assert len(rig.mind.links) == 1

    rig.sleep.release()
    await rig.changes.until(lambda: len(rig.mind.links) == 2, "a new connection")
    link2 = rig.mind.link
    await rig.changes.until(lambda: bool(link2.frames("face.chat")), "the chat on the wire")
    assert link2.frames("face.chat") == [
        {"conversation_id": "c_1", "content": "typed while offline", "request_id": "q-off"}
    ]

    link2.push("face.accepted", {"request_id": "q-off", "operation": "chat"})
    link2.push("face.result", {"request_id": "q-off", "status": "succeeded", "content": "ok"})
    result = await asyncio.wait_for(handle.result(), TIMEOUT)
    assert result.ok and result.content == "ok"
    assert link2.types().count("face.chat") == 1


async def test_I6_command_submitted_before_the_first_connection_is_sent_once(rig: Rig) -> None:
    rig.mind.replay_safe = []
    rig.mind.plan = ["refuse", "refuse"]
    client = rig.client()
    handle = await client.chat("c_1", "early", request_id="q-early")
    await client.connect(timeout=TIMEOUT)
    link = rig.mind.link
    await rig.changes.until(lambda: bool(link.frames("face.chat")), "the chat on the wire")
    assert [f["request_id"] for f in link.frames("face.chat")] == ["q-early"]
    link.push("face.result", {"request_id": "q-early", "status": "succeeded"})
    assert (await asyncio.wait_for(handle.result(), TIMEOUT)).ok


async def test_I6_two_reconnects_resend_a_replay_safe_command_each_time(rig: Rig) -> None:
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    link2 = await rig.relink(link1)
    link3 = await rig.relink(link2)
    for link in (link1, link2, link3):
        assert [f["request_id"] for f in link.frames("face.chat")] == ["q-1"]
    link3.push("face.result", {"request_id": "q-1", "status": "succeeded", "content": "hi"})
    assert (await asyncio.wait_for(handle.result(), TIMEOUT)).content == "hi"


async def test_answered_command_is_not_resent(rig: Rig) -> None:
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    link1.push("face.result", {"request_id": "q-1", "status": "succeeded", "content": "hi"})
    assert (await asyncio.wait_for(handle.result(), TIMEOUT)).ok
    link2 = await rig.relink(link1)
    assert link2.frames("face.chat") == []


@pytest.mark.parametrize("safe", [False, True], ids=["unsafe-failed", "safe-sent-twice"])
async def test_I6_command_sent_while_resubscribing_belongs_to_the_new_connection(
    rig: Rig, safe: bool
) -> None:
    # The new transport is installed before the resubscribe frames are sent; a
    # command submitted while one of those sends is in progress goes out on
    # the new connection at once. Settling the outstanding table afterwards
    # must not treat it as a leftover of the old connection.
    rig.mind.replay_safe = ["face.chat"] if safe else []
    client, link1 = await rig.live()
    await rig.follow(client, conv_with("c_1", "hi"))

    rig.mind.next_link_holds = {"face.subscribe"}
    link1.cut(1012)
    await rig.changes.until(
        lambda: len(rig.mind.links) == 2 and rig.mind.link.holding.is_set(),
        "the resubscribe in flight",
    )
    link2 = rig.mind.link
    handle = await client.chat("c_1", "typed during the reconnect", request_id="q-mid")
    assert [f["request_id"] for f in link2.frames("face.chat")] == ["q-mid"]

    link2.released.set()
    await rig.changes.until(lambda: client.status.state == "resuming", "the resume")
    link2.push("face.accepted", {"request_id": "q-mid", "operation": "chat"})
    link2.push("face.result", {"request_id": "q-mid", "status": "succeeded", "content": "ok"})
    result = await asyncio.wait_for(handle.result(), TIMEOUT)
    assert result.ok
    assert link2.types().count("face.chat") == 1


# -- (d) refused: 4001 / 4003 ----------------------------------------------------


@pytest.mark.parametrize("code", [4001, 4003])
async def test_refused_hello_fails_connect_and_pending_commands_and_stops(
    rig: Rig, code: int
) -> None:
    rig.mind.plan = [("close", code)]
    client = rig.client()
    early = await client.chat("c_1", "hello", request_id="q-early")
    with pytest.raises(AuthError) as info:
        await client.connect(timeout=TIMEOUT)
    assert info.value.close_code == code
    with pytest.raises(AuthError):
        await asyncio.wait_for(early.result(), TIMEOUT)
    # The supervisor ended by itself: no retry was scheduled or made.
    assert rig.mind.attempts == [URL]
    assert rig.sleep.delays == []
    assert client.status.state == "refused"
    with pytest.raises(AuthError):
        await client.chat("c_1", "again")


async def test_hello_refused_with_an_explaining_error_still_stops(rig: Rig) -> None:
    rig.mind.plan = [("error", 4001, "unauthorized")]
    client = rig.client()
    with pytest.raises(AuthError) as info:
        await client.connect(timeout=TIMEOUT)
    assert info.value.close_code == 4001
    assert rig.mind.attempts == [URL]
    assert client.status.state == "refused"


async def test_hello_rate_limited_4029_is_retried_after_a_backoff(rig: Rig) -> None:
    rig.mind.plan = [("error", 4029, "rate_limited")]
    client = rig.client()
    await client.connect(timeout=TIMEOUT)
    assert rig.mind.attempts == [URL, URL]
    assert len(rig.sleep.delays) == 1
    assert client.status == Status("live", url=URL)


@pytest.mark.parametrize("code", [4001, 4003])
async def test_auth_close_on_a_live_connection_fails_pending_and_stops(rig: Rig, code: int) -> None:
    client, link = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    link.cut(code, "revoked")
    with pytest.raises(AuthError) as info:
        await asyncio.wait_for(handle.result(), TIMEOUT)
    assert info.value.close_code == code
    await rig.changes.until(lambda: client.status.state == "refused", "the refusal")
    assert rig.mind.attempts == [URL]
    assert rig.sleep.delays == []
    with pytest.raises(AuthError):
        await client.chat("c_1", "again")


@pytest.mark.parametrize("code", [1001, 1006, 1012, 4008, None])
async def test_other_closes_reconnect(rig: Rig, code: int | None) -> None:
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    link2 = await rig.relink(link1, code=code)
    assert len(rig.sleep.delays) == 1
    assert [f["request_id"] for f in link2.frames("face.chat")] == ["q-1"]
    assert client.status == Status("live", url=URL)
    link2.push("face.result", {"request_id": "q-1", "status": "succeeded"})
    assert (await asyncio.wait_for(handle.result(), TIMEOUT)).ok


async def test_unanswered_hello_counts_as_a_failed_attempt(rig: Rig) -> None:
    # The Mind accepts the socket but never says welcome; the client's own
    # hello deadline (dead_after_s) must end the attempt and move on.
    rig.mind.plan = ["silent"]
    client = rig.client(dead_after_s=0.05, delays=lambda: backoff(jitter=False))
    await client.connect(timeout=TIMEOUT)
    assert len(rig.mind.links) == 2
    assert rig.sleep.delays == [0.25]


# -- (e) connection generations ---------------------------------------------------


async def test_frames_of_an_older_connection_change_nothing(rig: Rig) -> None:
    client, link1 = await rig.live()
    conv = conv_with("c_1", "one", "two", "three")
    view = await rig.follow(client, conv)
    pending = await client.chat("c_1", "four", request_id="q-4")
    link2 = await rig.relink(link1)
    assert client.generation == 2
    resub = link2.frames("face.subscribe")[0]["request_id"]
    await rig.changes.until(lambda: bool(rig.received("face.accepted", resub)), "the resubscribe")

    before_view = copy.deepcopy(view)
    before_messages = list(rig.messages)
    before_status = client.status
    # What connection 1 would still have said, had its frames arrived late.
    stale = copy.deepcopy(conv)
    late: list[tuple[str, Payload]] = [
        ("face.event", stale.add("run.changed")),
        ("face.event", stale.say("zz", "stale")),
        ("face.chat.delta", {**stale.add("x"), "request_id": "q-4", "text": "stale"}),
        (
            "face.reset",
            {
                "conversation_id": "c_1",
                "reason": "epoch_changed",
                "snapshot": Conv("c_1", epoch="old").snapshot(),
            },
        ),
        ("face.accepted", {"request_id": "q-4", "operation": "chat"}),
        ("face.result", {"request_id": "q-4", "status": "failed", "error_code": "stale"}),
        ("face.error", {"request_id": "q-4", "code": "busy", "message": "stale"}),
    ]
    for event_seq, (type_, payload) in enumerate(late, 99):
        frame = {"type": type_, "payload": {**payload, "event_seq": event_seq}}
        client.protocol.receive(json.dumps(frame), client.clock(), generation=1)

    assert view == before_view
    assert rig.messages == before_messages
    assert client.status == before_status
    # The outstanding command was not settled by the old connection's frames...
    link2.push("face.result", {"request_id": "q-4", "status": "succeeded", "content": "4"})
    assert (await asyncio.wait_for(pending.result(), TIMEOUT)).content == "4"
    # ...and the new connection's event_seq count was not disturbed by them.
    subscribes = len(link2.frames("face.subscribe"))
    link2.push("face.event", conv.add("chat.message", request_id="q-5", content="five"))
    await client.wait_view("c_1", lambda v: v.seq == 4, timeout=TIMEOUT)
    assert len(link2.frames("face.subscribe")) == subscribes


async def test_sends_for_an_older_connection_are_dropped(rig: Rig) -> None:
    client, link1 = await rig.live()
    await rig.follow(client, conv_with("c_1", "a"))
    link2 = await rig.relink(link1)
    sent1, sent2 = len(link1.sent), len(link2.sent)
    # A jump on connection 1 would resubscribe — on connection 1, which is gone.
    late = {"type": "face.pong", "payload": {"event_seq": 999}}
    client.protocol.receive(json.dumps(late), client.clock(), generation=1)
    assert client.protocol.data_to_send() == []
    assert (len(link1.sent), len(link2.sent)) == (sent1, sent2)


# -- (f) event_seq gaps ------------------------------------------------------------


async def test_event_seq_jump_resubscribes_every_view_from_its_cursor(rig: Rig) -> None:
    client, link = await rig.live()
    view1 = await rig.follow(client, conv_with("c_1", "a", "b", "c", "d", "e"))
    view2 = await rig.follow(client, conv_with("c_2", "x", "y", "z"))
    assert (view1.cursor, view2.cursor) == (f"{EPOCH}.5", f"{EPOCH}.3")
    rig.mind.auto_subscribe = False
    before = len(link.frames("face.subscribe"))

    link.push("face.pong", {}, event_seq=link.event_seq + 2)  # one message missing
    await rig.changes.until(
        lambda: len(link.frames("face.subscribe")) == before + 2, "two resubscribes"
    )
    again = link.frames("face.subscribe")[before:]
    by_cid = {f["conversation_ids"][0]: f for f in again}
    assert by_cid["c_1"]["since"] == {"c_1": f"{EPOCH}.5"}
    assert by_cid["c_2"]["since"] == {"c_2": f"{EPOCH}.3"}
    assert all("snapshot" not in f for f in again)
    assert len({f["request_id"] for f in again}) == 2

    # The count restarts from the jump: the next messages in order are no gap.
    for frame in again:
        rig.mind.answer_subscribe(link, frame)
    link.push("face.event", rig.mind.convs["c_1"].add("run.changed"))
    await client.wait_view("c_1", lambda v: v.seq == 6, timeout=TIMEOUT)
    assert len(link.frames("face.subscribe")) == before + 2


async def test_contiguous_event_seq_never_resubscribes(rig: Rig) -> None:
    client, link = await rig.live()
    conv = conv_with("c_1", "a")
    await rig.follow(client, conv)
    before = len(link.frames("face.subscribe"))
    for i in range(5):
        link.push("face.event", conv.say(f"q{i}", f"m{i}"))
    await client.wait_view("c_1", lambda v: v.seq == 6, timeout=TIMEOUT)
    assert len(link.frames("face.subscribe")) == before


async def test_event_lost_inside_a_connection_is_recovered(rig: Rig) -> None:
    client, link = await rig.live()
    conv = conv_with("c_1", "one", "two")
    view = await rig.follow(client, conv)
    # The Mind writes seq 3 and 4; the message carrying seq 3 never arrives.
    lost = conv.say("q-3", "lost")
    link.event_seq += 1
    link.push("face.event", conv.say("q-4", "after the gap"))
    await rig.changes.until(
        lambda: len(link.frames("face.subscribe")) == 2, "the resubscribe after the gap"
    )
    # Whatever the client asked for (from a cursor or a fresh snapshot), the
    # Mind answers it truthfully; then a live event follows.
    live = rig.mind.publish("c_1", "run.changed")
    await client.wait_view("c_1", lambda v: v.seq >= live["seq"], timeout=TIMEOUT)
    assert lost["seq"] in message_seqs(view)
    assert message_seqs(view) == [1, 2, 3, 4]


async def test_event_lost_inside_a_connection_is_recovered_when_more_follow_it(
    rig: Rig,
) -> None:
    client, link = await rig.live()
    conv = conv_with("c_1", "one", "two")
    view = await rig.follow(client, conv)
    rig.mind.auto_subscribe = False
    conv.say("q-3", "lost")
    link.event_seq += 1
    link.push("face.event", conv.say("q-4", "after the gap"))
    # Queued on the old subscription before the Mind reads the resubscribe.
    link.push("face.event", conv.say("q-5", "still on the old subscription"))
    await rig.changes.until(
        lambda: len(link.frames("face.subscribe")) == 2, "the resubscribe after the gap"
    )
    rig.mind.answer_subscribe(link, link.frames("face.subscribe")[1])
    live = rig.mind.publish("c_1", "run.changed")
    await client.wait_view("c_1", lambda v: v.seq >= live["seq"], timeout=TIMEOUT)
    assert message_seqs(view) == [1, 2, 3, 4, 5]


# -- (g) reset and resume ----------------------------------------------------------


async def test_face_reset_rebuilds_the_view_from_its_snapshot(rig: Rig) -> None:
    client, link = await rig.live()
    view = await rig.follow(client, conv_with("c_1", "one", "two"))
    fresh = conv_with("c_1", "after", "the", "restart")
    fresh.epoch = "e2"
    link.push(
        "face.reset",
        {"conversation_id": "c_1", "reason": "epoch_changed", "snapshot": fresh.snapshot()},
    )
    await rig.changes.until(lambda: client.status.state == "resynced", "resynced")
    assert view.cursor == "e2.3"
    assert [m.content for m in view.messages] == ["after", "the", "restart"]
    assert client.status.describe() == "resynced from snapshot"
    assert rig.received("face.reset")


async def test_resubscribe_into_a_new_epoch_resyncs(rig: Rig) -> None:
    client, link1 = await rig.live()
    view = await rig.follow(client, conv_with("c_1", "one", "two"))
    # The Mind restarts: a new epoch whose log says something else.
    restarted = conv_with("c_1", "only")
    restarted.epoch = "e2"
    rig.mind.convs["c_1"] = restarted
    link2 = await rig.relink(link1)
    assert link2.frames("face.subscribe")[0]["since"] == {"c_1": f"{EPOCH}.2"}
    await rig.changes.until(lambda: client.status.state == "resynced", "resynced")
    assert view.cursor == "e2.1"
    assert [m.content for m in view.messages] == ["only"]


async def test_reset_on_reconnect_never_claims_resumed(rig: Rig) -> None:
    client, link1 = await rig.live()
    await rig.follow(client, conv_with("c_1", "one", "two"))
    restarted = conv_with("c_1", "only")
    restarted.epoch = "e2"
    rig.mind.convs["c_1"] = restarted
    await rig.relink(link1)
    await rig.changes.until(lambda: client.status.state == "resynced", "resynced")
    states = [st.state for st in rig.statuses]
    assert states[-2:] == ["resuming", "resynced"], states


async def test_resubscribe_after_a_reconnect_resumes_exactly(rig: Rig) -> None:
    client, link1 = await rig.live()
    conv = conv_with("c_1", "one", "two", "three")
    view = await rig.follow(client, conv)
    rig.sleep.hold()
    link1.cut(1012)
    await rig.changes.until(lambda: len(rig.sleep.delays) == 1, "the client backing off")
    for i in range(4, 7):  # said while this Face was away
        conv.say(f"q{i}", f"m{i}")
    rig.sleep.release()
    await client.wait_view("c_1", lambda v: v.seq == 6, timeout=TIMEOUT)
    link2 = rig.mind.link
    assert link2.frames("face.subscribe")[0]["since"] == {"c_1": f"{EPOCH}.3"}
    assert message_seqs(view) == [1, 2, 3, 4, 5, 6]
    truth = ConversationView("c_1")
    truth.apply_snapshot(msgspec.convert(conv.snapshot(), Snapshot))
    assert view.summary() == truth.summary()


async def test_status_is_resumed_with_the_replayed_count_after_a_reconnect(rig: Rig) -> None:
    client, link1 = await rig.live()
    conv = conv_with("c_1", "one", "two", "three")
    await rig.follow(client, conv)
    rig.sleep.hold()
    link1.cut(1012)
    await rig.changes.until(lambda: len(rig.sleep.delays) == 1, "the client backing off")
    for i in range(4, 7):
        conv.say(f"q{i}", f"m{i}")
    rig.sleep.release()
    await client.wait_view("c_1", lambda v: v.seq == 6, timeout=TIMEOUT)
    states = [s.state for s in rig.statuses]
    assert "resuming" in states
    assert client.status == Status("resumed", replayed=3, url=URL)
    assert client.status.describe() == "resumed: 3 events replayed"


async def test_status_is_resumed_with_nothing_replayed_when_nothing_was_missed(
    rig: Rig,
) -> None:
    client, link1 = await rig.live()
    await rig.follow(client, conv_with("c_1", "one"))
    await rig.relink(link1)
    await rig.changes.until(lambda: client.status.state == "resumed", "resumed")
    assert client.status == Status("resumed", replayed=0, url=URL)


async def test_status_is_live_not_resuming_when_nothing_was_followed(rig: Rig) -> None:
    client, link1 = await rig.live()
    await rig.relink(link1)
    assert client.status == Status("live", url=URL)


async def test_status_is_resumed_only_when_every_conversation_has_caught_up(rig: Rig) -> None:
    client, link1 = await rig.live()
    c1 = conv_with("c_1", "a")
    c2 = conv_with("c_2", "x")
    await rig.follow(client, c1)
    await rig.follow(client, c2)
    rig.sleep.hold()
    link1.cut(1012)
    await rig.changes.until(lambda: len(rig.sleep.delays) == 1, "the client backing off")
    c1.say("q-a2", "b")
    c1.say("q-a3", "c")
    c2.say("q-x2", "y")
    rig.mind.auto_subscribe = False
    rig.sleep.release()
    await rig.changes.until(
        lambda: len(rig.mind.links) == 2 and len(rig.mind.link.frames("face.subscribe")) == 2,
        "both resubscribes",
    )
    link2 = rig.mind.link
    subs = {f["conversation_ids"][0]: f for f in link2.frames("face.subscribe")}
    assert client.status.state == "resuming"
    # c_2 is answered and caught up while c_1 has not been answered at all.
    rig.mind.answer_subscribe(link2, subs["c_2"])
    await client.wait_view("c_2", lambda v: v.seq == 2, timeout=TIMEOUT)
    assert client.status.state == "resuming"
    rig.mind.answer_subscribe(link2, subs["c_1"])
    await client.wait_view("c_1", lambda v: v.seq == 3, timeout=TIMEOUT)
    assert client.status == Status("resumed", replayed=3, url=URL)


# -- (h) news reaches the caller once ------------------------------------------------


async def test_duplicate_accepted_for_a_resent_command_reaches_on_message_once(
    rig: Rig,
) -> None:
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    accepted = {"request_id": "q-1", "operation": "chat", "conversation_id": "c_1"}
    link1.push("face.accepted", accepted)
    await asyncio.wait_for(handle.accepted(), TIMEOUT)

    link2 = await rig.relink(link1)
    assert [f["request_id"] for f in link2.frames("face.chat")] == ["q-1"]
    link2.push("face.accepted", accepted)  # the Mind's answer to the replay
    link2.push("face.result", {"request_id": "q-1", "status": "succeeded", "content": "hi"})
    link2.push("face.result", {"request_id": "q-1", "status": "succeeded", "content": "hi"})
    assert (await asyncio.wait_for(handle.result(), TIMEOUT)).content == "hi"
    # A later frame in order proves the duplicates above were processed.
    link2.push("face.error", {"code": "internal_error", "message": "marker"})
    await rig.changes.until(lambda: bool(rig.received("face.error")), "the marker")

    assert len(rig.received("face.accepted", "q-1")) == 1
    assert len(rig.received("face.result", "q-1")) == 1


async def test_duplicate_events_reach_on_message_once(rig: Rig) -> None:
    client, link = await rig.live()
    conv = conv_with("c_1", "one")
    await rig.follow(client, conv)
    event = conv.say("q-2", "two")
    link.push("face.event", event)
    link.push("face.event", event)
    link.push("face.error", {"code": "internal_error", "message": "marker"})
    await rig.changes.until(lambda: bool(rig.received("face.error")), "the marker")
    assert [p["seq"] for p in rig.received("face.event")] == [2]


# -- a command's answers ---------------------------------------------------------------


async def test_command_error_fails_the_command_with_its_code(rig: Rig) -> None:
    client, link = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    link.push(
        "face.error",
        {"request_id": "q-1", "code": "busy", "message": "one at a time", "retryable": True},
    )
    with pytest.raises(CommandError) as info:
        await asyncio.wait_for(handle.result(), TIMEOUT)
    assert (info.value.code, info.value.retryable) == ("busy", True)
    link2 = await rig.relink(link)
    assert link2.frames("face.chat") == []  # refused means settled: never re-sent


async def test_request_conflict_is_its_own_error(rig: Rig) -> None:
    client, link = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-1")
    link.push(
        "face.error",
        {"request_id": "q-1", "code": "request_conflict", "message": "", "field": "request_id"},
    )
    with pytest.raises(RequestConflict) as info:
        await asyncio.wait_for(handle.result(), TIMEOUT)
    assert info.value.field == "request_id"


async def test_request_subscribe_without_a_view_does_not_break_the_client(rig: Rig) -> None:
    client, link = await rig.live()
    rig.mind.convs["c_9"] = conv_with("c_9", "one", "two")
    task = asyncio.create_task(
        client.request(
            "face.subscribe",
            request_id="s-9",
            conversation_ids=["c_9"],
            since={"c_9": f"{EPOCH}.1"},
        )
    )
    supervisor = client.supervisor
    assert supervisor is not None
    try:
        done, _ = await asyncio.wait(
            {task, supervisor}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        if not task.done():
            task.cancel()
    assert supervisor not in done, f"the supervisor ended: {supervisor.exception()!r}"
    assert task in done
    accepted = task.result()
    assert isinstance(accepted, Accepted) and accepted.conversations == {"c_9": "exact"}
    # Still connected and serving commands.
    handle = await client.chat("c_9", "still there?", request_id="q-1")
    link.push("face.result", {"request_id": "q-1", "status": "succeeded"})
    assert (await asyncio.wait_for(handle.result(), TIMEOUT)).ok
    assert len(rig.mind.links) == 1


async def test_I6_unsafe_chat_is_reconciled_from_the_conversation_not_resent(rig: Rig) -> None:
    """Sent, cut, not replay-safe: the client reads the conversation instead of
    re-sending, and a reply found there is the chat's result."""
    rig.mind.replay_safe = ["face.conversation.snapshot"]
    conv = rig.mind.convs["c_1"] = Conv("c_1")
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-9")
    conv.say("q-9", "hello")
    conv.add("chat.started", request_id="q-9", run_id="r_9")
    conv.add("chat.completed", request_id="q-9", run_id="r_9", status="succeeded",
             content="hi there")
    link2 = await rig.relink(link1)
    result = await asyncio.wait_for(handle.result(), TIMEOUT)
    assert (result.status, result.content, result.reconciled) == ("succeeded", "hi there", True)
    assert link2.frames("face.chat") == []
    assert [f["conversation_id"] for f in link2.frames("face.conversation.snapshot")] == ["c_1"]


async def test_I6_unsafe_chat_admitted_without_reply_is_unknown_with_what_is_known(
    rig: Rig,
) -> None:
    rig.mind.replay_safe = ["face.conversation.snapshot"]
    conv = rig.mind.convs["c_1"] = Conv("c_1")
    client, link1 = await rig.live()
    handle = await client.chat("c_1", "hello", request_id="q-8")
    conv.say("q-8", "hello")
    link2 = await rig.relink(link1)
    with pytest.raises(OutcomeUnknown) as info:
        await asyncio.wait_for(handle.result(), TIMEOUT)
    assert "admitted" in str(info.value)
    assert link2.frames("face.chat") == []


async def test_a_refused_resubscribe_is_tried_again_not_abandoned(rig: Rig) -> None:
    """A retryable refusal (busy, rate_limited…) of the client's own subscribe
    must not leave the view silently frozen: it subscribes again."""
    clock = FakeClock()
    client, link = await rig.live(clock=clock)
    await rig.follow(client, conv_with("c_1", "a"))
    rig.mind.auto_subscribe = False
    before = len(link.frames("face.subscribe"))
    link.push("face.pong", {}, event_seq=link.event_seq + 2)  # a loss: resubscribe
    await rig.changes.until(lambda: len(link.frames("face.subscribe")) == before + 1,
                            "the resubscribe")
    refused = link.frames("face.subscribe")[-1]
    link.push("face.error", {"request_id": refused["request_id"], "code": "rate_limited",
                             "message": "", "retryable": True})
    await rig.changes.until(lambda: bool(rig.received("face.error")), "the refusal")
    assert len(link.frames("face.subscribe")) == before + 1  # not at once: after a pause
    clock.now += 1.5  # the longest pause (0.5 s + up to 1 s of jitter)
    link.push("face.pong", {})  # the client looks at its timers whenever it wakes
    await rig.changes.until(lambda: len(link.frames("face.subscribe")) == before + 2,
                            "the subscribe tried again")
    again = link.frames("face.subscribe")[-1]
    assert again["request_id"] != refused["request_id"]
    assert again["since"] == refused["since"]


# -- honest connection state: where, why, when ------------------------------------------


async def test_status_says_where_why_and_when_the_next_attempt_starts(rig: Rig) -> None:
    clock = FakeClock()
    rig.sleep.hold()
    rig.mind.plan = ["refuse"]
    client = rig.client(clock=clock, delays=lambda: backoff(jitter=False))
    connecting = asyncio.ensure_future(client.connect(timeout=TIMEOUT))
    await rig.changes.until(lambda: client.status.state == "reconnecting", "reconnecting")
    status = client.status
    assert status.url == URL
    assert status.detail == f"{URL}: connection refused"  # the connector's own words
    assert (status.attempt, status.next_in, status.next_at) == (1, 0.25, 1000.25)
    assert status.describe(1000.0).startswith("reconnecting (attempt 1, next in 0.2 s)")
    assert f"to {URL} failed: " in status.describe(1000.0)
    # The countdown moves with the clock; it never goes below zero.
    assert status.remaining(1000.2) == pytest.approx(0.05)
    assert status.remaining(1001.0) == 0.0
    rig.sleep.release()
    await connecting
    assert client.status == Status("live", url=URL)


@pytest.mark.parametrize(
    ("code", "reason", "words"),
    [
        (1012, "mind restarting", "the Mind is restarting"),
        (4008, "slow consumer", "too slow to keep up: the Mind closed the connection"),
        (None, "", "the connection dropped"),
        (4321, "odd", "closed with code 4321: odd"),
    ],
)
async def test_a_lost_connection_says_why_in_words(
    rig: Rig, code: int | None, reason: str, words: str
) -> None:
    client, link = await rig.live()
    rig.sleep.hold()
    link.cut(code, reason)
    await rig.changes.until(lambda: client.status.state == "reconnecting", "reconnecting")
    assert (client.status.detail, client.status.url, client.status.attempt) == (words, URL, 1)


async def test_a_mind_on_this_machine_is_retried_at_least_every_two_seconds(rig: Rig) -> None:
    local = "ws://127.0.0.1:15707/v1/face"
    rig.mind.plan = ["refuse"] * 8
    client = rig.client(urls=local)
    await client.connect(timeout=TIMEOUT)
    assert client.max_delay_s == 2.0
    assert rig.sleep.delays == list(
        itertools.islice(backoff(cap=2.0, rng=random.Random(SEED)), 8)
    )
    assert max(rig.sleep.delays) <= 2.0


async def test_a_remote_mind_keeps_the_thirty_second_cap(rig: Rig) -> None:
    assert rig.client(urls=["ws://127.0.0.1/v1/face", URL]).max_delay_s == 30.0
    assert rig.client(urls="ws://[::1]:15707/v1/face").max_delay_s == 2.0


async def test_reconnect_now_skips_the_rest_of_the_wait(rig: Rig) -> None:
    client, link = await rig.live()
    rig.sleep.hold()  # no backoff wait ends on its own
    rig.mind.plan = ["refuse"]
    link.cut(1012)
    await rig.changes.until(lambda: client.status.state == "reconnecting", "waiting")
    assert len(rig.mind.attempts) == 1
    client.reconnect_now()
    await rig.changes.until(lambda: client.status.attempt == 2, "the refused retry")
    assert len(rig.mind.attempts) == 2
    client.reconnect_now()
    await rig.changes.until(lambda: client.status.state == "live", "live again")
    assert len(rig.mind.attempts) == 3


# -- the live lists: conversations and approvals (docs/protocol.md §16) ----------------


def conversation(cid: str, name: str | None, created_at: float) -> Payload:
    return {"id": cid, "name": name, "created_at": created_at}


def reading_rig(rig: Rig) -> None:
    rig.mind.scopes = ["face:sessions:read"]
    rig.mind.features = [*rig.mind.features, "conversation_changes", "approval_summaries"]


async def test_the_conversation_list_is_read_on_connect_and_kept_live(rig: Rig) -> None:
    reading_rig(rig)
    rig.mind.listed = {"c_1": conversation("c_1", "first", 1.0)}
    client, link = await rig.live()
    await rig.changes.until(lambda: "c_1" in client.conversations, "the list")
    assert ("conversations", "") in rig.updates
    link.push("face.conversation.changed",
              {"conversation": conversation("c_2", None, 2.0), "change": "created"})
    await rig.changes.until(lambda: "c_2" in client.conversations, "the new conversation")
    assert ("conversations", "c_2") in rig.updates
    link.push("face.conversation.changed",
              {"conversation": conversation("c_2", "trip", 2.0), "change": "renamed"})
    await rig.changes.until(lambda: client.conversations["c_2"].name == "trip", "renamed")
    assert list(client.conversations) == ["c_2", "c_1"]  # newest first
    # The news is the caller's news too; the client's own reads are not.
    assert len(rig.received("face.conversation.changed")) == 2
    assert rig.received("face.result") == []


async def test_the_lists_are_read_again_after_every_reconnect(rig: Rig) -> None:
    reading_rig(rig)
    client, link1 = await rig.live()
    await rig.changes.until(lambda: len(link1.frames("face.approval.list")) == 1, "first read")
    # Created while this Face was away: no news reached it, the re-read finds it.
    rig.mind.listed["c_9"] = conversation("c_9", "made elsewhere", 9.0)
    link2 = await rig.relink(link1)
    await rig.changes.until(lambda: "c_9" in client.conversations, "the re-read list")
    assert len(link2.frames("face.conversation.list")) == 1
    assert len(link2.frames("face.approval.list")) == 1


async def test_news_that_comes_while_the_list_is_read_wins(rig: Rig) -> None:
    reading_rig(rig)
    rig.mind.answer_lists = False
    client, link = await rig.live()
    await rig.changes.until(lambda: link.frames("face.conversation.list") != [], "the read")
    stale = dict(rig.mind.listed)
    stale["c_1"] = conversation("c_1", "old name", 1.0)
    link.push("face.conversation.changed",
              {"conversation": conversation("c_1", "new name", 1.0), "change": "renamed"})
    link.push("face.conversation.changed",
              {"conversation": conversation("c_2", None, 2.0), "change": "created"})
    rig.mind.listed = stale  # the read was answered from before the news
    rig.mind.answer_list(link, link.frames("face.conversation.list")[0]["request_id"])
    await rig.changes.until(lambda: ("conversations", "") in rig.updates, "the read applied")
    assert client.conversations["c_1"].name == "new name"
    assert "c_2" in client.conversations


async def test_a_face_without_read_scope_reads_no_lists(rig: Rig) -> None:
    client, link = await rig.live()
    ping = asyncio.ensure_future(client.request("face.ping"))
    await rig.changes.until(lambda: link.frames("face.ping") != [], "a later frame")
    ping.cancel()
    assert link.frames("face.conversation.list") == []
    assert link.frames("face.approval.list") == []


def summary(approval_id: str, cid: str = "c_1") -> Payload:
    return {"conversation_id": cid, "approval_id": approval_id, "request_id": "q-1",
            "tool": "exec_command", "reason": "the agent wants to run exec_command",
            "expires_at": 2000.0}


async def test_pending_approvals_across_conversations_stay_live(rig: Rig) -> None:
    reading_rig(rig)
    rig.mind.pending_approvals = {"a_1": summary("a_1")}
    client, link1 = await rig.live()
    await rig.changes.until(lambda: "a_1" in client.approvals, "the pending list")
    link1.push("face.approval.pending", summary("a_2", "c_2"))
    await rig.changes.until(lambda: "a_2" in client.approvals, "a new one")
    assert client.approvals["a_2"] == ApprovalPending(**summary("a_2", "c_2"))
    assert ("approvals", "c_2") in rig.updates
    link1.push("face.approval.settled", {"conversation_id": "c_1", "approval_id": "a_1",
                                         "status": "denied"})
    await rig.changes.until(lambda: "a_1" not in client.approvals, "settled")
    # Settled while away: the re-read after the reconnect drops it.
    rig.mind.pending_approvals = {}
    await rig.relink(link1)
    await rig.changes.until(lambda: client.approvals == {}, "the re-read")


async def test_a_refused_list_read_leaves_the_client_working(rig: Rig) -> None:
    reading_rig(rig)
    rig.mind.answer_lists = False
    client, link = await rig.live()
    await rig.changes.until(lambda: link.frames("face.approval.list") != [], "the read")
    read = link.frames("face.approval.list")[0]
    link.push("face.error", {"request_id": read["request_id"], "code": "forbidden",
                             "message": "", "retryable": False})
    rig.mind.convs["c_1"] = conv_with("c_1", "a")
    view = await client.subscribe("c_1")
    await client.wait_view("c_1", lambda v: v.ready, timeout=TIMEOUT)
    assert [m.content for m in view.messages] == ["a"]


async def test_conversation_list_is_deprecated_for_the_live_mapping(rig: Rig) -> None:
    reading_rig(rig)
    rig.mind.listed = {"c_1": conversation("c_1", "first", 1.0)}
    client, _ = await rig.live()
    await rig.changes.until(lambda: "c_1" in client.conversations, "the list")
    with pytest.warns(DeprecationWarning, match="client.conversations"):
        assert client.conversation_list() == list(client.conversations.values())
