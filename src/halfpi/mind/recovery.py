"""Start-up recovery of tool work (I11): unknown outcomes are declared, never re-run.

After a crash nobody knows how a pending approval or a running tool ended:
pending approvals become ``cancelled`` (and their tool calls complete as
``cancelled``), tool runs become ``lost`` and their tool calls complete as
``lost`` — each with its event, so every Face sees it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from halfpi.mind.tools import complete_call
from halfpi.store.base import WriteTx

if TYPE_CHECKING:
    from halfpi.mind.service import Mind


async def recover_tools(mind: Mind) -> None:
    store = mind.store
    now = mind.now()
    for row in await store.open_approvals():
        actor = await mind.actor(row.conversation_id)
        row = dataclasses.replace(
            row, status="cancelled", decided_at=now, decision_reason="the Mind restarted"
        )
        data = {
            "approval_id": row.approval_id,
            "status": "cancelled",
            "decision": None,
            "decided_by": None,
            "tool_call_id": row.tool_call_id,
        }
        message, event = actor._event("approval.resolved", data, now)
        await actor._commit(WriteTx(events=[event], approvals=[row]), [(message, None)])
    for run in await store.open_tool_runs():
        actor = await mind.actor(run.conversation_id)
        run = dataclasses.replace(run, status="lost", finished_at=now)
        data = {
            "run_id": run.run_id,
            "tool_call_id": run.tool_call_id,
            "hand": run.hand_id,
            "tool": run.tool,
            "status": "lost",
        }
        message, event = actor._event("run.changed", data, now)
        await actor._commit(WriteTx(events=[event], tool_runs=[run]), [(message, None)])
    for call in await store.open_tool_calls():
        actor = await mind.actor(call.conversation_id)
        # A call that never reached a Hand was waiting for its approval, which
        # the restart cancelled; one that did has an unknown outcome: lost.
        status = "lost" if call.run_id else "cancelled"
        await complete_call(actor, call, call.run_id, status, {"error_category": status})
