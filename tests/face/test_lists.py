"""LiveLists: the conversation and approval lists, as plain state (no I/O)."""

from __future__ import annotations

from halfpi.core.events import (
    ApprovalPending,
    ApprovalSettled,
    ConversationInfo,
    ConversationNews,
)
from halfpi.face.lists import LiveLists


def changed(cid: str, name: str | None, change: str = "renamed", at: float = 1.0
            ) -> ConversationNews:
    return ConversationNews(conversation=ConversationInfo(id=cid, name=name, created_at=at),
                            change=change)


def test_news_during_a_conversation_read_wins_over_the_read() -> None:
    lists = LiveLists()
    lists.reading_conversations()
    assert lists.apply(changed("c_1", "new")) == "c_1"
    lists.conversations_read([ConversationInfo(id="c_1", name="old", created_at=1.0)])
    assert lists.conversations["c_1"].name == "new"


def test_a_failed_read_keeps_what_was_known_and_stops_collecting_news() -> None:
    lists = LiveLists()
    lists.apply(changed("c_1", "kept", "created"))
    lists.reading_conversations()
    lists.conversations_read(None)
    assert list(lists.conversations) == ["c_1"]
    lists.conversations_read([ConversationInfo(id="c_2", name=None, created_at=2.0)])
    assert list(lists.conversations) == ["c_2", "c_1"]


def test_the_conversations_are_kept_newest_first_whatever_order_they_come_in() -> None:
    lists = LiveLists()
    lists.conversations_read([ConversationInfo(id=f"c_{i}", created_at=float(i))
                              for i in (2, 9, 5)])
    lists.apply(changed("c_7", "late", "created", at=7.0))
    assert list(lists.conversations) == ["c_9", "c_7", "c_5", "c_2"]


def test_news_that_does_not_say_a_name_keeps_the_known_one() -> None:
    lists = LiveLists()
    lists.apply(changed("c_1", "plans", "created"))
    lists.apply(ConversationNews(conversation=ConversationInfo(id="c_1", created_at=1.0),
                                 change="renamed"))
    assert lists.conversations["c_1"].name == "plans"


def test_the_approval_read_replaces_and_news_applies_on_top() -> None:
    lists = LiveLists()
    summary = ApprovalPending(conversation_id="c_1", approval_id="a_1", request_id="q",
                              tool="exec_command", reason="r", expires_at=5.0)
    lists.apply(ApprovalPending(conversation_id="c_1", approval_id="a_0"))
    lists.approvals_read([summary])
    assert list(lists.approvals) == ["a_1"]
    settled = ApprovalSettled(conversation_id="c_1", approval_id="a_1", status="allowed")
    assert lists.apply(settled) == "c_1"
    assert lists.approvals == {}
