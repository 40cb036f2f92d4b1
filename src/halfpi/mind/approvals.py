"""Approvals (DESIGN §7): a human allows or denies one tool call; first valid decision wins.

The state lives in one place per approval and moves by the ``APPROVAL``
table. A decision is applied synchronously (so two racing decisions cannot
both win), then its audit row and the ``approval.resolved`` event are
committed, and only then is the waiting tool woken (I10: audit before
execution). Every later decider waits for that same commit and is told the
decision that stands (``already_resolved``) — never that it won.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from halfpi.core.events import (
    ApprovalOutcome,
    ApprovalPending,
    ApprovalRequested,
    ApprovalResolved,
    ApprovalSettled,
    Outbound,
)
from halfpi.core.ids import new_id
from halfpi.core.states import APPROVAL
from halfpi.core.timers import Timer
from halfpi.errors import ApprovalExpired, ErrorCode, NotFound, StoreError
from halfpi.mind.actor import ConversationActor
from halfpi.mind.records import approval_pending, approval_requested, resolution
from halfpi.store.base import ApprovalRow, WriteTx

if TYPE_CHECKING:
    from halfpi.mind.scheduler import Scheduler

DECISION_STATE = {"allow_once": "allowed", "deny_once": "denied"}


@dataclass
class Approval:
    row: ApprovalRow
    actor: ConversationActor
    state: str = APPROVAL.initial
    # Resolves with the terminal state once its audit row is committed.
    decided: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    timer: Timer | None = None  # the TTL, on the Mind's scheduler
    # When the TTL runs out on the scheduler's monotonic clock (``row.expires_at``
    # is the same moment in wall time, for people).
    expires: float = float("inf")
    # Its ``approval.requested`` is published (and announced).
    shown: bool = False

    @property
    def approval_id(self) -> str:
        return self.row.approval_id

    def pending_summary(self) -> ApprovalPending:
        """``face.approval.pending`` (and a row of ``face.approval.list``): what
        a Face needs to show that a decision waits, and where — never the
        arguments, whatever the viewer's detail mode."""
        return approval_pending(self.row)

    def requested_data(self) -> ApprovalRequested:
        return approval_requested(self.row)


class Approvals:
    """All approvals of this Mind that are still pending or settling."""

    def __init__(self, ttl_s: float, scheduler: Scheduler) -> None:
        self.ttl_s = ttl_s
        self.scheduler = scheduler
        self.live: dict[str, Approval] = {}
        self.settled: Counter[str] = Counter()  # by terminal state, for /metrics
        # Session-level news (face.approval.pending / settled): set by the Mind.
        self.announce: Callable[[Outbound], None] = _nowhere

    async def request(
        self,
        actor: ConversationActor,
        *,
        request_id: str,
        tool_call_id: str,
        tool: str,
        args_digest: str,
        args: Any,
        detail_mode: str,
        reason: str,
    ) -> Approval:
        now = actor.wall()
        row = ApprovalRow(
            new_id("a", now),
            actor.id,
            request_id,
            tool_call_id,
            tool,
            reason,
            args_digest,
            args,
            detail_mode,
            "pending",
            now,
            now + self.ttl_s,
        )
        approval = Approval(row, actor)
        self.live[row.approval_id] = approval
        # Expires ``ttl_s`` from now on the monotonic clock: at the
        # ``expires_at`` every Face was shown, unless the wall clock was set
        # meanwhile — a step of it neither stalls nor hastens the TTL.
        approval.expires = self.scheduler.now() + self.ttl_s
        approval.timer = self.scheduler.call_at(
            approval.expires, self.settle, approval, "expired", None, None, None
        )

        def shown() -> None:
            approval.shown = True
            if approval.state == "pending":
                self.announce(approval.pending_summary())

        # Registered (and timed) before the await: a cancel arriving during
        # the commit finds it and settles it (see ToolCalls.call).
        await actor.append(approval.requested_data(), WriteTx(approvals=[row]), on_shown=shown)
        return approval

    def for_call(self, tool_call_id: str) -> Approval | None:
        return next((a for a in self.live.values() if a.row.tool_call_id == tool_call_id), None)

    def settle(
        self,
        approval: Approval,
        state: str,
        decided_by: str | None,
        decision: str | None,
        reason: str | None,
        decided_by_label: str | None = None,
    ) -> bool:
        """Apply a terminal state if none applied yet; True if this one won.
        ``decided_by_label`` is the decider's credential label, for people."""
        if not APPROVAL.first_terminal_wins(approval.state, state):
            return False
        approval.state = state
        self.settled[state] += 1
        if approval.timer is not None:
            approval.timer.cancel()
        actor = approval.actor
        now = actor.wall()
        approval.row = dataclasses.replace(
            approval.row,
            status=state,
            decision=decision,
            decided_by=decided_by,
            decision_reason=reason,
            decided_at=now,
        )
        data = ApprovalResolved(
            approval_id=approval.approval_id,
            status=state,
            decision=decision,
            decided_by=decided_by,
            tool_call_id=approval.row.tool_call_id,
            decided_by_label=UNSET if decided_by_label is None else decided_by_label,
        )

        def resolved() -> None:
            self.live.pop(approval.approval_id, None)
            if approval.shown:
                approval.shown = False
                self.announce(
                    ApprovalSettled(
                        conversation_id=actor.id, approval_id=approval.approval_id, status=state
                    )
                )
            if not approval.decided.done():
                approval.decided.set_result(state)  # wake the tool only now (I10)

        committed = actor.append(data, WriteTx(approvals=[approval.row]), on_shown=resolved)

        def failed(future: asyncio.Future[Any]) -> None:
            # No durable audit: the tool must not run. Waiters learn it failed.
            if future.exception() is not None and not approval.decided.done():
                approval.decided.set_exception(StoreError("the decision could not be recorded"))

        committed.add_done_callback(failed)
        return True

    async def resolve(
        self,
        principal_id: str,
        approval_id: str,
        decision: str,
        reason: str | None,
        stored: ApprovalRow | None,
        label: str | None = None,
    ) -> ApprovalOutcome:
        """A Face's decision. Returns the ``face.result`` data: ``applied`` for
        the winner, ``already_resolved`` (with the standing resolution) for
        everyone else."""
        approval = self.live.get(approval_id)
        if approval is None:
            if stored is None:
                raise NotFound(
                    ErrorCode.APPROVAL_NOT_FOUND, "no such approval", field="approval_id"
                )
            return self._standing(stored)
        if approval.state == "pending" and self.scheduler.now() >= approval.expires:
            self.settle(approval, "expired", None, None, None)
        applied = self.settle(
            approval, DECISION_STATE[decision], principal_id, decision, reason, label
        )
        await asyncio.shield(approval.decided)  # the audit row is durable before we answer
        if applied:
            return ApprovalOutcome(outcome="applied", resolution=resolution(approval.row))
        return self._standing(approval.row)

    @staticmethod
    def _standing(row: ApprovalRow) -> ApprovalOutcome:
        if row.status == "expired":
            raise ApprovalExpired("the approval expired before this decision", field="approval_id")
        return ApprovalOutcome(outcome="already_resolved", resolution=resolution(row))


def _nowhere(news: Outbound) -> None:
    """Until the Mind says where news goes, it goes nowhere."""
