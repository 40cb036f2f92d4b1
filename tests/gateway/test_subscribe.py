"""``face.subscribe``: what ``transient_types`` and a cursor mean (docs/protocol.md §6)."""

from __future__ import annotations

from tests.support.client import FaceClient
from tests.support.mind import LocalMind


async def test_subscribe_refuses_an_unknown_transient_type(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    # A plausible slip (the event name without its "face." prefix) would
    # otherwise be accepted and silently deliver nothing.
    error = await face.subscribe(cid, transient_types=["chat.delta"])
    assert error["type"] == "face.error", error
    assert error["payload"]["code"] == "invalid_request"
    assert error["payload"]["field"] == "transient_types"
    assert "chat.delta" in error["payload"]["message"]
    assert "face.chat.delta" in error["payload"]["message"]  # what it could have said
    # Nothing was installed: a chat shows no event on this connection.
    other = await FaceClient.connect(lmind.url, lmind.token)
    await other.chat_to_end(cid, "hello there")
    await face.command("face.ping")
    await face.expect(lambda f: f["type"] == "face.pong")
    assert face.events(cid) == []
    await face.close()
    await other.close()


async def test_transient_types_deliver_the_types_named_and_no_other(lmind: LocalMind) -> None:
    quiet = await FaceClient.connect(lmind.url, lmind.token)
    deltas = await FaceClient.connect(lmind.url, lmind.token)
    everything = await FaceClient.connect(lmind.url, lmind.token)
    cid = await quiet.create_conversation()
    assert (await quiet.subscribe(cid, transient_types=[]))["type"] == "face.accepted"
    assert (await deltas.subscribe(cid, transient_types=["face.chat.delta"]))["type"] == (
        "face.accepted")
    assert (await everything.subscribe(cid))["type"] == "face.accepted"  # omitted: all
    await quiet.chat_to_end(cid, "one two three")
    for face in (quiet, deltas, everything):
        await face.expect(lambda f: f["type"] == "face.event"
                          and f["payload"]["type"] == "chat.completed")
    assert [f for f in quiet.events(cid) if f["type"] == "face.chat.delta"] == []
    for face in (deltas, everything):
        texts = [f["payload"]["text"] for f in face.events(cid) if f["type"] == "face.chat.delta"]
        assert "".join(texts) == "one two three"
    for face in (quiet, deltas, everything):
        await face.close()


async def test_a_delta_cursor_resumes_exactly(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    await face.chat_to_end(cid, "alpha beta gamma delta")
    await face.expect(lambda f: f["type"] == "face.event"
                      and f["payload"]["type"] == "chat.completed")
    seen = face.events(cid)
    second_delta = [f for f in seen if f["type"] == "face.chat.delta"][1]
    mark = second_delta["payload"]["seq"]
    after = [f["payload"]["seq"] for f in seen if f["payload"]["seq"] > mark]
    again = await FaceClient.connect(lmind.url, lmind.token)
    accepted = await again.subscribe(cid, since=second_delta["payload"]["cursor"])
    assert accepted["payload"]["replay"] == "exact"
    await again.expect(lambda f: f["type"] == "face.event"
                       and f["payload"]["type"] == "chat.completed")
    assert [f["payload"]["seq"] for f in again.events(cid)] == after
    await face.close()
    await again.close()


async def test_an_empty_conversation_is_at_seq_0_and_resumes_from_there(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    request_id = await face.command("face.conversation.snapshot", conversation_id=cid)
    snap = (await face.reply(request_id))["payload"]
    assert snap["cursor"] == f"{snap['epoch']}.0"
    accepted = await face.subscribe(cid, since=snap["cursor"])
    assert accepted["payload"]["replay"] == "exact"
    await face.chat_to_end(cid, "first")
    first = await face.expect(lambda f: f["type"] == "face.event")
    assert first["payload"]["seq"] == 1 and first["payload"]["type"] == "chat.message"
    await face.close()
