"""Driving one admitted chat: the agent's reply, its tool calls, its end.

The actor admits a chat and owns its log; this driver runs it — it asks the
agent for the reply, streams each delta through the actor, lets the agent
call tools through the Mind's own tool path (``mind/tools.py``: visibility,
approvals, Hands), and commits the terminal state through
:meth:`ConversationActor.finish`. Kept apart from the actor so the actor
knows nothing of agents or tools (no import circle, one job each).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from halfpi.agents.base import Agent, AgentFailed, ChatInput
from halfpi.mind.actor import ChatRun, ConversationActor
from halfpi.mind.tools import ToolCalls

log = logging.getLogger("halfpi.actor")


class ChatDriver:
    def __init__(self, agent: Agent, tools: ToolCalls) -> None:
        self.agent = agent
        self.tools = tools

    async def __call__(self, actor: ConversationActor, run: ChatRun) -> None:
        status, error_code, why = "succeeded", None, None
        try:
            call_tool = partial(self.tools.call, actor, run)
            async for delta in self.agent.reply(
                ChatInput(actor.id, run.request_id, run.content, call_tool)
            ):
                if delta.text:
                    actor.emit_delta(run, delta.text)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            status = run.stop_reason or "interrupted"
            why = run.stop_why
        except AgentFailed as exc:
            status, error_code, why = "failed", exc.code, str(exc)
            log.info("chat %s failed: %s", run.run_id, exc)
        except Exception:
            log.exception("agent crashed in chat %s", run.run_id)
            status, error_code = "failed", "internal_error"
            why = "the agent failed unexpectedly (the Mind's log has the details)"
        await actor.finish(run, status, error_code, why)
