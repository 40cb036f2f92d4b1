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
``/tool NAME JSON``           calls tool NAME with JSON args, then reports the result
``/task NAME JSON``           starts tool NAME as a background task, replies at once
============================  ============================================

The pace between deltas is ``delta_ms`` (``HALFPI_SCRIPTED_DELTA_MS``,
default 20 ms; 0 yields to the loop between deltas without waiting).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator

from halfpi.agents.base import AgentFailed, ChatInput, Delta
from halfpi.config import Config

_WORDS = re.compile(r"\s*\S+\s*$|\s*\S+")
MAX_REPEAT = 1_000_000
MAX_SLEEP_S = 3600.0
MAX_TOOL_ECHO = 4096


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
        if command == "/tool":
            async for delta in _tool(chat, rest, pace):
                yield delta
            return
        if command == "/task":
            yield Delta(await _task(chat, rest))
            return
        if command == "/pace":
            pace_text, _, content = rest.partition(" ")
            pace = _number(pace_text, 0.0, 60_000.0)
        for part in words(content):
            yield Delta(part)
            await _pause(pace)


def _name_and_args(rest: str, usage: str) -> tuple[str, dict[str, object]]:
    name, _, raw = rest.strip().partition(" ")
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise AgentFailed(f"tool arguments are not JSON: {exc}", "agent_bad_input") from None
    if not name or not isinstance(args, dict):
        raise AgentFailed(f"usage: {usage} NAME {{json object}}", "agent_bad_input")
    return name, args


async def _task(chat: ChatInput, rest: str) -> str:
    """``/task NAME JSON``: the task is admitted (the Mind's outbox) and the
    reply says so at once; the task runs on its Hand, after the chat."""
    name, args = _name_and_args(rest, "/task")
    started = await chat.start_task(name, args)
    if started.get("status") != "accepted":
        detail = started.get("error") or started.get("error_category") or "refused"
        raise AgentFailed(f"task {name} not started: {detail}", "agent_failed")
    return f"task {started['task_id']} started on {started.get('hand')}: {name}"


async def _tool(chat: ChatInput, rest: str, pace: float) -> AsyncIterator[Delta]:
    """The call's outcome, then its output. For a summary admission the reply
    says no more than the structured fields show (DESIGN §6): no output, and
    of an error only its category (its message may name the arguments)."""
    name, args = _name_and_args(rest, "/tool")
    result = await chat.call_tool(name, args)
    status = result.get("status", "failed")
    summary_only = result.get("detail_mode") == "summary"
    output = str(result.get("stdout") or "")
    notes = [] if result.get("exit_code") is None else [f"exit {result['exit_code']}"]
    if summary_only and (output or result.get("output_bytes")):
        notes.append("output not shown: summary detail")
    summary = f"{name} {status}" + (f" ({'; '.join(notes)})" if notes else "")
    detail = result.get("error_category")
    if not summary_only:  # a summary reply never falls back to the message
        detail = result.get("error") or detail
    if detail and status != "succeeded" and detail != status:  # never "denied: denied"
        summary += f": {detail}"
    yield Delta(summary)
    if output and not summary_only:
        yield Delta("\n")
        for part in words(output[:MAX_TOOL_ECHO]):
            yield Delta(part)
            await _pause(pace)


def from_config(config: Config) -> ScriptedAgent:
    return ScriptedAgent(config.scripted_delta_ms)


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
