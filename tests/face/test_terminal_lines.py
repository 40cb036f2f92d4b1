"""The words of the terminal face's bar and connection line (plain functions)."""

from __future__ import annotations

from halfpi.core.events import ApprovalPending, ApprovalRequested, ConversationInfo
from halfpi.face.results import Status
from halfpi.face.terminal_lines import NEWS_S, bar_lines, connection_line, waiting_here

URL = "ws://mind.test/v1/face"


def test_how_the_connection_came_back_is_news_then_it_says_live() -> None:
    resynced = Status("resynced", url=URL)
    assert connection_line(resynced, 10.0, 10.0, None) == f"● resynced from snapshot · {URL}"
    assert connection_line(resynced, 10.0 + NEWS_S, 10.0, None) == f"● live · {URL}"


def test_the_open_conversations_approval_counts_down_until_decided_here() -> None:
    pending = {"a1": ApprovalRequested(approval_id="a1", tool="exec_command", expires_at=1120.0)}
    assert waiting_here(pending, set(), 1000.0) == (
        "⚠ approval waiting here: exec_command (2:00 left) — ctrl+a allow once · ctrl+d deny once"
    )
    assert waiting_here(pending, {"a1"}, 1000.0) == (
        "⏳ your decision on exec_command is on its way to the Mind"
    )


def test_approvals_elsewhere_name_their_conversation_and_time_left() -> None:
    elsewhere = [ApprovalPending(conversation_id="c2", approval_id="a2", tool="read_file",
                                 expires_at=1061.0)]
    conversations = {"c2": ConversationInfo(id="c2", name="deploy")}
    lines = bar_lines(None, set(), elsewhere, conversations, 1000.0, reachable=False)
    assert lines == [
        "⚠ 1 approval waiting in other conversations: read_file in “deploy” (1:01 left)"
        " — ctrl+g go there",
        "(as last known: the Mind is unreachable; it re-reads them when back)",
    ]
