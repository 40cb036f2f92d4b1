"""Stored rows as Faces see them, and the other way round: one place.

The Store keeps rows (``store/base.py``); Faces get the typed values of
``core/events.py``. Each conversion is written here once — the history
entry of a message and the row it is stored as, a tool call's display
record as of a log position, an approval's resolution — so the Mind never
builds the same payload in two places.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from halfpi.core.events import (
    ApprovalPending,
    ApprovalRequested,
    MessageEntry,
    Resolution,
    TokenUsage,
    ToolRecord,
    builtins,
    present,
)
from halfpi.store.base import ApprovalRow, MessageRow, ToolCallRow


def message_entry(row: MessageRow) -> MessageEntry:
    return MessageEntry(
        seq=row.seq,
        role=row.role,
        content=row.content,
        request_id=row.request_id,
        status=row.status,
        ts=row.ts,
        error_code=UNSET if row.error_code is None else row.error_code,
        reason=UNSET if row.reason is None else row.reason,
        usage=UNSET if row.usage is None else msgspec.convert(row.usage, TokenUsage),
    )


def message_row(conversation_id: str, entry: MessageEntry) -> MessageRow:
    """The row that stores ``entry`` (from ``ChatMessage.entry`` or
    ``ChatEnded.reply``: what the Store keeps is what a Face appends)."""
    return MessageRow(
        conversation_id,
        entry.seq,
        entry.role,
        entry.content,
        entry.request_id,
        entry.status,
        entry.ts,
        present(entry.error_code),
        present(entry.reason),
        None if entry.usage is UNSET else builtins(entry.usage),
    )


def tool_record(row: ToolCallRow, position: int) -> ToolRecord:
    """The display record as a Face sees it at log position ``position``:
    a completion after that position is not shown yet."""
    done = row.completed_seq is not None and row.completed_seq <= position
    record = ToolRecord(
        tool_call_id=row.tool_call_id,
        request_id=row.request_id,
        tool=row.tool,
        detail_mode=row.detail_mode,
        args_digest=row.args_digest,
        scan_warnings=list(row.scan_warnings),
        hand=row.hand_id,
        run_id=row.run_id,
        status=row.status if done else "running",
        seq=row.called_seq,
        args=UNSET if row.args is None else row.args,
    )
    if not done:
        return record
    return msgspec.structs.replace(
        record,
        success=row.success,
        output_bytes=row.output_bytes,
        digest=row.digest,
        truncated=row.truncated,
        error_category=row.error_category,
        result=UNSET if row.result is None else row.result,
    )


def approval_requested(row: ApprovalRow) -> ApprovalRequested:
    """``approval.requested``: the arguments only if the admission stored them."""
    return ApprovalRequested(
        approval_id=row.approval_id,
        request_id=row.request_id,
        tool_call_id=row.tool_call_id,
        tool=row.tool,
        reason=row.reason,
        args_digest=row.args_digest,
        expires_at=row.expires_at,
        args=UNSET if row.args is None else row.args,
    )


def approval_pending(row: ApprovalRow) -> ApprovalPending:
    """``face.approval.pending``: where a decision waits, never the arguments."""
    return ApprovalPending(
        conversation_id=row.conversation_id,
        approval_id=row.approval_id,
        request_id=row.request_id,
        tool=row.tool,
        reason=row.reason,
        expires_at=row.expires_at,
    )


def resolution(row: ApprovalRow) -> Resolution:
    """How an approval stands, for the decider's ``face.result``."""
    return Resolution(
        approval_id=row.approval_id,
        status=row.status,
        decision=row.decision,
        decided_by=row.decided_by,
        decided_at=row.decided_at,
    )
