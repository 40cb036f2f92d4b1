"""Conversations stay live for every Face: created, titled and renamed.

``face.conversation.changed`` is session-level news to every welcomed Face
that may read conversations; a rename is also a ``conversation.changed``
event in the conversation's own log; an unnamed conversation is titled from
its first user message when that chat is admitted.
"""

from __future__ import annotations

from typing import Any

from tests.support.cli import face_add
from tests.support.client import FaceClient, connect_new_credential
from tests.support.frames import event, events_of
from tests.support.mind import LocalMind


def changed(conversation_id: str, change: str | None = None) -> Any:
    def match(frame: dict[str, Any]) -> bool:
        if frame["type"] != "face.conversation.changed":
            return False
        payload = frame["payload"]
        return payload["conversation"]["id"] == conversation_id and (
            change is None or payload["change"] == change
        )

    return match


async def listed(face: FaceClient) -> dict[str, Any]:
    request_id = await face.command("face.conversation.list")
    reply = await face.reply(request_id)
    return {c["id"]: c for c in reply["payload"]["data"]["conversations"]}


async def test_a_created_conversation_is_announced_to_every_other_face(lmind: LocalMind) -> None:
    creator = await FaceClient.connect(lmind.url, lmind.token)
    other = await FaceClient.connect(lmind.url, lmind.token)
    cid = await creator.create_conversation("plans")
    news = await other.expect(changed(cid))
    assert news["payload"]["change"] == "created"
    assert news["payload"]["conversation"]["name"] == "plans"
    assert isinstance(news["payload"]["conversation"]["created_at"], float)
    assert "seq" not in news["payload"]  # session-level: in no conversation's log
    assert isinstance(news["payload"]["event_seq"], int)
    await creator.expect(changed(cid, "created"))  # the creator hears it too
    await creator.close()
    await other.close()


async def test_an_observer_hears_of_new_conversations_but_may_not_rename(
    lmind: LocalMind,
) -> None:
    added = await face_add(lmind.config.home, "watcher", "--profile", "observer")
    watcher = await connect_new_credential(lmind.url, added.token)
    owner = await FaceClient.connect(lmind.url, lmind.token)
    cid = await owner.create_conversation("plans")
    await watcher.expect(changed(cid, "created"))
    request_id = await watcher.command(
        "face.conversation.rename", conversation_id=cid, name="mine now"
    )
    refused = await watcher.reply(request_id)
    assert refused["type"] == "face.error"
    assert refused["payload"]["code"] == "forbidden"
    assert (await listed(owner))[cid]["name"] == "plans"
    await watcher.close()
    await owner.close()


async def test_rename_is_announced_logged_and_listed(lmind: LocalMind) -> None:
    renamer = await FaceClient.connect(lmind.url, lmind.token)
    subscriber = await FaceClient.connect(lmind.url, lmind.token)
    cid = await renamer.create_conversation("draft")
    await subscriber.subscribe(cid)
    request_id = await renamer.command(
        "face.conversation.rename", conversation_id=cid, name="  trip\tto Lisbon \x1b "
    )
    accepted = await renamer.reply(request_id, ("face.accepted", "face.error"))
    assert accepted["payload"]["operation"] == "conversation.rename"
    result = await renamer.reply(request_id)
    assert result["payload"]["data"] == {"conversation_id": cid, "name": "trip to Lisbon"}
    news = await subscriber.expect(changed(cid, "renamed"))
    assert news["payload"]["conversation"]["name"] == "trip to Lisbon"
    logged = await subscriber.expect(event("conversation.changed", change="renamed"))
    assert logged["payload"]["data"]["conversation"]["name"] == "trip to Lisbon"
    assert (await listed(renamer))[cid]["name"] == "trip to Lisbon"
    snapshot_id = await renamer.command("face.conversation.snapshot", conversation_id=cid)
    snapshot = await renamer.reply(snapshot_id)
    assert snapshot["payload"]["conversation"]["name"] == "trip to Lisbon"
    await renamer.close()
    await subscriber.close()


async def test_rename_is_replay_safe_and_a_different_name_conflicts(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    assert "face.conversation.rename" in face.welcome["payload"]["replay_safe"]  # type: ignore[index]
    cid = await face.create_conversation("draft")
    await face.subscribe(cid)
    first = await face.command(
        "face.conversation.rename", "rename-1", conversation_id=cid, name="one"
    )
    assert (await face.reply(first))["payload"]["status"] == "succeeded"
    again = await face.command(
        "face.conversation.rename", "rename-1", conversation_id=cid, name="one"
    )
    replayed = await face.reply(again)
    assert replayed["payload"]["data"]["name"] == "one"
    other = await face.command(
        "face.conversation.rename", "rename-1", conversation_id=cid, name="two"
    )
    conflict = await face.reply(other)
    assert conflict["payload"]["code"] == "request_conflict"
    # One rename happened: one event in the log.
    ping = await face.command("face.ping")
    await face.expect(lambda f: f["type"] == "face.pong" and f["payload"]["request_id"] == ping)
    assert len(events_of(face.seen, "conversation.changed")) == 1
    assert (await listed(face))[cid]["name"] == "one"
    await face.close()


async def test_rename_refuses_an_empty_name_and_an_unknown_conversation(
    lmind: LocalMind,
) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation("draft")
    blank = await face.command("face.conversation.rename", conversation_id=cid, name=" \x07 ")
    refused = await face.reply(blank)
    assert (refused["payload"]["code"], refused["payload"]["field"]) == ("invalid_request", "name")
    unknown = await face.command("face.conversation.rename", conversation_id="c_nope", name="x")
    assert (await face.reply(unknown))["payload"]["code"] == "conversation_not_found"
    await face.close()


async def test_an_unnamed_conversation_is_titled_from_its_first_message(
    lmind: LocalMind,
) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    other = await FaceClient.connect(lmind.url, lmind.token)
    request_id = await face.command("face.conversation.create")
    cid = (await face.reply(request_id))["payload"]["data"]["conversation_id"]
    await face.subscribe(cid)
    message = (
        "\n  Plan the trip to Lisbon: flights, a hotel near Alfama and a day in Sintra\nthanks"
    )
    result = await face.chat_to_end(cid, message)
    assert result["payload"]["status"] == "succeeded"
    title = "Plan the trip to Lisbon: flights, a hotel near Alfama and a…"
    assert len(title) <= 60
    news = await other.expect(changed(cid, "renamed"))
    assert news["payload"]["conversation"]["name"] == title
    logged = await face.expect(event("conversation.changed"))
    assert logged["payload"]["data"]["conversation"]["name"] == title
    assert (await listed(face))[cid]["name"] == title
    # Only the first message titles it.
    await face.chat_to_end(cid, "something else entirely")
    assert (await listed(face))[cid]["name"] == title
    assert len(events_of(face.seen, "conversation.changed")) == 1
    await face.close()
    await other.close()


async def test_a_named_or_renamed_conversation_is_never_retitled(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    named = await face.create_conversation("kept")
    await face.chat_to_end(named, "hello")
    request_id = await face.command("face.conversation.create")
    unnamed = (await face.reply(request_id))["payload"]["data"]["conversation_id"]
    rename = await face.command("face.conversation.rename", conversation_id=unnamed, name="mine")
    await face.reply(rename)
    await face.chat_to_end(unnamed, "hello")
    names = await listed(face)
    assert names[named]["name"] == "kept"
    assert names[unnamed]["name"] == "mine"
    await face.close()
