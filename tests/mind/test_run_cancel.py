"""``face.run.cancel`` converges on the run's terminal status (I10)."""

from __future__ import annotations

import asyncio

from tests.support.client import FaceClient, approve_next
from tests.support.frames import event
from tests.support.mind import LocalMind, hand_ready
from tests.support.store import SlowCommits

RUN_TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "lost"}


async def test_run_cancel_right_after_the_result_reports_a_terminal_status(
    lmind: LocalMind,
) -> None:
    await hand_ready(lmind)
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    held = SlowCommits(
        lmind.mind.store,
        lambda tx: any(r.status in RUN_TERMINAL for r in tx.tool_runs),
    )
    lmind.mind.store = held  # type: ignore[assignment]
    chat_id = await face.command(
        "face.chat", conversation_id=cid, content='/tool exec_command {"argv": ["true"]}'
    )
    await approve_next(face, chat_id)
    queued = await face.expect(event("run.changed", status="queued"))
    run_id = queued["payload"]["data"]["run_id"]
    await asyncio.wait_for(held.arrived.wait(), 10)  # the run ended; its commit is in flight
    cancel_id = await face.command("face.run.cancel", run_id=run_id)
    reply = await face.reply(cancel_id)
    await held.release()
    lmind.mind.store = held.inner
    await face.reply(chat_id)
    data = reply["payload"]["data"]
    assert data["target_status"] in RUN_TERMINAL, data
    await face.close()
