"""ConversationView: a pure reducer from a snapshot plus events to what a Face shows.

No I/O, no clock. Every Face (SDK users, the headless face, the terminal
face) folds the Mind's messages through this one reducer, so they agree by
construction. It dedupes by ``seq`` (an event at or below the cursor is
ignored) and refuses to guess: a message it cannot place exactly — a
coalesced delta straddling the cursor, an event from another epoch — makes
:meth:`apply` return :data:`RESYNC`, and the caller re-reads the snapshot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Applied(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # at or below the cursor: already folded in
    RESYNC = "resync"  # cannot be placed exactly: re-read the snapshot


APPLIED, DUPLICATE, RESYNC = Applied.APPLIED, Applied.DUPLICATE, Applied.RESYNC

TERMINAL_EVENTS = frozenset({"chat.completed", "chat.failed", "chat.cancelled", "chat.interrupted"})


@dataclass(frozen=True, slots=True)
class ViewMessage:
    seq: int
    role: str
    content: str
    request_id: str | None
    status: str | None
    error_code: str | None = None
    reason: str | None = None  # why a reply did not succeed, for people

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> ViewMessage:
        return cls(
            m["seq"],
            m["role"],
            m["content"],
            m.get("request_id"),
            m.get("status"),
            m.get("error_code"),
            m.get("reason"),
        )


@dataclass(slots=True)
class StreamingReply:
    request_id: str
    run_id: str | None
    text: str = ""
    status: str = "running"  # running | cancel_requested


@dataclass(slots=True)
class ToolCard:
    tool_call_id: str
    tool: str
    request_id: str | None
    args: Any = None
    status: str = "running"  # running until completed, then its terminal status
    output_bytes: int | None = None
    digest: str | None = None
    success: bool | None = None
    seq: int = 0  # where the call sits in the log: under its message, before the reply
    run_status: str | None = None  # the Hand run's state (queued, running…) once it has one
    error_category: str | None = None
    decided_by: str | None = None  # who allowed or denied it (a credential label)
    approval: str | None = None  # how its approval ended: allowed, denied, expired, cancelled
    exit_code: int | None = None


@dataclass(slots=True)
class ConversationView:
    conversation_id: str
    name: str | None = None
    epoch: str | None = None
    seq: int = -1  # -1: no snapshot yet
    messages: list[ViewMessage] = field(default_factory=list)
    streaming: dict[str, StreamingReply] = field(default_factory=dict)
    tool_cards: dict[str, ToolCard] = field(default_factory=dict)
    pending_approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    has_more_older: bool = False
    detail_mode: str | None = None

    @property
    def cursor(self) -> str | None:
        return None if self.epoch is None or self.seq < 0 else f"{self.epoch}.{self.seq}"

    @property
    def ready(self) -> bool:
        return self.seq >= 0

    # -- folding -------------------------------------------------------------

    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Replace everything with the snapshot (DESIGN §4.1)."""
        epoch, _, seq_text = str(snapshot["cursor"]).rpartition(".")
        self.epoch = epoch
        self.seq = int(seq_text)
        conversation = snapshot.get("conversation") or {}
        self.name = conversation.get("name", self.name)
        self.messages = [ViewMessage.from_wire(m) for m in snapshot.get("messages", [])]
        self.has_more_older = bool(snapshot.get("has_more_older", False))
        self.detail_mode = snapshot.get("detail_mode")
        self.streaming = {
            p["request_id"]: StreamingReply(
                p["request_id"],
                p.get("run_id"),
                p.get("text_so_far", ""),
                "cancel_requested" if p.get("status") == "cancel_requested" else "running",
            )
            for p in snapshot.get("pending_chats", [])
        }
        self.pending_approvals = {
            a["approval_id"]: dict(a) for a in snapshot.get("pending_approvals", [])
        }
        self.tasks = {t["task_id"]: dict(t) for t in snapshot.get("tasks", [])}
        self.tool_cards = {}
        for record in snapshot.get("tool_history", []):
            result = record.get("result") or {}
            card = ToolCard(
                record["tool_call_id"],
                record.get("tool", "?"),
                record.get("request_id"),
                record.get("args"),
                record.get("status", "running"),
                record.get("output_bytes"),
                record.get("digest"),
                record.get("success"),
                int(record.get("seq") or 0),
                error_category=record.get("error_category"),
                exit_code=result.get("exit_code") if isinstance(result, dict) else None,
            )
            self.tool_cards[card.tool_call_id] = card
        for run in snapshot.get("active_runs", []):
            running = self.tool_cards.get(run.get("tool_call_id", ""))
            if running is not None:
                running.run_status = run.get("status")

    def apply(self, type_: str, payload: dict[str, Any]) -> Applied:
        """Fold one ``face.event`` or ``face.chat.delta`` payload."""
        if not self.ready:
            return RESYNC
        epoch, _, _ = str(payload["cursor"]).rpartition(".")
        if epoch != self.epoch:
            return RESYNC
        seq = int(payload["seq"])
        if seq <= self.seq:
            return DUPLICATE
        if type_ == "face.chat.delta":
            first = int(payload.get("first_seq", seq))
            if first <= self.seq:
                return RESYNC  # a merged delta half of which we already hold
            reply = self.streaming.get(payload["request_id"])
            if reply is None:
                return RESYNC  # a delta of a reply we never saw start
            reply.text += payload["text"]
        elif type_ == "face.event":
            self._event(payload["type"], payload.get("data") or {}, seq)
        else:
            raise ValueError(f"not a conversation message: {type_}")
        self.seq = seq
        return APPLIED

    def _event(self, kind: str, data: dict[str, Any], seq: int) -> None:
        request_id: str = data.get("request_id") or ""
        if kind == "chat.message":
            self.messages.append(
                ViewMessage(
                    seq, data.get("role", "user"), data.get("content", ""), request_id, None
                )
            )
        elif kind == "chat.started":
            self.streaming[request_id] = StreamingReply(request_id, data.get("run_id"))
        elif kind in TERMINAL_EVENTS:
            self.streaming.pop(request_id, None)
            # Every end is an assistant message, with its status, its reason
            # and whatever text it had (the same rule as the store).
            self.messages.append(
                ViewMessage(
                    seq,
                    "assistant",
                    data.get("content", ""),
                    request_id,
                    data.get("status"),
                    data.get("error_code"),
                    data.get("reason"),
                )
            )
        elif kind == "conversation.changed":
            conversation = data.get("conversation") or {}
            self.name = conversation.get("name", self.name)
        elif kind == "chat.tool_called":
            card = ToolCard(
                data["tool_call_id"], data.get("tool", "?"), request_id, data.get("args"), seq=seq
            )
            self.tool_cards[card.tool_call_id] = card
        elif kind == "run.changed":
            running = self.tool_cards.get(data.get("tool_call_id") or "")
            if running is not None:
                running.run_status = data.get("status")
        elif kind == "chat.tool_completed":
            done = self.tool_cards.get(data["tool_call_id"])
            if done is not None:
                done.status = data.get("status") or (
                    "succeeded" if data.get("success") else "failed"
                )
                done.success = data.get("success")
                done.output_bytes = data.get("output_bytes")
                done.digest = data.get("digest")
                done.error_category = data.get("error_category")
                result = data.get("result")
                if isinstance(result, dict):
                    done.exit_code = result.get("exit_code")
        elif kind == "approval.requested":
            self.pending_approvals[data["approval_id"]] = dict(data)
        elif kind == "approval.resolved":
            self.pending_approvals.pop(data["approval_id"], None)
            decided = self.tool_cards.get(data.get("tool_call_id") or "")
            if decided is not None:
                decided.approval = data.get("status")
                if data.get("decided_by"):
                    decided.decided_by = data.get("decided_by_label") or data.get("decided_by")
        elif kind == "task.changed":
            self.tasks[data["task_id"]] = dict(data)
        # Unknown kinds are still positions in the log: the cursor advances.

    def awaiting_approval(self, tool_call_id: str) -> bool:
        return any(a.get("tool_call_id") == tool_call_id for a in self.pending_approvals.values())

    def tool_phase(self, card: ToolCard) -> str:
        """What is true of a tool call now, in words: ``awaiting approval``,
        ``queued``, ``running``, ``succeeded``, ``failed (exit 2)``, ``denied by
        laptop``…"""
        if card.status == "running":
            if self.awaiting_approval(card.tool_call_id):
                return "awaiting approval"
            return "queued" if card.run_status == "queued" else "running"
        phase = card.status
        if card.status == "denied" and card.decided_by:
            phase += f" by {card.decided_by}"
        elif card.exit_code not in (None, 0):
            phase += f" (exit {card.exit_code})"
        elif card.status == "failed" and card.error_category:
            phase += f" ({card.error_category})"
        if card.approval == "allowed" and card.decided_by:
            phase += f" · allowed by {card.decided_by}"
        return phase

    def mark_cancel_requested(self, request_id: str) -> None:
        reply = self.streaming.get(request_id)
        if reply is not None:
            reply.status = "cancel_requested"

    # -- comparison ----------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What must equal the Mind's snapshot once everything has settled."""
        return {
            "messages": [
                (m.seq, m.role, m.content, m.request_id, m.status, m.reason) for m in self.messages
            ],
            "streaming": sorted(self.streaming),
            "tools": sorted((c.tool_call_id, c.tool, c.status) for c in self.tool_cards.values()),
        }
