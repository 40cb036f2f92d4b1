"""Stream tickets and the reconnect grant (docs/protocol.md §17.4), and
CORS for browsers, without sockets on a fake clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.core.scopes import scopes_for
from halfpi.gateway.asgi import AsgiGateway
from halfpi.mind.auth import make_credential
from tests.support.rig import Rig, fake_time_mind
from tests.support.sse import HttpPeer, data_events
from tests.support.stream import assert_contiguous, positioned

PAGE = "https://faces.example"


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with fake_time_mind(tmp_path / "home", allowed_origins=(PAGE,)) as r:
        yield r


async def call(rig: Rig, method: str, path: str, **kw: Any) -> HttpPeer:
    return await HttpPeer(method, path, **kw).start(AsgiGateway(rig.mind)).answered()


async def ticket_for(rig: Rig, conversations: list[str], token: str | None = None,
                     **more: Any) -> dict[str, Any]:
    body = json.dumps({"conversations": conversations, **more}).encode()
    peer = await call(rig, "POST", "/v1/stream-tickets",
                      headers={"authorization": f"Bearer {token or rig.face_token}"}, body=body)
    await peer.until(lambda p: p.ended)
    return {"status": peer.status, **peer.json()}


async def open_stream(rig: Rig, conversations: list[str], *, last: str | None = None,
                      **query: str) -> HttpPeer:
    headers = {"origin": PAGE}
    if last is not None:
        headers["last-event-id"] = last
    return await call(rig, "GET", "/v1/events", headers=headers,
                      query={"conversations": ",".join(conversations), **query})


def accepted(peer: HttpPeer) -> bool:
    return any(f["type"] == "face.accepted" for f in peer.frames())


async def test_a_ticket_opens_one_stream_and_is_refused_the_second_time(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    issued = await ticket_for(rig, [a])
    assert issued["status"] == 200 and issued["expires_in"] == 60
    assert issued["ticket"].startswith("hps_")
    first = await open_stream(rig, [a], ticket=issued["ticket"])
    await first.until(accepted)
    assert first.status == 200
    again = await open_stream(rig, [a], ticket=issued["ticket"])
    assert again.status == 401
    assert again.json()["error"]["code"] == "unauthorized"


async def test_a_ticket_expires_after_sixty_seconds(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    issued = await ticket_for(rig, [a])
    rig.clock.now += 60
    late = await open_stream(rig, [a], ticket=issued["ticket"])
    assert late.status == 401


@pytest.mark.parametrize("mismatch", ["conversations", "detail"])
async def test_a_ticket_is_bound_to_its_conversations_and_detail_mode(
    rig: Rig, mismatch: str
) -> None:
    face = await rig.face()
    a, b = await rig.conversation(face), await rig.conversation(face)
    issued = await ticket_for(rig, [a], detail_mode="summary")
    if mismatch == "conversations":
        peer = await open_stream(rig, [a, b], ticket=issued["ticket"])
    else:
        peer = await open_stream(rig, [a], ticket=issued["ticket"], detail="transparent")
    assert peer.status == 401


async def test_an_observer_gets_no_transparent_ticket(rig: Rig) -> None:
    credential, token = make_credential("face", "watcher", "observer", scopes_for("observer"),
                                        rig.mind.now())
    await rig.mind.store.add_credential(credential)
    await rig.mind.refresh_credentials()
    face = await rig.face()
    a = await rig.conversation(face)
    refused = await ticket_for(rig, [a], token, detail_mode="transparent")
    assert refused["status"] == 403 and refused["error"]["code"] == "forbidden"
    plain = await ticket_for(rig, [a], token)
    assert plain["detail_mode"] == "summary"


async def test_a_ticket_needs_a_bearer_and_a_well_formed_body(rig: Rig) -> None:
    anonymous = await call(rig, "POST", "/v1/stream-tickets", body=b'{"conversations":["c"]}')
    assert anonymous.status == 401
    bad = await call(rig, "POST", "/v1/stream-tickets",
                     headers={"authorization": f"Bearer {rig.face_token}"}, body=b'{"nope":1}')
    assert bad.status == 400 and bad.json()["error"]["code"] == "invalid_request"


async def chat_to_end(rig: Rig, peer: HttpPeer, face: Any, cid: str, content: str) -> str:
    request_id = await rig.command(face, "face.chat", conversation_id=cid, content=content)
    await peer.until(lambda p: any(
        f["type"] == "face.event" and f["payload"]["type"] == "chat.completed"
        and f["payload"]["data"]["request_id"] == request_id for f in p.frames()))
    return request_id


async def test_an_eventsource_reconnects_with_its_spent_ticket_through_the_grant(
    rig: Rig,
) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    ticket = (await ticket_for(rig, [a]))["ticket"]
    first = await open_stream(rig, [a], ticket=ticket)
    await first.until(accepted)
    await chat_to_end(rig, first, face, a, "/repeat 10 tick")
    shown = data_events(first.events())
    cut = len(shown) // 2
    first.disconnect()
    # The same URL (the spent ticket in it) and the id of the last event read.
    again = await open_stream(rig, [a], ticket=ticket, last=shown[cut].id)
    await again.until(accepted)
    assert again.status == 200
    assert again.headers["access-control-allow-origin"] == PAGE
    assert again.frames()[0]["payload"]["replay"] == "exact"
    await again.until(lambda p: len(positioned(p.frames())) >= len(positioned(
        [e.frame for e in shown[cut + 1:]])))
    seen = positioned([e.frame for e in shown[: cut + 1]]) + positioned(again.frames())
    assert_contiguous(seen, seen[0]["payload"]["seq"], positioned(
        [e.frame for e in shown])[-1]["payload"]["seq"])


async def test_a_replayed_ticket_with_no_valid_grant_is_refused(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    ticket = (await ticket_for(rig, [a]))["ticket"]
    first = await open_stream(rig, [a], ticket=ticket)
    await first.until(accepted)
    # A bearer stream's token carries no grant: it authorises nothing.
    bearer = await call(rig, "GET", "/v1/events", query={"conversations": a},
                        headers={"authorization": f"Bearer {rig.face_token}"})
    await bearer.until(accepted)
    plain = data_events(bearer.events())[-1].id
    assert (await open_stream(rig, [a], ticket=ticket, last=plain)).status == 401
    assert (await open_stream(rig, [a], ticket=ticket, last="forged")).status == 401
    granted = data_events(first.events())[-1].id
    assert granted is not None
    tampered = granted[:-3] + ("AAA" if not granted.endswith("AAA") else "BBB")
    assert (await open_stream(rig, [a], ticket=ticket, last=tampered)).status == 401


async def test_a_grant_expires_unless_the_stream_renews_it(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home", heartbeat_s=15.0, dead_after_s=45.0,
                              allowed_origins=(PAGE,)) as rig:
        await grant_renewed_by_pings(rig)


async def grant_renewed_by_pings(rig: Rig) -> None:
    face = await rig.face()
    a = await rig.conversation(face)
    ttl = rig.mind.tickets.grant_ttl_s
    quiet = await open_stream(rig, [a], ticket=(await ticket_for(rig, [a]))["ticket"])
    lively = await open_stream(rig, [a], ticket=(await ticket_for(rig, [a]))["ticket"])
    await quiet.until(accepted)
    await lively.until(accepted)
    old = data_events(quiet.events())[-1].id
    quiet.disconnect()
    await quiet.until(lambda p: p.task is not None and p.task.done())
    # The open stream's pings renew its grant in an id: of their own.
    rig.clock.now += ttl * 0.75
    rig.mind.tick_connections(rig.clock.now)
    await lively.until(lambda p: any(e.id and "ping" in e.comments for e in p.events()))
    renewed = [e.id for e in lively.events() if e.id and "ping" in e.comments][-1]
    rig.clock.now += ttl * 0.5
    assert (await open_stream(rig, [a], last=old)).status == 401
    back = await open_stream(rig, [a], last=renewed)
    await back.until(accepted)
    assert back.status == 200


async def test_I8_a_grant_dies_with_its_credential(rig: Rig) -> None:
    credential, token = make_credential("face", "tablet", "operator", scopes_for("operator"),
                                        rig.mind.now())
    await rig.mind.store.add_credential(credential)
    await rig.mind.refresh_credentials()
    face = await rig.face()
    a = await rig.conversation(face)
    ticket = (await ticket_for(rig, [a], token))["ticket"]
    first = await open_stream(rig, [a], ticket=ticket)
    await first.until(accepted)
    last = data_events(first.events())[-1].id
    await rig.mind.store.revoke_credential("face", "tablet", rig.mind.now())
    await rig.mind.refresh_credentials()
    await first.until(lambda p: p.ended)
    assert (await open_stream(rig, [a], ticket=ticket, last=last)).status == 401


async def test_a_preflight_from_an_allowed_origin_is_answered(rig: Rig) -> None:
    for path in ("/v1/stream-tickets", "/v1/events"):
        ok = await call(rig, "OPTIONS", path, headers={
            "origin": PAGE, "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type"})
        assert ok.status == 204
        assert ok.headers["access-control-allow-origin"] == PAGE
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        assert "last-event-id" in ok.headers["access-control-allow-headers"].lower()


async def test_a_foreign_origin_is_refused_preflight_ticket_and_stream(rig: Rig) -> None:
    evil = {"origin": "https://evil.example"}
    assert (await call(rig, "OPTIONS", "/v1/events", headers=evil)).status == 403
    ask = await call(rig, "POST", "/v1/stream-tickets", body=b'{"conversations":["c"]}',
                     headers={**evil, "authorization": f"Bearer {rig.face_token}"})
    assert ask.status == 403
    face = await rig.face()
    a = await rig.conversation(face)
    ticket = (await ticket_for(rig, [a]))["ticket"]
    stream = await call(rig, "GET", "/v1/events", headers=evil,
                        query={"conversations": a, "ticket": ticket})
    assert stream.status == 403
