"""Cancel targeting (DESIGN §5, I10): which chat or tool run a cancel means,
and the one path every cancel takes through the request registry.

A cancel's ``face.accepted`` comes at once; its ``face.result`` once its
target's terminal state is committed, carrying that state — ``cancelled``
if the cancel won, ``already_finished`` with the state that stands if the
target ended first (the first terminal state wins).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from halfpi.core import wire
from halfpi.core.events import Accepted, CancelOutcome, Result, builtins
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.errors import ErrorCode, NotFound
from halfpi.mind.caller import Caller
from halfpi.store.base import FinishedRequest, WriteTx

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

ResultFor = Callable[[str], dict[str, Any]]


async def chat_cancel(mind: Mind, caller: Caller, p: wire.ChatCancel) -> None:
    """Cancel an explicit target (idempotent, DESIGN §5)."""
    actor = await mind.actor(p.conversation_id)

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        record.conversation_id = actor.id
        record.accepted = builtins(
            Accepted(
                request_id=record.request_id,
                operation="chat.cancel",
                conversation_id=actor.id,
                target_request_id=p.target_request_id,
            )
        )
        # request_ids are unique per principal (DESIGN §3): the caller's own
        # request is the target; only if it has none is another device's
        # chat with that id (e.g. cancelling from the phone what the laptop
        # started) the one meant.
        target = {"target_request_id": p.target_request_id}
        principal = record.principal_id
        run = actor.active_run_for(p.target_request_id)
        own = await mind.store.chat_run_for_request(actor.id, p.target_request_id, principal)
        if run is not None and (run.principal_id == principal or own is None):
            why = f"cancelled by {caller.label}"
            return await _admit(
                mind,
                caller,
                record,
                target,
                None,
                run.done,
                lambda: actor.stop(run, "cancelled", why),
            )
        row = own or await mind.store.chat_run_for_request(actor.id, p.target_request_id)
        if row is None:
            raise NotFound(
                ErrorCode.RUN_NOT_FOUND,
                "no chat with that request_id here",
                field="target_request_id",
            )
        return await _admit(mind, caller, record, target, row.status, None, None)

    await mind.registry.admit(caller, "face.chat.cancel", p, admit)


async def run_cancel(mind: Mind, caller: Caller, p: wire.RunCancel) -> None:
    """Cancel a tool run; the result comes once the run is terminal. A run
    already finished converges at once on the state that stands (I10)."""
    hands = mind.hands

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        record.accepted = builtins(
            Accepted(request_id=record.request_id, operation="run.cancel", run_id=p.run_id)
        )
        target = {"run_id": p.run_id}
        run = hands.runs.get(p.run_id)
        if run is not None:
            return await _admit(
                mind, caller, record, target, None, run.done, lambda: hands.cancel(run)
            )
        ended = hands.ended.get(p.run_id)
        if ended is None:
            stored = await mind.store.get_tool_run(p.run_id)
            if stored is None:
                raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run", field="run_id")
            ended = stored.status
        return await _admit(mind, caller, record, target, ended, None, None)

    await mind.registry.admit(caller, "face.run.cancel", p, admit)


async def task_cancel(mind: Mind, caller: Caller, p: wire.TaskCancel) -> None:
    """Cancel a background task; the result comes once it is terminal (its
    Hand decides, DESIGN §8). One already ended converges at once (I10)."""

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        row = await mind.store.get_task(p.task_id)
        if row is None:
            raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")
        record.conversation_id = row.conversation_id
        record.accepted = builtins(
            Accepted(request_id=record.request_id, operation="task.cancel",
                     conversation_id=row.conversation_id)
        )
        target = {"task_id": p.task_id}
        if row.terminal:
            return await _admit(mind, caller, record, target, row.state, None, None)
        ended = mind.tasks.terminal(p.task_id)
        return await _admit(
            mind, caller, record, target, None, ended, lambda: mind.tasks.cancel(row)
        )

    await mind.registry.admit(caller, "face.task.cancel", p, admit)


async def _admit(
    mind: Mind,
    caller: Caller,
    record: RequestRecord,
    target: dict[str, str],
    finished: str | None,
    terminal: Awaitable[Any] | None,
    stop: Callable[[], Any] | None,
) -> RequestRecord | Tombstone:
    """The common path of every cancel (chat, tool run): record the request;
    if the target already ended (``finished``) answer at once with the state
    that stands (I10); else ask it to stop and answer once it is terminal."""

    def result_for(status: str) -> dict[str, Any]:
        outcome = "cancelled" if status == "cancelled" else "already_finished"
        data = CancelOutcome(outcome=outcome, target_status=status, **target)
        return builtins(Result(request_id=record.request_id, status="succeeded", data=data))

    if finished is not None:
        record.finish(result_for(finished), mind.wall())
    outcome = await mind.store.write(WriteTx(admit=record))
    if outcome.existing is not None:
        return outcome.existing
    caller.reply_stored("face.accepted", record.accepted)
    if record.result is not None:
        caller.reply_stored("face.result", record.result)
        return record
    assert terminal is not None and stop is not None
    mind.registry.attach((record.principal_id, record.request_id), caller)
    stop()
    mind.spawn(_settle(mind, record, terminal, result_for), name="settle cancel")
    return record


async def _settle(
    mind: Mind, record: RequestRecord, terminal: Awaitable[Any], result_for: ResultFor
) -> None:
    """Record and deliver a cancel's result once its target is terminal."""
    outcome = await terminal
    result = result_for(outcome if isinstance(outcome, str) else outcome["status"])
    await mind.store.write(
        WriteTx(
            finished=[
                FinishedRequest(
                    record.principal_id, record.request_id, "succeeded", result, mind.wall()
                )
            ]
        )
    )
    mind.registry.deliver(record.principal_id, record.request_id, result)
