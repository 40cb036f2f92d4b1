"""The Durable Streams read side without sockets (DESIGN §9, docs/protocol.md
§20): a whole Mind on a fake clock, the route driven through the ASGI app by
an in-memory server side (``tests/support/sse.py``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.config import JournalLimits
from halfpi.core.durable import offset_of_text
from halfpi.core.scopes import scopes_for
from halfpi.gateway.asgi import AsgiGateway
from halfpi.gateway.http.durable import CHUNK_BYTES, LONG_POLL_S
from halfpi.journal.memory import MemoryJournal
from halfpi.mind.auth import make_credential
from tests.support.rig import Peer, Rig, fake_time_mind
from tests.support.sse import HttpPeer
from tests.support.stream import assert_contiguous, delta_text


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with fake_time_mind(tmp_path / "home") as r:
        yield r


def bearer(token: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **more}


def start(rig: Rig, cid: str, *, method: str = "GET", headers: dict[str, str] | None = None,
          **query: str) -> HttpPeer:
    peer = HttpPeer(method, f"/v1/conversations/{cid}/stream", query=query,
                    headers=bearer(rig.face_token) if headers is None else headers)
    return peer.start(AsgiGateway(rig.mind))


async def read(rig: Rig, cid: str, *, method: str = "GET", headers: dict[str, str] | None = None,
               **query: str) -> HttpPeer:
    peer = start(rig, cid, method=method, headers=headers, **query)
    await peer.until(lambda p: p.ended)
    return peer


async def chat(rig: Rig, face: Peer, cid: str, content: str) -> str:
    request_id = await rig.command(face, "face.chat", conversation_id=cid, content=content)
    await rig.reply(face, request_id)
    return request_id


def head_cursor(face: Peer, cid: str) -> str:
    """The cursor of the last event ``face`` saw of ``cid``."""
    frames = [f for f in face.wire.frames if f["payload"].get("conversation_id") == cid
              and "cursor" in f["payload"]]
    return str(frames[-1]["payload"]["cursor"])


async def test_offset_minus_1_reads_the_whole_log_as_a_json_array_of_frames(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    request_id = await chat(rig, face, cid, "/repeat 5 hello")
    peer = await read(rig, cid, offset="-1")
    assert peer.status == 200
    assert peer.headers["content-type"].startswith("application/json")
    frames = peer.json()
    # The frames as the WebSocket frames them, every seq of the log once.
    assert {f["type"] for f in frames} == {"face.event", "face.chat.delta"}
    assert_contiguous(frames, 1, frames[-1]["payload"]["seq"])
    assert delta_text(frames, request_id) == "hello hello hello hello hello"
    assert frames[-1]["payload"]["cursor"] == head_cursor(face, cid)
    assert peer.headers["stream-next-offset"] == offset_of_text(head_cursor(face, cid))
    assert peer.headers["stream-up-to-date"] == "true"
    assert "etag" in peer.headers


async def test_reading_from_a_next_offset_gives_exactly_what_followed(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "first")
    first = await read(rig, cid, offset="-1")
    second_id = await chat(rig, face, cid, "/repeat 3 second")
    after = await read(rig, cid, offset=first.headers["stream-next-offset"])
    frames = after.json()
    assert frames[0]["payload"]["seq"] == first.json()[-1]["payload"]["seq"] + 1
    assert_contiguous(first.json() + frames, 1, frames[-1]["payload"]["seq"])
    assert delta_text(frames, second_id) == "second second second"
    # At the tail: an empty array, the same offset, up to date.
    tail = await read(rig, cid, offset=after.headers["stream-next-offset"])
    assert tail.json() == []
    assert tail.headers["stream-next-offset"] == after.headers["stream-next-offset"]
    assert tail.headers["stream-up-to-date"] == "true"


async def test_offset_now_is_an_empty_array_at_the_tail(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "/repeat 3 old")
    peer = await read(rig, cid, offset="now")
    assert peer.json() == []
    assert peer.headers["stream-next-offset"] == offset_of_text(head_cursor(face, cid))
    assert peer.headers["stream-up-to-date"] == "true"
    assert "etag" not in peer.headers  # PROTOCOL.md §10.1: not for offset=now


async def test_head_names_the_tail_without_a_body(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "hi")
    peer = await read(rig, cid, method="HEAD")
    assert peer.status == 200
    assert peer.text == ""
    assert peer.headers["stream-next-offset"] == offset_of_text(head_cursor(face, cid))


async def test_a_long_poll_answers_with_the_next_event(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    tail = (await read(rig, cid, offset="now")).headers["stream-next-offset"]
    peer = start(rig, cid, offset=tail, live="long-poll")
    await chat(rig, face, cid, "wake")
    await peer.until(lambda p: p.ended)
    assert peer.status == 200
    frames = peer.json()
    assert frames and frames[0]["payload"]["type"] == "chat.message"
    assert peer.headers["stream-cursor"].isdigit()
    assert peer.headers["stream-next-offset"] > tail  # offsets sort as text


async def test_a_long_poll_times_out_with_204_on_the_minds_clock(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "before")
    peer = start(rig, cid, offset="now", live="long-poll")
    await peer.until(lambda p: len(rig.mind.connections) == 2)  # the face and the read
    rig.mind.tick_connections(rig.clock.now + LONG_POLL_S - 1)
    assert peer.status is None
    rig.mind.tick_connections(rig.clock.now + LONG_POLL_S)
    await peer.until(lambda p: p.ended)
    assert peer.status == 204
    assert peer.headers["stream-up-to-date"] == "true"
    assert peer.headers["stream-next-offset"] == offset_of_text(head_cursor(face, cid))
    assert peer.headers["stream-cursor"].isdigit()


async def test_I8_a_credential_revoked_during_a_long_poll_is_401(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    credential, other = make_credential("face", "tablet", "operator", scopes_for("operator"),
                                        rig.mind.now())
    await rig.mind.store.add_credential(credential)
    await rig.mind.refresh_credentials()
    peer = start(rig, cid, headers=bearer(other), offset="now", live="long-poll")
    await peer.until(lambda p: len(rig.mind.connections) == 2)
    await rig.mind.store.revoke_credential("face", "tablet", rig.mind.now())
    await rig.mind.refresh_credentials()
    await peer.until(lambda p: p.ended)
    assert peer.status == 401


async def test_sse_sends_data_then_control_events(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    request_id = await chat(rig, face, cid, "/repeat 3 past")
    peer = start(rig, cid, offset="-1", live="sse")
    await peer.until(lambda p: '"upToDate":true' in p.text)
    assert peer.headers["content-type"].startswith("text/event-stream")
    events = [e for e in peer.events() if e.data]
    assert {e.event for e in events} == {"data", "control"}
    frames: list[dict[str, Any]] = []
    for event in events:
        if event.event == "data":
            frames += json.loads(event.data)
    assert_contiguous(frames, 1, frames[-1]["payload"]["seq"])
    assert delta_text(frames, request_id) == "past past past"
    last = json.loads(events[-1].data)
    assert events[-1].event == "control"
    assert last["streamNextOffset"] == offset_of_text(head_cursor(face, cid))
    # Live: the next chat comes as data, control after it.
    live_id = await chat(rig, face, cid, "now live")
    await peer.until(lambda p: "now live" in p.text)
    await rig.expect(face, lambda f: f["type"] == "face.event"
                     and f["payload"]["type"] == "chat.completed")
    await peer.until(lambda p: head_cursor(face, cid) in p.text)
    later = [json.loads(e.data) for e in peer.events() if e.event == "data"]
    assert delta_text([f for batch in later for f in batch], live_id) == "now live"
    peer.disconnect()


async def test_sse_from_now_says_up_to_date_at_once(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "before")
    peer = start(rig, cid, offset="now", live="sse")
    await peer.until(lambda p: "control" in p.text)
    control = next(e for e in peer.events() if e.event == "control")
    body = json.loads(control.data)
    assert body["upToDate"] is True
    assert body["streamNextOffset"] == offset_of_text(head_cursor(face, cid))
    assert "before" not in peer.text
    peer.disconnect()


async def test_I4_an_offset_of_another_epoch_is_410_gone(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "hi")
    peer = await read(rig, cid, offset="00000000_0000000000000001")
    assert peer.status == 410
    error = peer.json()["error"]
    assert error["code"] == "epoch_changed"
    assert error["snapshot"] == f"/v1/conversations/{cid}"
    sse = await read(rig, cid, offset="00000000_0000000000000001", live="sse")
    assert sse.status == 410


async def test_I4_an_offset_past_the_head_is_410_gone(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "hi")
    epoch = head_cursor(face, cid).split(".")[0]
    peer = await read(rig, cid, offset=f"{epoch}_0000000000009999")
    assert peer.status == 410
    assert peer.json()["error"]["code"] == "unknown_cursor"


async def test_I4_history_the_journal_let_go_is_410_and_the_snapshot_cursor_follows_on(
    tmp_path: Path,
) -> None:
    journal = MemoryJournal(JournalLimits(events=4, seconds=0.0))
    async with fake_time_mind(tmp_path / "home", journal=journal) as rig:
        face = await rig.face()
        cid = await rig.conversation(face)
        for n in range(2):
            await chat(rig, face, cid, f"/repeat 30 gone{n}")
            await rig.expect(face, lambda f, n=n: f["type"] == "face.event"
                             and f["payload"]["type"] == "chat.completed"
                             and f"gone{n}" in str(f["payload"]["data"]))
            rig.clock.now += 10
        gone = await read(rig, cid, offset="-1")
        assert gone.status == 410
        assert gone.json()["error"]["code"] == "cursor_expired"
        snapshot = await read_snapshot(rig, cid)
        follow = await read(rig, cid, offset=snapshot["cursor"])
        assert follow.status == 200
        assert follow.json() == []
        assert follow.headers["stream-next-offset"] == offset_of_text(snapshot["cursor"])


async def read_snapshot(rig: Rig, cid: str) -> dict[str, Any]:
    peer = HttpPeer("GET", f"/v1/conversations/{cid}", headers=bearer(rig.face_token))
    peer.start(AsgiGateway(rig.mind))
    await peer.until(lambda p: p.ended)
    assert peer.status == 200, peer.text
    snapshot: dict[str, Any] = peer.json()
    return snapshot


@pytest.mark.parametrize("query", [
    {"offset": "12"}, {"offset": "a.b"}, {"offset": "x_1"},
    {"offset": "-1", "live": "yes"}, {"live": "long-poll"}, {"offset": "-1", "detail": "all"},
])
async def test_a_malformed_read_is_400(rig: Rig, query: dict[str, str]) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    peer = await read(rig, cid, **query)
    assert peer.status == 400


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_writes_are_refused_the_stream_is_read_only(rig: Rig, method: str) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    peer = await read(rig, cid, method=method)
    assert peer.status == 405
    assert "GET" in peer.headers["allow"]


async def test_a_read_needs_a_credential_with_sessions_read(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    assert (await read(rig, cid, headers={}, offset="-1")).status == 401
    credential, token = make_credential("face", "blind", "operator", frozenset(), rig.mind.now())
    await rig.mind.store.add_credential(credential)
    await rig.mind.refresh_credentials()
    assert (await read(rig, cid, headers=bearer(token), offset="-1")).status == 403


async def test_I9_an_observer_cannot_read_transparent(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    credential, token = make_credential("face", "watcher", "observer", scopes_for("observer"),
                                        rig.mind.now())
    await rig.mind.store.add_credential(credential)
    await rig.mind.refresh_credentials()
    denied = await read(rig, cid, headers=bearer(token), offset="-1", detail="transparent")
    assert denied.status == 403
    allowed = await read(rig, cid, headers=bearer(token), offset="-1")
    assert allowed.status == 200


async def test_an_unknown_conversation_is_404(rig: Rig) -> None:
    assert (await read(rig, "nope", offset="-1")).status == 404
    assert (await read(rig, "nope", offset="now")).status == 404


async def test_a_browser_reads_from_an_allowed_origin_and_sees_the_headers(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    origin = next(iter(rig.mind.config.origins(8000)))
    peer = await read(rig, cid, headers=bearer(rig.face_token, origin=origin), offset="-1")
    assert peer.headers["access-control-allow-origin"] == origin
    assert "Stream-Next-Offset" in peer.headers["access-control-expose-headers"]
    refused = await read(rig, cid, headers=bearer(rig.face_token, origin="https://evil.test"),
                         offset="-1")
    assert refused.status == 403
    preflight = await read(rig, cid, method="OPTIONS", headers={"origin": origin})
    assert preflight.status == 204


async def test_a_long_poll_whose_reader_went_away_frees_its_connection(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    peer = start(rig, cid, offset="now", live="long-poll")
    await peer.until(lambda p: len(rig.mind.connections) == 2)
    peer.disconnect()
    await peer.until(lambda p: len(rig.mind.connections) == 1)
    assert peer.task is not None
    await peer.task


async def test_a_long_history_comes_in_chunks_each_following_on_exactly(rig: Rig) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    request_id = await chat(rig, face, cid, "/repeat 2500 chunked")
    await rig.expect(face, lambda f: f["type"] == "face.event"
                     and f["payload"]["type"] == "chat.completed")
    seen: list[dict[str, Any]] = []
    offset, answers = "-1", 0
    while True:
        peer = await read(rig, cid, offset=offset)
        answers += 1
        seen += peer.json()
        offset = peer.headers["stream-next-offset"]
        if "stream-up-to-date" in peer.headers:
            break
        assert len(peer.text) <= 2 * CHUNK_BYTES  # a chunk, not the whole history
    assert answers >= 2
    assert_contiguous(seen, 1, seen[-1]["payload"]["seq"])
    assert delta_text(seen, request_id) == " ".join(["chunked"] * 2500)
    assert offset == offset_of_text(head_cursor(face, cid))


async def test_a_snapshot_cursor_read_as_an_offset_answers_offsets_in_their_one_form(
    rig: Rig,
) -> None:
    face = await rig.face()
    cid = await rig.conversation(face)
    await chat(rig, face, cid, "one")
    cursor = (await read_snapshot(rig, cid))["cursor"]
    peer = start(rig, cid, offset=cursor, live="sse")
    await peer.until(lambda p: "control" in p.text)
    control = json.loads(next(e for e in peer.events() if e.event == "control").data)
    assert control["streamNextOffset"] == offset_of_text(cursor)
    peer.disconnect()
