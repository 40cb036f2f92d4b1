"""The Agent seam: what to say, streamed as deltas.

An agent is an async iterator of :class:`Delta` for one user message. It
ends normally (the reply is the concatenation of the deltas), raises
:class:`AgentFailed` (the chat ends ``failed`` with its code), or is
cancelled (the chat ends ``cancelled`` or ``interrupted``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Delta:
    text: str


class AgentFailed(Exception):
    def __init__(self, message: str, code: str = "agent_failed") -> None:
        super().__init__(message)
        self.code = code


ToolCaller = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def _no_tools(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "tool": tool,
        "status": "failed",
        "success": False,
        "error_category": "no_tools",
        "error": "tools are not available here",
    }


@dataclass(frozen=True, slots=True)
class ChatInput:
    conversation_id: str
    request_id: str
    content: str
    # Runs a tool through the Mind (visibility, approval, a Hand) and returns
    # its full result: {tool, status, success, exit_code, stdout, stderr, …}.
    call_tool: ToolCaller = _no_tools


class Agent(Protocol):
    def reply(self, chat: ChatInput) -> AsyncIterator[Delta]: ...
