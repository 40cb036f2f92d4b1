"""The SDK against a real Mind hands back the Mind's own typed values.

What the Mind encodes from ``core/events.py`` the SDK decodes into the same
structs: the welcome, a command's acceptance, its result with its typed
``data``, a snapshot, a refusal, the live lists — no dict to pick apart.
"""

from __future__ import annotations

import pytest

from halfpi.core.events import (
    Accepted,
    ChatOutcome,
    ConversationInfo,
    HandPage,
    MessageEntry,
    Snapshot,
    Welcome,
)
from halfpi.face.client import FaceClient, Result
from halfpi.face.errors import CommandError
from tests.support.mind import LocalMind

TIMEOUT = 10.0


async def test_the_welcome_is_the_minds_struct(lmind: LocalMind) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        welcome = client.welcome
        assert isinstance(welcome, Welcome)
        assert "face.chat" in welcome.replay_safe
        assert welcome.heartbeat_s == client.heartbeat_s
        assert welcome.limits.max_frame_bytes > 0


async def test_a_chat_is_accepted_and_ends_with_typed_values(lmind: LocalMind) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        cid = await client.create_conversation("typed")
        handle = await client.chat(cid, "hello, typed")
        accepted = await handle.accepted()
        assert isinstance(accepted, Accepted)
        assert (accepted.operation, accepted.conversation_id) == ("chat", cid)
        result = await handle.result()
        assert isinstance(result, Result) and result.ok
        assert isinstance(result.data, ChatOutcome)
        assert result.data.conversation_id == cid
        assert result.data.run_id == accepted.run_id


async def test_a_snapshot_is_the_minds_snapshot(lmind: LocalMind) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        cid = await client.create_conversation("snap")
        await client.ask(cid, "remember me")
        snap = await client.snapshot(cid)
        assert isinstance(snap, Snapshot)
        assert snap.conversation.id == cid and snap.conversation.name == "snap"
        assert all(isinstance(m, MessageEntry) for m in snap.messages)
        assert [(m.role, m.content) for m in snap.messages] == [
            ("user", "remember me"), ("assistant", "remember me")]


async def test_the_conversations_read_and_live_are_typed_and_newest_first(
    lmind: LocalMind,
) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        first = await client.create_conversation("first")
        second = await client.create_conversation("second")
        read = await client.read_conversations(limit=10)
        assert all(isinstance(c, ConversationInfo) for c in read)
        assert [c.id for c in read][:2] == [second, first]
        await client.wait_for(lambda: second in client.conversations, TIMEOUT)
        assert list(client.conversations)[:2] == [second, first]
        assert client.conversations[first].name == "first"


async def test_a_renamed_conversation_returns_the_stored_name(lmind: LocalMind) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        cid = await client.create_conversation("old")
        assert await client.rename_conversation(cid, "  new  ") == "new"


async def test_any_command_by_name_answers_with_its_typed_data(lmind: LocalMind) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        result = await client.request("face.hand.list")
        assert isinstance(result, Result) and isinstance(result.data, HandPage)


async def test_a_refusal_carries_the_minds_error(lmind: LocalMind) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        with pytest.raises(CommandError) as info:
            await client.snapshot("c_missing")
        assert info.value.code == "conversation_not_found"
        assert info.value.error.code == info.value.code and not info.value.retryable


async def test_a_command_the_mind_would_refuse_is_refused_before_it_is_sent(
    lmind: LocalMind,
) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        with pytest.raises(CommandError) as info:
            await client.request("face.chat", content="no conversation named")
        assert (info.value.code, info.value.field) == ("invalid_request", "conversation_id")
        assert "face.chat" not in [t for _, t, _ in client.sent_log]
