"""ConversationView: a pure reducer from a snapshot plus events to what a Face shows.

No I/O, no clock. Every Face (SDK users, the headless face, the terminal
face) folds the Mind's messages through this one reducer, so they agree by
construction. It reads them with the Mind's own definitions
(``core/events.py``): each event's ``data`` is decoded into the struct the
Mind encoded it from, and rules both sides need — "every end of a chat
keeps an assistant message" (``ChatEnded.reply``) — are written there once.
It dedupes by ``seq`` (an event at or below the cursor is
ignored) and refuses to guess: a message it cannot place exactly — a
coalesced delta straddling the cursor, an event from another epoch — makes
:meth:`apply` return :data:`RESYNC`, and the caller re-reads the snapshot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from halfpi.core.cursor import encode_cursor, parse_cursor
from halfpi.core.events import (
    CHAT_END_EVENTS,
    ApprovalRequested,
    ApprovalResolved,
    ChatEnded,
    ChatMessage,
    ChatStarted,
    ConversationChanged,
    MessageEntry,
    RunChanged,
    Snapshot,
    TaskEvent,
    TaskView,
    ToolCalled,
    ToolCompleted,
    ToolOutput,
    decode_event,
    present,
)
from halfpi.core.states import OUTBOX
from halfpi.face.errors import CommandError


class Applied(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # at or below the cursor: already folded in
    RESYNC = "resync"  # cannot be placed exactly: re-read the snapshot


APPLIED, DUPLICATE, RESYNC = Applied.APPLIED, Applied.DUPLICATE, Applied.RESYNC

TERMINAL_EVENTS = CHAT_END_EVENTS


@dataclass(frozen=True, slots=True)
class ViewMessage:
    seq: int
    role: str
    content: str
    request_id: str | None
    status: str | None
    error_code: str | None = None
    reason: str | None = None  # why a reply did not succeed, for people
    # Shown while the reply streamed but not saved: the Mind keeps a reply's
    # text by checkpoints (DESIGN §5), so a crash can cut the last words.
    unsaved: str | None = None

    def noting_unsaved(self, shown: dict[str, str]) -> ViewMessage:
        """This message, saying which words of it a Face showed (``shown``:
        request_id -> text) that the Mind did not save."""
        text = shown.get(self.request_id or "", "")
        if self.status != "interrupted" or len(text) <= len(self.content):
            return self
        if not text.startswith(self.content):
            return self
        return replace(self, unsaved=text[len(self.content):])

    @classmethod
    def from_entry(cls, m: MessageEntry) -> ViewMessage:
        return cls(
            m.seq,
            m.role,
            m.content,
            m.request_id,
            m.status,
            present(m.error_code),
            present(m.reason),
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
    # What it printed (stdout, then stderr), as the Mind keeps it for display:
    # transparent admissions only, None otherwise; ``truncated`` when cut.
    output: str | None = None
    truncated: bool = False


@dataclass(slots=True)
class ConversationView:
    conversation_id: str
    name: str | None = None
    epoch: str | None = None
    seq: int = -1  # -1: no snapshot yet
    messages: list[ViewMessage] = field(default_factory=list)
    streaming: dict[str, StreamingReply] = field(default_factory=dict)
    tool_cards: dict[str, ToolCard] = field(default_factory=dict)
    pending_approvals: dict[str, ApprovalRequested] = field(default_factory=dict)
    tasks: dict[str, TaskView] = field(default_factory=dict)
    has_more_older: bool = False
    detail_mode: str | None = None
    # Why the Mind refused to follow it (not found, forbidden): a refusal
    # not asked again, said to the Face with on_update("refused", cid).
    refused: CommandError | None = None

    @property
    def cursor(self) -> str | None:
        return None if self.epoch is None or self.seq < 0 else encode_cursor(self.epoch, self.seq)

    @property
    def ready(self) -> bool:
        return self.seq >= 0

    # -- folding -------------------------------------------------------------

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Replace everything with the snapshot (DESIGN §4.1)."""
        position = parse_cursor(snapshot.cursor, field="cursor")
        # What this Face showed of each reply: kept to tell words that were
        # shown but not saved (a reply interrupted between checkpoints).
        shown = {rid: r.text for rid, r in self.streaming.items()}
        for m in self.messages:
            if m.request_id and m.unsaved:
                shown[m.request_id] = m.content + m.unsaved
        self.epoch = position.epoch
        self.seq = position.seq
        if snapshot.conversation.name is not msgspec.UNSET:
            self.name = snapshot.conversation.name
        self.messages = [
            ViewMessage.from_entry(m).noting_unsaved(shown) for m in snapshot.messages
        ]
        self.has_more_older = snapshot.has_more_older
        self.detail_mode = snapshot.detail_mode
        self.streaming = {
            p.request_id: StreamingReply(
                p.request_id,
                p.run_id,
                p.text_so_far,
                "cancel_requested" if p.status == "cancel_requested" else "running",
            )
            for p in snapshot.pending_chats
        }
        self.pending_approvals = {a.approval_id: a for a in snapshot.pending_approvals}
        self.tasks = {t.task_id: t for t in snapshot.tasks}
        self.tool_cards = {}
        for record in snapshot.tool_history:
            result = _output_of(present(record.result))
            card = ToolCard(
                record.tool_call_id,
                record.tool,
                record.request_id,
                present(record.args),
                record.status,
                present(record.output_bytes),
                present(record.digest),
                present(record.success),
                record.seq,
                error_category=present(record.error_category),
                exit_code=None if result is None else result.exit_code,
                output=tool_output(result),
                truncated=bool(present(record.truncated)),
            )
            self.tool_cards[card.tool_call_id] = card
        for run in snapshot.active_runs:
            running = self.tool_cards.get(run.tool_call_id or "")
            if running is not None:
                running.run_status = run.status

    def apply(self, type_: str, payload: dict[str, Any]) -> Applied:
        """Fold one ``face.event`` or ``face.chat.delta`` payload."""
        if not self.ready:
            return RESYNC
        if parse_cursor(str(payload["cursor"]), field="cursor").epoch != self.epoch:
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
            self._event(payload["type"], payload.get("data") or {}, seq, payload.get("ts", 0.0))
        else:
            raise ValueError(f"not a conversation message: {type_}")
        self.seq = seq
        return APPLIED

    def _event(self, kind: str, data: dict[str, Any], seq: int, ts: float) -> None:
        event = decode_event(kind, data)
        if isinstance(event, ChatMessage):
            self.messages.append(ViewMessage.from_entry(event.entry(seq, ts)))
        elif isinstance(event, ChatStarted):
            request_id = event.request_id or ""
            self.streaming[request_id] = StreamingReply(request_id, event.run_id)
        elif isinstance(event, ChatEnded):
            ended = self.streaming.pop(event.request_id or "", None)
            shown = {ended.request_id: ended.text} if ended is not None else {}
            # Every end is an assistant message: the rule the Mind stores by.
            self.messages.append(ViewMessage.from_entry(event.reply(seq, ts)).noting_unsaved(shown))
        elif isinstance(event, ConversationChanged):
            name = event.conversation.name
            if name is not msgspec.UNSET:
                self.name = name
        elif isinstance(event, ToolCalled):
            card = ToolCard(
                event.tool_call_id, event.tool, event.request_id, present(event.args), seq=seq
            )
            self.tool_cards[card.tool_call_id] = card
        elif isinstance(event, RunChanged):
            running = self.tool_cards.get(event.tool_call_id or "")
            if running is not None:
                running.run_status = event.status
        elif isinstance(event, ToolCompleted):
            done = self.tool_cards.get(event.tool_call_id)
            if done is not None:
                done.status = event.status or ("succeeded" if event.success else "failed")
                done.success = event.success
                done.output_bytes = event.output_bytes
                done.digest = event.digest
                done.error_category = event.error_category
                done.truncated = event.truncated
                if event.result is not msgspec.UNSET:
                    done.exit_code = event.result.exit_code
                    done.output = tool_output(event.result)
        elif isinstance(event, ApprovalRequested):
            self.pending_approvals[event.approval_id] = event
        elif isinstance(event, ApprovalResolved):
            self.pending_approvals.pop(event.approval_id, None)
            decided = self.tool_cards.get(event.tool_call_id or "")
            if decided is not None:
                decided.approval = event.status
                if event.decided_by:
                    decided.decided_by = present(event.decided_by_label) or event.decided_by
        elif isinstance(event, TaskEvent):
            # Each task event carries the task as it stands (DESIGN §8); the
            # first terminal state stands (I10): a transient progress read
            # before the end but published after it never reopens a task.
            held = self.tasks.get(event.task.task_id)
            if held is None or not _task_ended(held) or _task_ended(event.task):
                self.tasks[event.task.task_id] = event.task
        # Unknown kinds are still positions in the log: the cursor advances.

    def awaiting_approval(self, tool_call_id: str) -> bool:
        return any(a.tool_call_id == tool_call_id for a in self.pending_approvals.values())

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

    def task_phase(self, task: TaskView) -> str:
        """A background task's state in words: ``running``, ``succeeded``,
        ``failed (exit 2)``, ``running · stale (its Hand is away)``, ``dead``…"""
        phase = task.state
        if task.exit_code not in (None, 0):
            phase += f" (exit {task.exit_code})"
        elif task.state in ("failed", "dead", "lost") and task.error:
            phase += f" ({task.error})"
        if task.stale:
            phase += " · stale (its Hand is away)"
        return phase

    def task_lines(self) -> list[str]:
        """One line per task, oldest first: ``task k_… exec_command on dev: running``."""
        tasks = sorted(self.tasks.values(), key=lambda t: (t.created_at, t.task_id))
        return [
            f"task {t.task_id} {t.tool} on {t.hand or '?'}: {self.task_phase(t)}"
            for t in tasks
        ]

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
            # A task's open state may move with transient events only (a
            # summary viewer never sees them): its terminal state is durable.
            "tasks": sorted(
                (t.task_id, t.state if _task_ended(t) else "open") for t in self.tasks.values()
            ),
        }


def tool_output(result: ToolOutput | None) -> str | None:
    """A tool's displayed output as one text: stdout, then stderr (on a line
    of its own), as the web face shows it; None when there is none to show."""
    if result is None:
        return None
    stdout, stderr = result.stdout, result.stderr
    if stdout and stderr and not stdout.endswith("\n"):
        stdout += "\n"
    return stdout + stderr


def _output_of(result: Any) -> ToolOutput | None:
    """A stored record's ``result`` (plain data) as the output it displays."""
    if not isinstance(result, dict):
        return None
    try:
        return msgspec.convert(result, ToolOutput)
    except msgspec.ValidationError:
        return None


def _task_ended(task: TaskView) -> bool:
    return OUTBOX.is_terminal(task.state)
