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

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> ViewMessage:
        return cls(m["seq"], m["role"], m["content"], m.get("request_id"), m.get("status"))


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
    status: str = "running"
    output_bytes: int | None = None
    digest: str | None = None
    success: bool | None = None


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
            card = ToolCard(
                record["tool_call_id"],
                record.get("tool", "?"),
                record.get("request_id"),
                record.get("args"),
                record.get("status", "running"),
                record.get("output_bytes"),
                record.get("digest"),
                record.get("success"),
            )
            self.tool_cards[card.tool_call_id] = card

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
            status = data.get("status")
            content = data.get("content", "")
            # The Mind keeps an assistant message for a success, and for any
            # other end that produced text (same rule as the store).
            if status == "succeeded" or content:
                self.messages.append(ViewMessage(seq, "assistant", content, request_id, status))
        elif kind == "conversation.changed":
            self.name = data.get("name", self.name)
        elif kind == "chat.tool_called":
            card = ToolCard(
                data["tool_call_id"], data.get("tool", "?"), request_id, data.get("args")
            )
            self.tool_cards[card.tool_call_id] = card
        elif kind == "chat.tool_completed":
            done = self.tool_cards.get(data["tool_call_id"])
            if done is not None:
                done.status = data.get("status") or (
                    "succeeded" if data.get("success") else "failed"
                )
                done.success = data.get("success")
                done.output_bytes = data.get("output_bytes")
                done.digest = data.get("digest")
        elif kind == "approval.requested":
            self.pending_approvals[data["approval_id"]] = dict(data)
        elif kind == "approval.resolved":
            self.pending_approvals.pop(data["approval_id"], None)
        elif kind == "task.changed":
            self.tasks[data["task_id"]] = dict(data)
        # Unknown kinds are still positions in the log: the cursor advances.

    def mark_cancel_requested(self, request_id: str) -> None:
        reply = self.streaming.get(request_id)
        if reply is not None:
            reply.status = "cancel_requested"

    # -- comparison ----------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What must equal the Mind's snapshot once everything has settled."""
        return {
            "messages": [(m.seq, m.role, m.content, m.request_id, m.status) for m in self.messages],
            "streaming": sorted(self.streaming),
            "tools": sorted((c.tool_call_id, c.tool, c.status) for c in self.tool_cards.values()),
        }
