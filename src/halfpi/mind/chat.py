"""Driving one admitted chat: the agent's reply, its tool calls, its end.

The actor admits a chat and owns its log; this driver runs it — it asks the
agent for the reply, streams each delta through the actor, gives the agent
the conversation's history (read from the Store when the agent asks) and
the tools of the conversation's Hand, lets it call them through the Mind's
own tool path (``mind/tools.py``: visibility, approvals, Hands), adds up the
tokens its model reports, and commits the terminal state through
:meth:`ConversationActor.finish`. Kept apart from the actor so the actor
knows nothing of agents or tools (no import circle, one job each).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from halfpi.agents.base import Agent, AgentFailed, ChatInput, Delta, Turn, Usage
from halfpi.core.events import TokenUsage
from halfpi.logs import bind
from halfpi.mind.actor import ChatRun, ConversationActor
from halfpi.mind.tasks import TaskDispatcher
from halfpi.mind.tools import ToolCalls

log = logging.getLogger("halfpi.actor")

# The newest messages an agent may read as history (its context budget
# then decides how many of them a model request carries).
HISTORY_MESSAGES = 200


class ChatDriver:
    def __init__(
        self, agent: Agent, tools: ToolCalls, tasks: TaskDispatcher | None = None
    ) -> None:
        self.agent = agent
        self.tools = tools
        self.tasks = tasks  # background tasks the agent may start

    async def __call__(self, actor: ConversationActor, run: ChatRun) -> None:
        status, error_code, why = "succeeded", None, None
        used: Usage | None = None
        # This task's log lines name the chat (its own context: no unbind).
        bind(conversation_id=actor.id, request_id=run.request_id, run_id=run.run_id)
        try:
            chat = ChatInput(
                actor.id,
                run.request_id,
                run.content,
                partial(self.tools.call, actor, run),
                partial(history, actor, run),
                self.tools.specs(),
                **({} if self.tasks is None else
                   {"start_task": partial(self.tasks.admit, actor, run)}),
            )
            emit = actor.emit_delta
            async for out in self.agent.reply(chat):
                if type(out) is Delta:
                    if out.text:
                        emit(run, out.text)
                elif isinstance(out, Usage):
                    used = out if used is None else used + out
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
        log.debug("chat %s ends %s", run.run_id, status)
        await actor.finish(run, status, error_code, why, usage=token_usage(used))


async def history(actor: ConversationActor, run: ChatRun) -> list[Turn]:
    """The conversation's messages before this chat, oldest first: the
    newest ``HISTORY_MESSAGES`` the Store holds. The newest message is this
    chat's own (admitted before the chat starts, and one chat at a time):
    it is left out, the agent has it."""
    page = await actor.env.store.messages(
        actor.id, limit=HISTORY_MESSAGES + 1, before_seq=None, max_seq=None
    )
    rows = page.messages
    if rows and rows[-1].role == "user" and rows[-1].request_id == run.request_id:
        rows = rows[:-1]
    return [Turn(m.role, m.content, m.status) for m in rows[-HISTORY_MESSAGES:]]


def token_usage(used: Usage | None) -> TokenUsage | None:
    if used is None:
        return None
    return TokenUsage(
        prompt_tokens=used.prompt_tokens,
        completion_tokens=used.completion_tokens,
        total_tokens=used.total_tokens,
        requests=used.requests,
    )
