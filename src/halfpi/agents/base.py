"""The Agent seam: what to say, streamed as deltas.

An agent is an async iterator over one user message: it yields
:class:`Delta` (text for the reply) and, when its provider reports them,
:class:`Usage` (tokens a model request used). It ends normally (the reply is
the concatenation of the deltas), raises :class:`AgentFailed` (the chat ends
``failed`` with its code), or is cancelled (the chat ends ``cancelled`` or
``interrupted``).

What an agent gets (:class:`ChatInput`) comes from the Mind: the message,
the conversation's history read from the Store on demand, the tools of the
conversation's Hand as JSON-Schema specs, and ``call_tool``, the Mind's own
tool path (visibility, policy, approvals, a Hand). An agent never runs a
tool itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

# The ``error_code`` of a chat whose agent failed (docs/protocol.md §12).
AGENT_FAILED = "agent_failed"


@dataclass(frozen=True, slots=True)
class Delta:
    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens used, as the provider reported them; ``requests`` counts the
    model requests they add up over (one per step of the loop)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    requests: int = 1

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
            self.requests + other.requests,
        )


class AgentFailed(Exception):
    def __init__(self, message: str, code: str = AGENT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of the conversation's history: the user's message, or a
    reply with its end ``status`` (a failed or interrupted reply keeps the
    text that was shown)."""

    role: str  # "user" | "assistant"
    content: str
    status: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as a model is offered it: its name, what it does, and its
    arguments as a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


ToolCaller = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
HistoryReader = Callable[[], Awaitable[list[Turn]]]


async def _no_tools(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "tool": tool,
        "status": "failed",
        "success": False,
        "error_category": "no_tools",
        "error": "tools are not available here",
    }


async def _no_tasks(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "tool": tool,
        "status": "failed",
        "error_category": "no_tasks",
        "error": "background tasks are not available here",
    }


async def _no_history() -> list[Turn]:
    return []


@dataclass(frozen=True, slots=True)
class ChatInput:
    conversation_id: str
    request_id: str
    content: str
    # Runs a tool through the Mind (visibility, approval, a Hand) and returns
    # its full result: {tool, status, success, exit_code, stdout, stderr, …}.
    call_tool: ToolCaller = _no_tools
    # The conversation's messages before this one, oldest first, read from the
    # Store when asked (an agent that does not need them costs no read).
    history: HistoryReader = _no_history
    # The tools of the conversation's Hand (none when no Hand is connected).
    tools: tuple[ToolSpec, ...] = ()
    # Starts a background task on a Hand (DESIGN §8): admitted through the
    # Mind's outbox with this chat; returns {status: accepted, task_id, …}
    # at once, or {status: failed, error_category, error}.
    start_task: ToolCaller = _no_tasks


Output = Delta | Usage


class Agent(Protocol):
    def reply(self, chat: ChatInput) -> AsyncIterator[Output]: ...
