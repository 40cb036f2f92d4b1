"""The view's tool card shows the status the Mind reports, live or from a snapshot."""

from __future__ import annotations

from typing import Any

import msgspec

from halfpi.core.events import Snapshot
from halfpi.face.view import ConversationView


def snapshot(cursor: str, **fields: Any) -> Snapshot:
    return msgspec.convert({"conversation": {"id": "c_1"}, "cursor": cursor, "epoch": "e",
                            **fields}, Snapshot)


def test_view_tool_card_keeps_the_status_the_mind_reports() -> None:
    live = ConversationView("c_1")
    live.apply_snapshot(snapshot("e.0"))
    called = {"request_id": "q1", "tool_call_id": "t_1", "tool": "exec_command"}
    live.apply(
        "face.event",
        {
            "conversation_id": "c_1",
            "seq": 1,
            "cursor": "e.1",
            "type": "chat.tool_called",
            "data": called,
        },
    )
    live.apply(
        "face.event",
        {
            "conversation_id": "c_1",
            "seq": 2,
            "cursor": "e.2",
            "type": "chat.tool_completed",
            "data": {**called, "status": "denied", "success": False, "error_category": "denied"},
        },
    )
    resynced = ConversationView("c_1")
    resynced.apply_snapshot(
        snapshot("e.2", tool_history=[{**called, "status": "denied", "success": False}])
    )
    assert live.tool_cards["t_1"].status == resynced.tool_cards["t_1"].status
