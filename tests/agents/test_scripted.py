"""The scripted agent's report of a tool call says what happened, once."""

from __future__ import annotations

from typing import Any

import pytest

from halfpi.agents.base import ChatInput
from halfpi.agents.scripted import ScriptedAgent


async def reply_to(content: str, result: dict[str, Any]) -> str:
    async def call_tool(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"tool": tool, **result}

    agent = ScriptedAgent(delta_ms=0)
    chat = ChatInput("c_1", "q_1", content, call_tool)
    return "".join([d.text async for d in agent.reply(chat)])


@pytest.mark.parametrize("status", ["denied", "expired", "cancelled"])
async def test_a_refused_tool_is_reported_without_repeating_its_status(status: str) -> None:
    text = await reply_to(
        '/tool exec_command {"argv": ["true"]}',
        {"status": status, "success": False, "error_category": status},
    )
    assert text == f"exec_command {status}"


async def test_a_failed_tool_says_why() -> None:
    text = await reply_to(
        "/tool read_file {}",
        {"status": "failed", "success": False, "error_category": "hand_unavailable",
         "error": "no Hand is connected"},
    )
    assert text == "read_file failed: no Hand is connected"
