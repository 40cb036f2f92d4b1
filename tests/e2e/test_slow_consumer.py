"""A slow Face hurts only itself (I7).

A Face that stops reading fills its kernel buffers, then the Mind's
transport buffer; from then on its bounded queue coalesces deltas and, when
even that is not enough, the Mind evicts it: a ``face.evicted`` frame with
its cursors, then close 4008. The actor and every other Face never wait for
it, the Mind's memory stays bounded, and the evicted Face resumes exactly
from the cursors it was handed.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets

from halfpi.core.limits import QueueLimits
from tests.support.client import FaceClient, seq_of
from tests.support.cluster_mind import ClusterMind
from tests.support.mind import MindProcess, local_mind
from tests.support.raw import RawFace
from tests.support.stream import (
    assert_contiguous,
    delta_text,
    is_event,
    is_terminal_event,
    positioned,
)

Frame = dict[str, Any]
KiB = 1024
MiB = 1024 * KiB
SMALL_RCVBUF = 4096
WORD = "p" * 9999  # with the separating space, every delta is 10,000 bytes of text
DELTA_BYTES = len(WORD) + 1
# What the stalled run may add to the Mind's peak RSS. Most of it is the
# 6 MiB chat.completed frame, one copy per subscriber. Under ASGI every frame
# is copied three more times (to str for the ASGI message, back to bytes and
# into a WebSocket frame in the server): measured ~40 MiB more at this run's
# peak, with or without the stalled Face.
RSS_BOUND = {"native": 100 * MiB, "asgi": 150 * MiB, "cluster": 100 * MiB}


def reply_of(count: int, word: str = WORD) -> str:
    return " ".join([word] * count)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    raise AssertionError("no VmRSS")


def stall_bytes() -> int:
    """How much a stalled socket can absorb before the Mind feels pressure:
    the kernel send buffer may grow to tcp_wmem's maximum."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as wmem:
            return int(wmem.read().split()[2])
    except OSError:
        return 4 * MiB


@dataclass
class Reader:
    """One well-behaved subscriber reading as fast as it can."""

    face: FaceClient
    request_id: str
    started: float = 0.0
    finished: float = 0.0
    closed_with: int | None = None
    frames: list[Frame] = field(default_factory=list)

    async def run(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                frame = await self.face.recv(deadline - loop.time())
                self.frames.append(frame)
                if is_event(frame, "chat.message", self.request_id):
                    self.started = loop.time()
                if is_terminal_event(frame, self.request_id):
                    self.finished = loop.time()
                    return
        except websockets.ConnectionClosed as exc:
            self.closed_with = exc.rcvd.code if exc.rcvd is not None else -1

    @property
    def took(self) -> float:
        return self.finished - self.started


async def run_readers(faces: list[FaceClient], op: FaceClient, cid: str, request_id: str,
                      content: str) -> list[Reader]:
    """``op`` chats; every Face in ``faces`` reads until the chat's terminal event."""
    readers = [Reader(face, request_id) for face in faces]
    tasks = [asyncio.create_task(r.run(30.0)) for r in readers]
    result = await op.chat_to_end(cid, content, request_id, 30.0)
    await asyncio.wait_for(asyncio.gather(*tasks), 35.0)
    assert result["type"] == "face.result", result
    assert result["payload"]["status"] == "succeeded", {
        k: v for k, v in result["payload"].items() if k != "content"}
    return readers


def check_reader(reader: Reader, text: str) -> None:
    assert reader.closed_with is None, f"a reading Face was closed with {reader.closed_with}"
    assert not [f for f in reader.frames if f["type"] == "face.evicted"]
    mine = positioned(reader.frames)
    begin = next(f for f in mine if is_event(f, "chat.message", reader.request_id))
    end = mine[-1]
    assert is_event(end, "chat.completed", reader.request_id), end
    assert_contiguous(mine[mine.index(begin):], begin["payload"]["seq"], end["payload"]["seq"])
    assert delta_text(mine, reader.request_id) == text
    assert end["payload"]["data"]["content"] == text


@pytest.mark.e2e
@pytest.mark.servers("native", "asgi", "cluster")  # on a cluster: readers on both nodes
async def test_I7_slow_consumer_evicted_others_unaffected(
    fast_mind: MindProcess, server_kind: str
) -> None:
    count = (stall_bytes() + 2 * MiB) // DELTA_BYTES
    if count * DELTA_BYTES > 7 * MiB:
        pytest.skip("kernel socket buffers this large would need a reply over the 8 MiB "
                    "reliable bound to stall a reader")
    text = reply_of(count)
    url, token = fast_mind.url, fast_mind.token
    op = await FaceClient.connect(url, token)
    cid = await op.create_conversation()
    nine = [await FaceClient.connect(url, token) for _ in range(9)]
    for face in nine:
        assert (await face.subscribe(cid))["type"] == "face.accepted"

    # A run with nobody stalled, for comparison.
    baseline = await run_readers(nine, op, cid, "unhurried", f"/repeat {count} {WORD}")
    for reader in baseline:
        check_reader(reader, text)

    # On a cluster the stalled Face dials node b itself (not the owner of the
    # conversation: its replica): a proxy in the way would add buffers of its own.
    slow_url = fast_mind.nodes[1].url if isinstance(fast_mind, ClusterMind) else url
    slow = await RawFace.connect(slow_url, rcvbuf=SMALL_RCVBUF)
    await slow.hello(token)
    await slow.send("face.subscribe", {"request_id": "slow-sub", "conversation_ids": [cid]})
    await slow.expect(lambda f: f["type"] == "face.accepted")

    # The process that holds the stalled Face's queue.
    holder = fast_mind.nodes[1] if isinstance(fast_mind, ClusterMind) else fast_mind
    pid = holder.proc.pid  # type: ignore[union-attr]
    rss_before = rss_bytes(pid)
    rss_peak = rss_before
    sampling = True

    async def sample() -> None:
        nonlocal rss_peak
        while sampling:
            rss_peak = max(rss_peak, rss_bytes(pid))
            await asyncio.sleep(0.02)  # sampling period, not synchronization

    sampler = asyncio.create_task(sample())
    try:
        readers = await run_readers(nine, op, cid, "stalled", f"/repeat {count} {WORD}")
        # Only now does the slow Face read what was buffered for it.
        code = await slow.read_until_closed(15)
    finally:
        sampling = False
        await sampler
    grew = rss_peak - rss_before
    assert grew < RSS_BOUND[server_kind], f"RSS grew by {grew >> 20} MiB"

    for reader in readers:
        check_reader(reader, text)
    # Loosely: the stalled Face did not slow the others down.
    slowest = max(r.took for r in readers)
    assert slowest < 3 * max(r.took for r in baseline) + 2.0

    assert code == 4008
    assert slow.frames[-1]["type"] == "face.evicted", slow.frames[-1]
    cursors = slow.frames[-1]["payload"]["cursors"]
    assert set(cursors) == {cid}
    got = positioned(slow.frames, cid)
    assert got, "the slow Face received nothing before its eviction"
    assert got[-1]["payload"]["cursor"] == cursors[cid]
    assert is_event(got[0], "chat.message", "stalled")
    assert_contiguous(got, got[0]["payload"]["seq"], seq_of(cursors[cid]))

    # It comes back with the cursor it was handed and misses nothing.
    back = await FaceClient.connect(url, token)
    sub = await back.subscribe(cid, since=cursors[cid])
    assert sub["payload"]["replay"] == "exact", sub
    end = await back.expect(lambda f: is_terminal_event(f, "stalled"), 20)
    rest = positioned(back.seen, cid)
    assert_contiguous(rest, seq_of(cursors[cid]) + 1, end["payload"]["seq"])
    assert delta_text(got, "stalled") + delta_text(rest, "stalled") == text
    await back.close()


def session_paused(mind: Any, face: RawFace) -> bool:
    """Whether the Mind has stopped writing to ``face`` (its transport backed up)."""
    port = face.sock.getsockname()[1]
    for conn in mind.connections:
        if peer_port(getattr(conn.framing, "transport", None)) == port:
            return bool(conn.paused)
    raise AssertionError("no session for that socket")


async def until_pressured(mind: Any, face: RawFace, timeout: float = 5.0) -> None:
    """Wait until the Mind holds writes to ``face`` back. The native server
    feels its full transport at once; an ASGI application feels the server's
    full buffer at its next send (docs/asgi.md), so each round without
    pressure gives it one: the answer to a ``face.ping``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    nudges = 0
    while not session_paused(mind, face):
        assert loop.time() < deadline, "the stalled Face never put the Mind under pressure"
        await face.send("face.ping", {"request_id": f"nudge-{nudges}"})
        nudges += 1
        await asyncio.sleep(0.01)  # condition poll


def peer_port(connection: Any) -> int | None:
    """The peer's port of a session's connection, native or ASGI."""
    transport = getattr(connection, "transport", None)  # native: the asyncio transport
    if transport is not None:
        return int(transport.get_extra_info("peername")[1])
    client = getattr(connection, "scope", {}).get("client")  # ASGI: the scope
    return int(client[1]) if client else None


async def test_I7_evicted_face_resumes_exactly_from_its_cursors(
    tmp_path: Path, server_kind: str
) -> None:
    async with local_mind(tmp_path / "home", server=server_kind) as m:
        op = await FaceClient.connect(m.url, m.token)
        cid = await op.create_conversation()
        peer = await FaceClient.connect(m.url, m.token)
        await peer.subscribe(cid, transient_types=[])
        slow = await RawFace.connect(m.url, rcvbuf=SMALL_RCVBUF)
        await slow.hello(m.token)
        await slow.send("face.subscribe", {"request_id": "slow-sub", "conversation_ids": [cid],
                                           "transient_types": []})
        await slow.expect(lambda f: f["type"] == "face.accepted")

        # A reply far bigger than any socket buffer: the slow Face's transport backs up.
        filler = await op.chat_to_end(cid, f"/repeat 600 {WORD}", "filler", 30)
        assert filler["payload"]["status"] == "succeeded"
        await until_pressured(m.mind, slow)

        # Life goes on without it...
        after = await op.chat_to_end(cid, "life goes on", "after", 10)
        assert after["payload"]["status"] == "succeeded"
        # ...while its own unread answers pile up until they no longer fit.
        for batch in range(6):
            await slow.send_many([json.dumps({"type": "face.ping",
                                              "payload": {"request_id": f"p{batch}-{i}"}})
                                  for i in range(50)])
        code = await slow.read_until_closed(15)
        assert code == 4008
        assert slow.frames[-1]["type"] == "face.evicted", slow.frames[-1]
        cursors = slow.frames[-1]["payload"]["cursors"]
        got = positioned(slow.frames, cid)
        assert is_event(got[-1], "chat.completed", "filler")
        assert cursors == {cid: got[-1]["payload"]["cursor"]}
        assert len([f for f in slow.frames if f["type"] == "face.pong"]) < 300

        back = await FaceClient.connect(m.url, m.token)
        sub = await back.subscribe(cid, since=cursors[cid])
        assert sub["payload"]["replay"] == "exact", sub
        end = await back.expect(lambda f: is_terminal_event(f, "after"))
        assert_contiguous(positioned(back.seen, cid), seq_of(cursors[cid]) + 1,
                          end["payload"]["seq"])
        assert delta_text(back.seen, "after") == "life goes on"

        # The other subscriber saw both chats end and was never disturbed.
        await peer.expect(lambda f: is_terminal_event(f, "after"))
        assert not [f for f in peer.seen if f["type"] == "face.evicted"]
        ping = await peer.command("face.ping")
        await peer.reply(ping, ("face.pong",))
        for face in (op, peer, back):
            await face.close()


async def test_I7_eviction_on_a_terminal_event_does_not_wedge_the_conversation(
    tmp_path: Path, server_kind: str,
) -> None:
    # Eight reliable messages per queue: the third short chat's chat.completed is the
    # ninth for a stalled subscriber that only takes reliable events.
    async with local_mind(tmp_path / "home", server=server_kind,
                          queue=QueueLimits(reliable_messages=8)) as m:
        op = await FaceClient.connect(m.url, m.token)
        cid = await op.create_conversation()
        slow = await RawFace.connect(m.url, rcvbuf=SMALL_RCVBUF)
        await slow.hello(m.token)
        await slow.send("face.subscribe", {"request_id": "slow-sub", "conversation_ids": [cid],
                                           "transient_types": []})
        await slow.expect(lambda f: f["type"] == "face.accepted")
        filler = await op.chat_to_end(cid, f"/repeat 600 {WORD}", "filler", 30)
        assert filler["payload"]["status"] == "succeeded"
        await until_pressured(m.mind, slow)

        for request_id in ("a", "b", "c"):
            result = await op.chat_to_end(cid, f"short {request_id}", request_id, 5)
            assert result["type"] == "face.result", result
            assert result["payload"]["status"] == "succeeded", result
        assert await slow.read_until_closed(15) == 4008
        after = await op.chat_to_end(cid, "still free", "d", 5)
        assert after["type"] == "face.result", after
        assert after["payload"]["status"] == "succeeded"
        await op.close()


async def test_I7_pipelined_commands_beyond_the_inbox_are_rate_limited_not_evicted(
    tmp_path: Path, server_kind: str,
) -> None:
    async with local_mind(tmp_path / "home", server=server_kind) as m:
        face = await RawFace.connect(m.url)
        await face.hello(m.token)
        ids = [f"p{i}" for i in range(300)]
        await face.send_many([json.dumps({"type": "face.ping", "payload": {"request_id": i}})
                              for i in ids])
        answered: dict[str, str] = {}
        while len(answered) < len(ids):
            frame = await face.expect(lambda f: f["payload"].get("request_id") in ids, 5)
            key = frame["type"] + ":" + frame["payload"].get("code", "")
            assert frame["payload"]["request_id"] not in answered
            answered[frame["payload"]["request_id"]] = key
        assert set(answered.values()) <= {"face.pong:", "face.error:rate_limited"}
        await face.send("face.ping", {"request_id": "still-there"})
        await face.expect(lambda f: f["payload"].get("request_id") == "still-there", 5)
        face.close()


async def test_I7_reply_larger_than_the_reliable_bound_reaches_a_fast_requester(
    tmp_path: Path, server_kind: str,
) -> None:
    limits = QueueLimits(reliable_bytes=256 * KiB)
    async with local_mind(tmp_path / "home", server=server_kind, queue=limits) as m:
        face = await FaceClient.connect(m.url, m.token)
        cid = await face.create_conversation()
        result = await face.chat_to_end(cid, f"/repeat 30 {WORD}", "long", 10)
        assert result["payload"]["status"] == "succeeded"
        assert result["payload"]["content"] == reply_of(30)
        await face.close()

