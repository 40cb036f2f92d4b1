"""The Face commands (DESIGN §4), one coroutine per type, transport-neutral.

Each takes the Mind, the caller (already authenticated and re-authorised
for this command by its transport, I8) and the validated payload struct,
and answers through the caller's sink. Every mutation goes through the
request registry (``mind/registry.py``); cancels are in ``mind/cancels.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from halfpi.core import wire
from halfpi.core.events import (
    Accepted,
    ApprovalPage,
    ConversationInfo,
    ConversationPage,
    Empty,
    HandPage,
    MessagePage,
    Outbound,
    Pong,
    Result,
    TaskPage,
    builtins,
)
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.core.scopes import default_detail_mode
from halfpi.core.titles import clean_name
from halfpi.errors import ErrorCode, Forbidden, InvalidRequest, NotFound, TooLarge
from halfpi.mind.caller import Caller
from halfpi.mind.records import message_entry
from halfpi.store.base import TaskRow, WriteTx

if TYPE_CHECKING:
    from halfpi.mind.service import Mind


def detail_mode_for(caller: Caller, requested: str | None, *, keep: bool = True) -> str:
    """DESIGN §6: per connection, set by ``face.subscribe`` (``keep``); a
    snapshot may ask for a mode for itself only. Observers may never ask
    for transparent (I9)."""
    if requested == "transparent" and caller.profile != "operator":
        raise Forbidden("observers cannot request transparent detail", field="detail_mode")
    mode = requested or caller.detail_mode or default_detail_mode(caller.profile)
    if keep:
        caller.detail_mode = mode
    return mode


def succeeded(caller: Caller, request_id: str, data: Outbound) -> None:
    """The ``face.result`` of a read."""
    caller.reply(Result(request_id=request_id, status="succeeded", data=data))


def answered(caller: Caller, record: RequestRecord) -> None:
    """An instant mutation: its ``face.accepted`` and its ``face.result``."""
    caller.reply_stored("face.accepted", record.accepted)
    assert record.result is not None
    caller.reply_stored("face.result", record.result)


async def ping(mind: Mind, caller: Caller, p: wire.Ping) -> None:
    caller.reply(Pong(request_id=p.request_id or UNSET))


async def conversation_create(mind: Mind, caller: Caller, p: wire.ConversationCreate) -> None:
    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        standing = await mind.create_conversation(record, p.name)
        if standing is record:
            answered(caller, record)
        return standing

    await mind.registry.admit(caller, "face.conversation.create", p, admit)


async def conversation_rename(mind: Mind, caller: Caller, p: wire.ConversationRename) -> None:
    """A new name, through the registry (replay-safe); every Face that may
    read conversations hears ``face.conversation.changed``."""
    name = clean_name(p.name)
    if not name:
        raise InvalidRequest("a name needs at least one visible character", field="name")
    actor = await mind.actor(p.conversation_id)

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        standing = await actor.rename(record, name)
        if standing is record:
            answered(caller, record)
        return standing

    await mind.registry.admit(caller, "face.conversation.rename", p, admit)


async def conversation_list(mind: Mind, caller: Caller, p: wire.ConversationList) -> None:
    rows = await mind.store.list_conversations(p.limit + 1, p.before)
    page = ConversationPage(
        conversations=[
            ConversationInfo(id=r.conversation_id, name=r.name, created_at=r.created_at)
            for r in rows[: p.limit]
        ],
        has_more=len(rows) > p.limit,
    )
    succeeded(caller, p.request_id, page)


async def conversation_snapshot(mind: Mind, caller: Caller, p: wire.ConversationSnapshot) -> None:
    actor = await mind.view(p.conversation_id)
    mode = detail_mode_for(caller, p.detail_mode, keep=False)
    limit = p.messages_limit or mind.config.snapshot_messages
    snap = await actor.snapshot(limit, mode)
    caller.reply(snap.answering(p.request_id))


async def conversation_messages(mind: Mind, caller: Caller, p: wire.ConversationMessages) -> None:
    actor = await mind.view(p.conversation_id)
    page = await mind.store.messages(
        actor.id, limit=p.limit, before_seq=p.before_seq, max_seq=actor.published
    )
    data = MessagePage(
        messages=[message_entry(m) for m in page.messages], has_more_older=page.has_more_older
    )
    succeeded(caller, p.request_id, data)


async def subscribe(mind: Mind, caller: Caller, p: wire.Subscribe) -> None:
    """Exact replay from each cursor, or a reset with a snapshot (I4):
    planned and installed by the caller's subscriptions."""
    mode = detail_mode_for(caller, p.detail_mode)
    await caller.subscriptions.subscribe(p, mode, mind.view)


async def unsubscribe(mind: Mind, caller: Caller, p: wire.Unsubscribe) -> None:
    for cid in p.conversation_ids:
        caller.subscriptions.drop(cid)
    succeeded(caller, p.request_id, Empty())


async def chat(mind: Mind, caller: Caller, p: wire.Chat) -> None:
    if len(p.content.encode()) > mind.config.max_chat_bytes:
        raise TooLarge(f"content exceeds {mind.config.max_chat_bytes} bytes", field="content")
    actor = await mind.actor(p.conversation_id)

    def accepted(record: RequestRecord) -> None:
        mind.registry.attach((record.principal_id, record.request_id), caller)
        caller.reply_stored("face.accepted", record.accepted)

    # I9: the detail mode of the admitting connection is frozen into the chat.
    mode = caller.detail_mode or default_detail_mode(caller.profile)
    await mind.registry.admit(
        caller, "face.chat", p, lambda record: actor.admit_chat(record, p.content, accepted, mode)
    )


# -- approvals and Hands ------------------------------------------------------------------


async def approval_resolve(mind: Mind, caller: Caller, p: wire.ApprovalResolve) -> None:
    """DESIGN §7: first valid decision wins; later deciders converge (I10)."""
    principal = caller.principal_id
    assert principal is not None

    async def admit(record: RequestRecord) -> RequestRecord | Tombstone:
        stored = None
        if p.approval_id not in mind.approvals.live:
            stored = await mind.store.get_approval(p.approval_id)
        data = await mind.approvals.resolve(
            principal, p.approval_id, p.decision, p.reason, stored, caller.label
        )
        record.accepted = builtins(
            Accepted(
                request_id=record.request_id,
                operation="approval.resolve",
                approval_id=p.approval_id,
            )
        )
        record.finish(
            builtins(Result(request_id=record.request_id, status="succeeded", data=data)),
            mind.wall(),
        )
        outcome = await mind.store.write(WriteTx(admit=record))
        if outcome.existing is not None:
            return outcome.existing
        answered(caller, record)
        return record

    await mind.registry.admit(caller, "face.approval.resolve", p, admit)


async def approval_list(mind: Mind, caller: Caller, p: wire.ApprovalList) -> None:
    """Every approval waiting for a decision, across conversations (summaries:
    a Face re-reads this after a reconnect, then follows
    ``face.approval.pending`` / ``face.approval.settled``)."""
    succeeded(caller, p.request_id, ApprovalPage(approvals=await mind.waiting_approvals()))


# -- background tasks (DESIGN §8): the Mind's last known snapshot ----------------------------


async def stored_task(mind: Mind, task_id: str) -> TaskRow:
    row = await mind.store.get_task(task_id)
    if row is None:
        raise NotFound(ErrorCode.TASK_NOT_FOUND, "no such task", field="task_id")
    return row


def sees_bodies(caller: Caller) -> bool:
    """Whether this connection may see argument and log bodies (I9)."""
    return detail_mode_for(caller, None, keep=False) == "transparent"


async def task_get(mind: Mind, caller: Caller, p: wire.TaskGet) -> None:
    row = await stored_task(mind, p.task_id)
    succeeded(caller, p.request_id, mind.tasks.view(row, transparent=sees_bodies(caller)))


async def task_list(mind: Mind, caller: Caller, p: wire.TaskList) -> None:
    """Newest first; ``hand`` filters by the Hand's name."""
    rows = await mind.store.list_tasks(limit=p.limit if p.hand is None else 500)
    if p.hand is not None:
        rows = [r for r in rows if r.hand_label == p.hand][: p.limit]
    transparent = sees_bodies(caller)
    succeeded(caller, p.request_id,
              TaskPage(tasks=[mind.tasks.view(r, transparent=transparent) for r in rows]))


async def task_log(mind: Mind, caller: Caller, p: wire.TaskLog) -> None:
    """A page of the log, read from the task's Hand; its body only for a
    transparent admission read by a transparent viewer (I9)."""
    row = await stored_task(mind, p.task_id)
    body = row.detail_mode == "transparent" and sees_bodies(caller)
    page = await mind.tasks.read_log(row, p.offset, p.limit, body)
    succeeded(caller, p.request_id, page)


async def hand_list(mind: Mind, caller: Caller, p: wire.HandList) -> None:
    hands: list[dict[str, Any]] = [
        h.to_wire() for h in sorted(mind.hands.hands.values(), key=lambda h: h.hand_id)
    ]
    succeeded(caller, p.request_id, HandPage(hands=hands))
