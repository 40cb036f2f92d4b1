"""Handlers of the Face commands (DESIGN §4), one coroutine per type.

Each takes the session (already authenticated and re-authorized for this
command, I8) and the validated payload struct, and answers through the
session. Scope checks and error mapping happen in the session.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from halfpi.core import wire
from halfpi.core.cursor import parse_cursor
from halfpi.core.replay import Exact, plan_resume
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.core.scopes import default_detail_mode
from halfpi.core.titles import clean_name
from halfpi.errors import ErrorCode, InvalidRequest, NotFound, TooLarge
from halfpi.store.base import FinishedRequest, WriteTx

if TYPE_CHECKING:
    from halfpi.gateway.session import FaceSession
    from halfpi.mind.actor import ConversationActor

Handler = Callable[["FaceSession", Any], Awaitable[None]]

# What ``face.subscribe.transient_types`` may name (docs/protocol.md §6):
# ``face.run.progress`` is reserved for background tasks.
TRANSIENT_TYPES = ("face.chat.delta", "face.chat.tool.progress", "face.run.progress")


async def ping(s: FaceSession, p: wire.Ping) -> None:
    s.send_reliable("face.pong", {"request_id": p.request_id} if p.request_id else {})


async def conversation_create(s: FaceSession, p: wire.ConversationCreate) -> None:
    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        standing = await s.mind.create_conversation(record, p.name)
        if standing is record:
            s.send_reliable("face.accepted", record.accepted)
            assert record.result is not None
            s.send_result(record.result)
        return standing

    await s.mutation("face.conversation.create", p, admit)


async def conversation_rename(s: FaceSession, p: wire.ConversationRename) -> None:
    """A new name, through the registry (replay-safe); every Face that may
    read conversations hears ``face.conversation.changed``."""
    name = clean_name(p.name)
    if not name:
        raise InvalidRequest("a name needs at least one visible character", field="name")
    actor = await s.mind.actor(p.conversation_id)

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        standing = await actor.rename(record, name)
        if standing is record:
            s.send_reliable("face.accepted", record.accepted)
            assert record.result is not None
            s.send_result(record.result)
        return standing

    await s.mutation("face.conversation.rename", p, admit)


async def conversation_list(s: FaceSession, p: wire.ConversationList) -> None:
    rows = await s.mind.store.list_conversations(p.limit + 1, p.before)
    more = len(rows) > p.limit
    s.send_result(
        {
            "request_id": p.request_id,
            "status": "succeeded",
            "data": {
                "conversations": [
                    {"id": r.conversation_id, "name": r.name, "created_at": r.created_at}
                    for r in rows[: p.limit]
                ],
                "has_more": more,
            },
        }
    )


async def conversation_snapshot(s: FaceSession, p: wire.ConversationSnapshot) -> None:
    actor = await s.mind.actor(p.conversation_id)
    mode = s.resolve_detail_mode(p.detail_mode, keep=False)
    limit = p.messages_limit or s.mind.config.snapshot_messages
    snap = await actor.snapshot(limit, mode)
    s.send_reliable("face.snapshot", {"request_id": p.request_id, **snap})


async def conversation_messages(s: FaceSession, p: wire.ConversationMessages) -> None:
    actor = await s.mind.actor(p.conversation_id)
    page = await s.mind.store.messages(
        actor.id, limit=p.limit, before_seq=p.before_seq, max_seq=actor.published
    )
    s.send_result(
        {
            "request_id": p.request_id,
            "status": "succeeded",
            "data": {
                "messages": [m.to_wire() for m in page.messages],
                "has_more_older": page.has_more_older,
            },
        }
    )


async def subscribe(s: FaceSession, p: wire.Subscribe) -> None:
    """Exact replay from each cursor, or a reset with a snapshot (I4).

    All reads happen first; then, in one synchronous step, the reply, the
    snapshots/resets and the subscriptions are queued and installed, so no
    replayed event can overtake the ``face.accepted`` that announces it.
    """
    mode = s.resolve_detail_mode(p.detail_mode)
    since = dict(p.since or {})
    unknown = set(since) - set(p.conversation_ids)
    if unknown:
        raise InvalidRequest(
            f"since names {sorted(unknown)[0]} which is not subscribed", field="since"
        )
    cursors = {cid: parse_cursor(text, field=f"since.{cid}") for cid, text in since.items()}
    for name in p.transient_types or ():
        if name not in TRANSIENT_TYPES:
            raise InvalidRequest(
                f"transient_types names {name!r}, which is not a transient message type; "
                f"known: {', '.join(TRANSIENT_TYPES)}",
                field="transient_types",
            )
    transient = frozenset(p.transient_types) if p.transient_types is not None else None
    limit = s.mind.config.snapshot_messages
    plans: list[tuple[ConversationActor, int]] = []
    modes: dict[str, str] = {}
    followups: list[tuple[str, dict[str, Any]]] = []
    for cid in dict.fromkeys(p.conversation_ids):
        actor = await s.mind.actor(cid)
        cursor = cursors.get(cid)
        if cursor is not None:
            epoch, floor, head = s.mind.journal.window(cid)
            plan = plan_resume(cursor, epoch=epoch, floor=floor, head=head)
            if isinstance(plan, Exact):
                plans.append((actor, plan.after_seq))
                modes[cid] = "exact"
                continue
            snap = await actor.snapshot(limit, mode)
            followups.append(
                (
                    "face.reset",
                    {"conversation_id": cid, "reason": plan.reason.value, "snapshot": snap},
                )
            )
            modes[cid] = "reset"
        elif p.snapshot:
            snap = await actor.snapshot(limit, mode)
            followups.append(("face.snapshot", {"request_id": p.request_id, **snap}))
            modes[cid] = "live"
        else:
            plans.append((actor, actor.published))
            modes[cid] = "live"
            continue
        plans.append((actor, int(snap["cursor"].rpartition(".")[2])))
    replay = "exact" if cursors and all(modes[c] == "exact" for c in cursors) else "live"
    # ``heads``: where each log stands at this instant, so a Face knows how
    # many replayed events it is catching up on and when it has caught up.
    heads = {actor.id: actor.cursor(actor.published) for actor, _ in plans}
    s.send_reliable(
        "face.accepted",
        {
            "request_id": p.request_id,
            "operation": "subscribe",
            "replay": replay,
            "conversations": modes,
            "heads": heads,
        },
    )
    for type_, body in followups:
        s.send_reliable(type_, body)
    for actor, pos in plans:
        s.install(actor, pos, transient, mode)


async def unsubscribe(s: FaceSession, p: wire.Unsubscribe) -> None:
    for cid in p.conversation_ids:
        s._drop_subscription(cid)
    s.send_result({"request_id": p.request_id, "status": "succeeded", "data": {}})


async def chat(s: FaceSession, p: wire.Chat) -> None:
    if len(p.content.encode()) > s.mind.config.max_chat_bytes:
        raise TooLarge(f"content exceeds {s.mind.config.max_chat_bytes} bytes", field="content")
    actor = await s.mind.actor(p.conversation_id)

    def accepted(record: RequestRecord) -> None:
        s.mind.attach((record.principal_id, record.request_id), s)
        s.send_reliable("face.accepted", record.accepted)

    # I9: the detail mode of the admitting connection is frozen into the chat.
    mode = s.detail_mode or default_detail_mode(s.profile)
    await s.mutation(
        "face.chat", p, lambda record: actor.admit_chat(record, p.content, accepted, mode)
    )


async def chat_cancel(s: FaceSession, p: wire.ChatCancel) -> None:
    """Cancel an explicit target (idempotent, DESIGN §5). The cancel's own
    ``face.result`` comes once the target's terminal state is committed."""
    mind = s.mind
    actor = await mind.actor(p.conversation_id)

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        record.conversation_id = actor.id
        record.accepted = {
            "request_id": record.request_id,
            "operation": "chat.cancel",
            "conversation_id": actor.id,
            "target_request_id": p.target_request_id,
        }
        # request_ids are unique per principal (DESIGN §3): the caller's own
        # request is the target; only if it has none is another device's
        # chat with that id (e.g. cancelling from the phone what the laptop
        # started) the one meant.
        target = {"target_request_id": p.target_request_id}
        caller = record.principal_id
        run = actor.active_run_for(p.target_request_id)
        own = await mind.store.run_for_request(actor.id, p.target_request_id, caller)
        if run is not None and (run.principal_id == caller or own is None):
            why = f"cancelled by {_label(s, caller)}"
            return await _admit_cancel(
                s, record, target, None, run.done, lambda: actor.stop(run, "cancelled", why)
            )
        row = own or await mind.store.run_for_request(actor.id, p.target_request_id)
        if row is None:
            raise NotFound(
                ErrorCode.RUN_NOT_FOUND,
                "no chat with that request_id here",
                field="target_request_id",
            )
        return await _admit_cancel(s, record, target, row.status, None, None)

    await s.mutation("face.chat.cancel", p, admit)


async def _admit_cancel(
    s: FaceSession,
    record: RequestRecord,
    target: dict[str, Any],
    finished: str | None,
    terminal: Awaitable[Any] | None,
    stop: Callable[[], Any] | None,
) -> RequestRecord | Tombstone:
    """The common path of every cancel (chat, tool run): record the request;
    if the target already ended (``finished``) answer at once with the state
    that stands (I10); else ask it to stop and answer once it is terminal."""
    mind = s.mind

    def result_for(status: str) -> dict[str, Any]:
        outcome = "cancelled" if status == "cancelled" else "already_finished"
        return {
            "request_id": record.request_id,
            "status": "succeeded",
            "data": {"outcome": outcome, **target, "target_status": status},
        }

    if finished is not None:
        record.finish(result_for(finished), mind.now())
    outcome = await mind.store.write(WriteTx(admit=record))
    if outcome.existing is not None:
        return outcome.existing
    s.send_reliable("face.accepted", record.accepted)
    if record.result is not None:
        s.send_result(record.result)
        return record
    assert terminal is not None and stop is not None
    mind.attach((record.principal_id, record.request_id), s)
    stop()
    mind.spawn(_settle_cancel(s, record, terminal, result_for), name="settle cancel")
    return record


async def _settle_cancel(
    s: FaceSession,
    record: RequestRecord,
    terminal: Awaitable[Any],
    result_for: Callable[[str], dict[str, Any]],
) -> None:
    """Record and deliver a cancel's result once its target is terminal."""
    outcome = await terminal
    result = result_for(outcome if isinstance(outcome, str) else outcome["status"])
    mind = s.mind
    await mind.store.write(
        WriteTx(
            finished=[
                FinishedRequest(
                    record.principal_id, record.request_id, "succeeded", result, mind.now()
                )
            ]
        )
    )
    mind.deliver_result(record.principal_id, record.request_id, result)


# -- approvals, tool runs and Hands -------------------------------------------------


async def approval_resolve(s: FaceSession, p: wire.ApprovalResolve) -> None:
    """DESIGN §7: first valid decision wins; later deciders converge (I10)."""
    mind = s.mind
    assert s.principal_id is not None
    principal = s.principal_id

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        stored = None
        if p.approval_id not in mind.approvals.live:
            stored = await mind.store.get_approval(p.approval_id)
        data = await mind.approvals.resolve(
            principal, p.approval_id, p.decision, p.reason, stored, _label(s, principal)
        )
        record.accepted = {
            "request_id": record.request_id,
            "operation": "approval.resolve",
            "approval_id": p.approval_id,
        }
        result = {"request_id": record.request_id, "status": "succeeded", "data": data}
        record.finish(result, mind.now())
        outcome = await mind.store.write(WriteTx(admit=record))
        if outcome.existing is not None:
            return outcome.existing
        s.send_reliable("face.accepted", record.accepted)
        s.send_result(result)
        return record

    await s.mutation("face.approval.resolve", p, admit)


async def approval_list(s: FaceSession, p: wire.ApprovalList) -> None:
    """Every approval waiting for a decision, across conversations (summaries:
    a Face re-reads this after a reconnect, then follows
    ``face.approval.pending`` / ``face.approval.settled``)."""
    data = {"approvals": s.mind.pending_approvals()}
    s.send_result({"request_id": p.request_id, "status": "succeeded", "data": data})


def _label(s: FaceSession, principal_id: str) -> str:
    credential = s.mind.credential(principal_id)
    return credential.label if credential is not None else principal_id


async def run_cancel(s: FaceSession, p: wire.RunCancel) -> None:
    """Cancel a tool run; the result comes once the run is terminal. A run
    already finished converges at once on the state that stands (I10)."""
    mind = s.mind

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        record.accepted = {
            "request_id": record.request_id,
            "operation": "run.cancel",
            "run_id": p.run_id,
        }
        target = {"run_id": p.run_id}
        run = mind.hands.runs.get(p.run_id)
        if run is not None:
            return await _admit_cancel(
                s, record, target, None, run.done, lambda: mind.hands.cancel(run)
            )
        ended = mind.hands.ended.get(p.run_id)
        if ended is None:
            stored = await mind.store.get_tool_run(p.run_id)
            if stored is None:
                raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run", field="run_id")
            ended = stored.status
        return await _admit_cancel(s, record, target, ended, None, None)

    await s.mutation("face.run.cancel", p, admit)


async def task_cancel(s: FaceSession, p: wire.TaskCancel) -> None:
    raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")


async def task_get(s: FaceSession, p: wire.TaskGet | wire.TaskLog) -> None:
    raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")


async def task_list(s: FaceSession, p: wire.TaskList) -> None:
    s.send_result({"request_id": p.request_id, "status": "succeeded", "data": {"tasks": []}})


async def hand_list(s: FaceSession, p: wire.HandList) -> None:
    hands = [h.to_wire() for h in sorted(s.mind.hands.hands.values(), key=lambda h: h.hand_id)]
    s.send_result({"request_id": p.request_id, "status": "succeeded", "data": {"hands": hands}})


HANDLERS: dict[str, Handler] = {
    "face.ping": ping,
    "face.conversation.create": conversation_create,
    "face.conversation.rename": conversation_rename,
    "face.conversation.list": conversation_list,
    "face.conversation.snapshot": conversation_snapshot,
    "face.conversation.messages": conversation_messages,
    "face.subscribe": subscribe,
    "face.unsubscribe": unsubscribe,
    "face.chat": chat,
    "face.chat.cancel": chat_cancel,
    "face.approval.resolve": approval_resolve,
    "face.approval.list": approval_list,
    "face.run.cancel": run_cancel,
    "face.task.cancel": task_cancel,
    "face.task.list": task_list,
    "face.task.get": task_get,
    "face.task.log": task_get,
    "face.hand.list": hand_list,
}
