"""SSE streams without sockets (DESIGN §9, docs/protocol.md §17): a whole
Mind on a fake clock, the HTTP door driven through its ASGI app by an
in-memory server side (``tests/support/sse.py``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.config import JournalLimits
from halfpi.core.events import ConversationInfo, ConversationNews
from halfpi.core.limits import QueueLimits
from halfpi.core.scopes import scopes_for
from halfpi.gateway.asgi import AsgiGateway
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.auth import make_credential
from tests.support.rig import Peer, Rig, fake_time_mind
from tests.support.sse import HttpPeer, data_events
from tests.support.stream import assert_contiguous, delta_text, positioned


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with fake_time_mind(tmp_path / "home") as r:
        yield r


def bearer(token: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **more}


async def stream(rig: Rig, conversations: list[str], *, headers: dict[str, str] | None = None,
                 **query: str) -> HttpPeer:
    peer = HttpPeer("GET", "/v1/events", query={"conversations": ",".join(conversations), **query},
                    headers=bearer(rig.face_token) if headers is None else headers)
    return await peer.start(AsgiGateway(rig.mind)).answered()


async def chat(rig: Rig, face: Peer, cid: str, content: str) -> str:
    request_id = await rig.command(face, "face.chat", conversation_id=cid, content=content)
    await rig.reply(face, request_id)
    return request_id


def accepted(peer: HttpPeer) -> bool:
    return any(f["type"] == "face.accepted" for f in peer.frames())


def completed(request_id: str) -> Any:
    def check(peer: HttpPeer) -> bool:
        return any(f["type"] == "face.event" and f["payload"]["type"] == "chat.completed"
                   and f["payload"]["data"].get("request_id") == request_id
                   for f in peer.frames())
    return check


async def test_a_stream_says_retry_first_then_a_snapshot_of_each_conversation(rig: Rig) -> None:
    face = await rig.face()
    a, b = await rig.conversation(face), await rig.conversation(face)
    peer = await stream(rig, [b, a])
    await peer.until(lambda p: len(p.frames()) >= 3)
    assert peer.status == 200
    headers = peer.headers
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache"
    assert headers["x-accel-buffering"] == "no"
    events = peer.events()
    assert events[0].retry is not None and not events[0].data
    shown = data_events(events)
    assert [e.event for e in shown] == ["face.accepted", "face.snapshot", "face.snapshot"]
    assert {e.payload["conversation"]["id"] for e in shown[1:]} == {a, b}
    # Each event's data is the frame a WebSocket carries, its type the event's name.
    assert all(e.frame["type"] == e.event for e in shown)
    assert all(e.id for e in shown)


async def test_a_stream_resumes_exactly_from_any_event_id(rig: Rig) -> None:
    face = await rig.face()
    a, b = await rig.conversation(face), await rig.conversation(face)
    first = await stream(rig, [a, b])
    await first.until(accepted)
    ra = await chat(rig, face, a, "/repeat 20 alpha")
    rb = await chat(rig, face, b, "/repeat 20 beta")
    await first.until(completed(ra))
    await first.until(completed(rb))
    shown = data_events(first.events())
    # The reader stopped at an event in the middle, whichever it was.
    cut = next(i for i, e in enumerate(shown)
               if e.event == "face.chat.delta" and e.payload["conversation_id"] == b) + 3
    first.disconnect()
    second = await stream(rig, [a, b], headers=bearer(rig.face_token,
                                                      **{"last-event-id": shown[cut].id or ""}))
    await second.until(completed(rb))
    resumed = second.frames()
    assert resumed[0]["type"] == "face.accepted"
    assert resumed[0]["payload"]["replay"] == "exact"
    before = [e.frame for e in shown[: cut + 1]]
    for cid, request_id, word in ((a, ra, "alpha"), (b, rb, "beta")):
        seen = positioned(before, cid) + positioned(resumed, cid)
        assert_contiguous(seen, seen[0]["payload"]["seq"], seen[-1]["payload"]["seq"])
        assert delta_text(seen, request_id) == " ".join([word] * 20)


async def test_since_in_the_url_resumes_as_last_event_id_does(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    first = await stream(rig, [a])
    await first.until(accepted)
    ra = await chat(rig, face, a, "one two three")
    await first.until(completed(ra))
    last = data_events(first.events())[-1].id or ""
    second = await stream(rig, [a], since=last)
    await second.until(accepted)
    await asyncio.sleep(0)
    assert second.frames()[0]["payload"]["replay"] == "exact"
    assert positioned(second.frames()) == []


@pytest.mark.parametrize("case", ["another principal", "other conversations", "malformed"])
async def test_I4_a_foreign_token_is_answered_in_band_with_a_reset(rig: Rig, case: str) -> None:
    face = await rig.face()
    a, b = await rig.conversation(face), await rig.conversation(face)
    first = await stream(rig, [a])
    await first.until(accepted)
    token = data_events(first.events())[-1].id or ""
    if case == "another principal":
        credential, other = make_credential("face", "tablet", "operator", scopes_for("operator"),
                                            rig.mind.now())
        await rig.mind.store.add_credential(credential)
        await rig.mind.refresh_credentials()
        peer = await stream(rig, [a], headers=bearer(other, **{"last-event-id": token}))
    elif case == "other conversations":
        peer = await stream(rig, [a, b], headers=bearer(rig.face_token,
                                                        **{"last-event-id": token}))
    else:
        peer = await stream(rig, [a], headers=bearer(rig.face_token,
                                                     **{"last-event-id": "not-a-token"}))
    await peer.until(lambda p: p.status is not None)
    assert peer.status == 200, peer.text
    await peer.until(lambda p: len([f for f in p.frames() if f["type"] == "face.reset"]) >= 1)
    assert peer.status == 200
    resets = [f for f in peer.frames() if f["type"] == "face.reset"]
    assert {f["payload"]["reason"] for f in resets} == {"unknown_cursor"}
    assert all(f["payload"]["snapshot"]["cursor"] for f in resets)


async def test_I4_an_expired_token_is_answered_in_band_with_a_reset(tmp_path: Path) -> None:
    journal = MemoryJournal(JournalLimits(events=4, seconds=0.0))
    async with fake_time_mind(tmp_path / "home", journal=journal) as rig:
        face = await rig.face()
        a = await rig.conversation(face)
        first = await stream(rig, [a])
        await first.until(accepted)
        token = data_events(first.events())[-1].id or ""
        first.disconnect()
        for n in range(2):  # the second, later, pushes the first out of the window
            ra = await chat(rig, face, a, f"/repeat 30 gone{n}")
            await rig.expect(face, lambda f, ra=ra: f["type"] == "face.event"
                             and f["payload"]["type"] == "chat.completed"
                             and f["payload"]["data"]["request_id"] == ra)
            rig.clock.now += 10
        peer = await stream(rig, [a], headers=bearer(rig.face_token, **{"last-event-id": token}))
        await peer.until(lambda p: any(f["type"] == "face.reset" for f in p.frames()))
        reset = next(f for f in peer.frames() if f["type"] == "face.reset")
        assert reset["payload"]["reason"] == "cursor_expired"
        assert "gone1" in str(reset["payload"]["snapshot"]["messages"])
        # The reset moves the stream: the next id resumes from its snapshot.
        ids = [e.id for e in data_events(peer.events()) if e.event == "face.reset"]
        again = await stream(rig, [a], headers=bearer(rig.face_token,
                                                      **{"last-event-id": ids[-1] or ""}))
        await again.until(accepted)
        assert again.frames()[0]["payload"]["replay"] == "exact"


async def test_a_ping_comment_every_heartbeat_on_the_minds_clock(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    peer = await stream(rig, [a])
    await peer.until(accepted)
    heartbeat = rig.mind.config.heartbeat_s
    rig.mind.tick_connections(rig.clock.now + heartbeat - 1)
    await asyncio.sleep(0)
    assert not any("ping" in e.comments for e in peer.events())
    rig.clock.now += heartbeat
    rig.mind.tick_connections(rig.clock.now)
    await peer.until(lambda p: any("ping" in e.comments for e in p.events()))
    rig.clock.now += heartbeat
    rig.mind.tick_connections(rig.clock.now)
    await peer.until(lambda p: sum("ping" in e.comments for e in p.events()) == 2)


async def test_heartbeat_event_makes_every_ping_an_event_a_page_can_see(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    plain = await stream(rig, [a])
    seen = await stream(rig, [a], heartbeat="event")
    await plain.until(accepted)
    await seen.until(accepted)
    rig.clock.now += rig.mind.config.heartbeat_s
    rig.mind.tick_connections(rig.clock.now)
    beats = lambda p: [e for e in p.events() if e.event == "face.heartbeat"]  # noqa: E731
    await seen.until(lambda p: len(beats(p)) == 1)
    assert beats(seen)[0].frame == {"type": "face.heartbeat", "payload": {
        "interval_s": round(rig.mind.config.heartbeat_s)}}
    assert beats(seen)[0].id is None  # never a resume position of its own
    await plain.until(lambda p: any("ping" in e.comments for e in p.events()))
    assert beats(plain) == []


async def test_a_heartbeat_that_is_neither_comment_nor_event_is_400(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    peer = await stream(rig, [a], heartbeat="loud")
    assert peer.status == 400
    assert peer.json()["error"]["field"] == "heartbeat"


async def test_I7_a_slow_reader_is_evicted_alone_with_its_cursors_in_the_last_id(
    tmp_path: Path,
) -> None:
    limits = QueueLimits(reliable_messages=8, reliable_bytes=64 * 1024,
                         transient_messages=8, transient_bytes=4 * 1024)
    async with fake_time_mind(tmp_path / "home", queue=limits) as rig:
        face = await rig.face()
        a = await rig.conversation(face)
        slow = await stream(rig, [a])
        fast = await stream(rig, [a])
        await slow.until(accepted)
        slow.gate.clear()  # this reader stops reading
        for n in range(12):
            await chat(rig, face, a, f"/repeat 50 {'w' * 2000}{n}")
            await rig.expect(face, lambda f, n=n: f["type"] == "face.result"
                             and f["payload"].get("content", "").endswith(f"{n}"))
            if any(f["type"] == "face.evicted" for f in slow.frames()):
                break
        slow.gate.set()
        await slow.until(lambda p: p.ended)
        last = data_events(slow.events())[-1]
        assert last.event == "face.evicted"
        cursors = last.payload["cursors"]
        shown = positioned(slow.frames(), a)
        assert shown and cursors[a] == shown[-1]["payload"]["cursor"]
        # The other reader got everything, in order.
        got = positioned(fast.frames(), a)
        assert_contiguous(got, got[0]["payload"]["seq"], got[-1]["payload"]["seq"])
        # Resuming from the last id: exactly what followed.
        again = await stream(rig, [a], headers=bearer(rig.face_token,
                                                      **{"last-event-id": last.id or ""}))
        await again.until(lambda p: positioned(p.frames()) != [] or accepted(p))
        await again.until(lambda p: bool(positioned(p.frames()))
                          and positioned(p.frames())[-1]["payload"]["seq"]
                          == got[-1]["payload"]["seq"])
        rest = positioned(again.frames(), a)
        assert_contiguous(shown + rest, shown[0]["payload"]["seq"], got[-1]["payload"]["seq"])


async def test_I7_deltas_coalesce_while_the_reader_is_behind(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    peer = await stream(rig, [a])
    await peer.until(accepted)
    peer.gate.clear()
    held = peer  # keep a name for the assertion below
    ra = await chat(rig, face, a, "/repeat 2000 word")
    await rig.expect(face, lambda f: f["type"] == "face.result")
    held.gate.set()
    await peer.until(completed(ra))
    deltas = [f for f in peer.frames() if f["type"] == "face.chat.delta"]
    assert any("first_seq" in d["payload"] for d in deltas)
    assert len(deltas) < 2000
    assert delta_text(peer.frames(), ra) == " ".join(["word"] * 2000)


async def test_I8_a_revoked_credential_ends_the_stream(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    credential, other = make_credential("face", "tablet", "operator", scopes_for("operator"),
                                        rig.mind.now())
    await rig.mind.store.add_credential(credential)
    await rig.mind.refresh_credentials()
    peer = await stream(rig, [a], headers=bearer(other))
    await peer.until(accepted)
    await rig.mind.store.revoke_credential("face", "tablet", rig.mind.now())
    await rig.mind.refresh_credentials()
    await peer.until(lambda p: p.ended)
    assert peer.task is not None
    await asyncio.wait_for(peer.task, 5)


async def test_streams_end_when_the_mind_drains(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    peer = await stream(rig, [a])
    await peer.until(accepted)
    rig.mind.draining = True
    for session in list(rig.mind.connections):
        session.close(1012, "mind restarting")
    await peer.until(lambda p: p.ended)
    rig.mind.draining = False


async def test_streams_count_against_the_principals_connection_cap(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home", max_connections_per_principal=2) as rig:
        face = await rig.face()
        a = await rig.conversation(face)
        one = await stream(rig, [a])
        await one.until(accepted)
        refused = await stream(rig, [a])
        assert refused.status == 429
        assert refused.json()["error"]["code"] == "rate_limited"
        one.disconnect()
        await one.until(lambda p: p.task is not None and p.task.done())
        again = await stream(rig, [a])
        await again.until(accepted)


async def test_an_unknown_conversation_is_an_http_error(rig: Rig) -> None:
    peer = await stream(rig, ["c_nope"])
    assert peer.status == 404
    assert peer.json()["error"]["code"] == "conversation_not_found"


async def test_a_stream_needs_a_credential(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    peer = await stream(rig, [a], headers={})
    assert peer.status == 401
    assert peer.json()["error"]["code"] == "unauthorized"


async def test_one_conversation_streams_at_its_own_path(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    peer = HttpPeer("GET", f"/v1/conversations/{a}/events", headers=bearer(rig.face_token))
    await peer.start(AsgiGateway(rig.mind)).answered()
    await peer.until(lambda p: len(p.frames()) >= 2)
    assert [f["type"] for f in peer.frames()] == ["face.accepted", "face.snapshot"]


async def test_tokens_and_tickets_are_never_logged(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    face = await rig.face()
    a = await rig.conversation(face)
    ask = HttpPeer("POST", "/v1/stream-tickets", headers=bearer(rig.face_token),
                   body=b'{"conversations": ["%s"]}' % a.encode())
    await ask.start(AsgiGateway(rig.mind)).answered()
    await ask.until(lambda p: p.ended)
    ticket = ask.json()["ticket"]
    for _ in range(2):
        peer = await stream(rig, [a], headers={}, ticket=ticket)
        await peer.until(lambda p: p.status is not None)
    assert ticket not in caplog.text
    assert rig.face_token not in caplog.text


async def test_what_one_loop_turn_sends_a_stream_leaves_in_one_write(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    peer = await stream(rig, [a])
    await peer.until(accepted)
    sends = len(peer.sent)
    for n in range(3):  # three pieces of news in one turn, each on its own...
        rig.mind.announce(ConversationNews(
            conversation=ConversationInfo(id=f"c_{n}", name=None, created_at=0.0),
            change="created"))
    await peer.until(lambda p: sum(f["type"] == "face.conversation.changed"
                                   for f in p.frames()) == 3)
    bodies = [m for m in peer.sent[sends:] if m["type"] == "http.response.body"]
    assert len(bodies) == 1  # ...and one body chunk, one send, for all three
    assert bodies[0]["body"].count(b"event: face.conversation.changed") == 3
