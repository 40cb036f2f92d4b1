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


async def test_a_summary_admission_reply_shows_neither_output_nor_error_details() -> None:
    """An observer reads the reply's text: for a summary admission it holds
    what the structured fields show, no more (DESIGN §6: a summary admission
    stores no output bodies)."""
    text = await reply_to(
        '/tool exec_command {"command": "cat notes"}',
        {"status": "succeeded", "success": True, "exit_code": 0, "stdout": "the notes\n",
         "output_bytes": 10, "detail_mode": "summary"},
    )
    assert text == "exec_command succeeded (exit 0; output not shown: summary detail)"
    text = await reply_to(
        '/tool read_file {"path": "/home/me/plans.txt"}',
        {"status": "failed", "success": False, "error_category": "not_found",
         "error": "no such file: /home/me/plans.txt", "detail_mode": "summary"},
    )
    assert text == "read_file failed: not_found"


async def test_a_transparent_admission_reply_echoes_the_output() -> None:
    text = await reply_to(
        '/tool exec_command {"command": "cat notes"}',
        {"status": "succeeded", "success": True, "exit_code": 0, "stdout": "the notes\n",
         "detail_mode": "transparent"},
    )
    assert text == "exec_command succeeded (exit 0)\nthe notes\n"


async def test_a_summary_admission_reply_never_falls_back_to_an_error_message() -> None:
    """A Hand may fail a call with a message and no category: for a summary
    admission the reply still says no more than the outcome."""
    text = await reply_to(
        '/tool read_file {"path": "/home/me/plans.txt"}',
        {"status": "failed", "success": False, "error_category": None,
         "error": "cannot read /home/me/plans.txt", "detail_mode": "summary"},
    )
    assert text == "read_file failed"
