"""The scripted agent: deterministic, no network (DESIGN §1.1).

Its grammar, read from the user's message (see docs/agent.md):

============================  ============================================
message                       reply
============================  ============================================
anything else                 the message echoed, one delta per word
``/repeat N TEXT``            TEXT N times (joined by spaces), one delta each
``/sleep S``                  waits S seconds, then replies ``done``
``/fail``                     ends ``failed`` with ``error_code: agent_failed``
``/pace MS TEXT``             TEXT echoed word by word, MS ms between deltas
``/stamp N``                  N deltas, each the wall clock in ns (benchmarks)
============================  ============================================

The pace between deltas is ``delta_ms`` (``HALFPI_SCRIPTED_DELTA_MS``,
default 20 ms; 0 yields to the loop between deltas without waiting).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

from halfpi.agents.base import AgentFailed, ChatInput, Delta

_WORDS = re.compile(r"\s*\S+\s*$|\s*\S+")
MAX_REPEAT = 1_000_000
MAX_SLEEP_S = 3600.0


def words(text: str) -> list[str]:
    """Split into deltas whose concatenation is exactly ``text``."""
    parts = _WORDS.findall(text)
    return parts if "".join(parts) == text else [text]


class ScriptedAgent:
    def __init__(self, delta_ms: float = 20.0) -> None:
        self.delta_ms = delta_ms

    async def reply(self, chat: ChatInput) -> AsyncIterator[Delta]:
        content = chat.content
        command, _, rest = content.partition(" ")
        pace = self.delta_ms
        if command == "/fail":
            raise AgentFailed("the scripted agent was asked to fail")
        if command == "/sleep":
            seconds = _number(rest, 0.0, MAX_SLEEP_S)
            await asyncio.sleep(seconds)
            yield Delta("done")
            return
        if command == "/repeat":
            count_text, _, text = rest.partition(" ")
            count = int(_number(count_text, 0, MAX_REPEAT))
            for index in range(count):
                yield Delta(text if index == 0 else " " + text)
                await _pause(pace)
            return
        if command == "/stamp":
            count = int(_number(rest, 0, MAX_REPEAT))
            for index in range(count):
                yield Delta(("" if index == 0 else " ") + str(time.time_ns()))
                await _pause(pace)
            return
        if command == "/pace":
            pace_text, _, content = rest.partition(" ")
            pace = _number(pace_text, 0.0, 60_000.0)
        for part in words(content):
            yield Delta(part)
            await _pause(pace)


def _number(text: str, low: float, high: float) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise AgentFailed(f"not a number: {text.strip()[:40]!r}", "agent_bad_input") from None
    if not low <= value <= high:
        raise AgentFailed(f"{value} is outside [{low}, {high}]", "agent_bad_input")
    return value


async def _pause(ms: float) -> None:
    await asyncio.sleep(ms / 1000.0)
