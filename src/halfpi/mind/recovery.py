"""Start-up recovery of tool work (I11): unknown outcomes are declared, never re-run.

After a crash nobody knows how a pending approval or a running tool ended:
pending approvals become ``cancelled`` (and their tool calls complete as
``cancelled``), tool runs become ``lost`` and their tool calls complete as
``lost`` — each with its event, so every Face sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from halfpi.core.events import ApprovalResolved
from halfpi.mind.actor import ConversationActor
from halfpi.mind.tools import complete_call, run_changed
from halfpi.store.base import Store, WriteTx


async def recover_tools(
    store: Store,
    actor_of: Callable[[str], Awaitable[ConversationActor]],
    now: float,
    *,
    only: str | None = None,
) -> None:
    """Close every approval, tool run and tool call a restart left open;
    ``actor_of`` loads the conversation each one belongs to. ``only``: of
    that conversation alone (cluster mode: the one a node took over)."""
    for row in await store.open_approvals():
        if only is not None and row.conversation_id != only:
            continue
        actor = await actor_of(row.conversation_id)
        row = dataclasses.replace(
            row, status="cancelled", decided_at=now, decision_reason="the Mind restarted"
        )
        data = ApprovalResolved(
            approval_id=row.approval_id,
            status="cancelled",
            decision=None,
            decided_by=None,
            tool_call_id=row.tool_call_id,
        )
        await actor.commit(actor.stage(data, now), tx=WriteTx(approvals=[row]))
    for run in await store.open_tool_runs():
        if only is not None and run.conversation_id != only:
            continue
        actor = await actor_of(run.conversation_id)
        run = dataclasses.replace(run, status="lost", finished_at=now)
        await actor.commit(actor.stage(run_changed(run), now), tx=WriteTx(tool_runs=[run]))
    for call in await store.open_tool_calls():
        if only is not None and call.conversation_id != only:
            continue
        actor = await actor_of(call.conversation_id)
        # A call that never reached a Hand was waiting for its approval, which
        # the restart cancelled; one that did has an unknown outcome: lost.
        status = "lost" if call.run_id else "cancelled"
        await complete_call(actor, call, call.run_id, status, {"error_category": status})
