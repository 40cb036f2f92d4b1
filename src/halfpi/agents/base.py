"""The Agent seam: what to say, streamed as deltas.

An agent is an async iterator of :class:`Delta` for one user message. It
ends normally (the reply is the concatenation of the deltas), raises
:class:`AgentFailed` (the chat ends ``failed`` with its code), or is
cancelled (the chat ends ``cancelled`` or ``interrupted``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Delta:
    text: str


class AgentFailed(Exception):
    def __init__(self, message: str, code: str = "agent_failed") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ChatInput:
    conversation_id: str
    request_id: str
    content: str


class Agent(Protocol):
    def reply(self, chat: ChatInput) -> AsyncIterator[Delta]: ...
