"""LiveLists: the conversation and approval lists, as plain state (no I/O)."""

from __future__ import annotations

from halfpi.face.lists import LiveLists


def changed(cid: str, name: str | None, change: str = "renamed", at: float = 1.0) -> dict:
    conversation = {"id": cid, "name": name, "created_at": at}
    return {"conversation": conversation, "change": change, "event_seq": 9}


def test_news_during_a_conversation_read_wins_over_the_read() -> None:
    lists = LiveLists()
    lists.reading_conversations()
    assert lists.apply("face.conversation.changed", changed("c_1", "new")) == "c_1"
    lists.conversations_read([{"id": "c_1", "name": "old", "created_at": 1.0}])
    assert lists.conversations["c_1"]["name"] == "new"
    assert "event_seq" not in lists.conversations["c_1"]


def test_a_failed_read_keeps_what_was_known_and_stops_collecting_news() -> None:
    lists = LiveLists()
    lists.apply("face.conversation.changed", changed("c_1", "kept", "created"))
    lists.reading_conversations()
    lists.conversations_read(None)
    assert list(lists.conversations) == ["c_1"]
    lists.conversations_read([{"id": "c_2", "name": None, "created_at": 2.0}])
    assert [c["id"] for c in lists.conversation_list()] == ["c_2", "c_1"]


def test_the_approval_read_replaces_and_news_applies_on_top() -> None:
    lists = LiveLists()
    summary = {"conversation_id": "c_1", "approval_id": "a_1", "request_id": "q",
               "tool": "exec_command", "reason": "r", "expires_at": 5.0}
    lists.apply("face.approval.pending", {**summary, "approval_id": "a_0", "event_seq": 3})
    lists.approvals_read([summary])
    assert list(lists.approvals) == ["a_1"]
    settled = {"conversation_id": "c_1", "approval_id": "a_1", "status": "allowed"}
    assert lists.apply("face.approval.settled", settled) == "c_1"
    assert lists.approvals == {}


def test_other_messages_are_not_list_news() -> None:
    assert LiveLists().apply("face.event", {"conversation_id": "c_1"}) is None
