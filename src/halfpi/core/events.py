"""Mind → Face messages as typed values (DESIGN §4, docs/protocol.md §5).

Inbound commands are strict structs (``core/wire.py``); these are their
outbound counterparts, defined once and shared by the Mind, which encodes
them, and the SDK's reducer (``face/view.py``), which decodes them. A rule
that needs both sides — "every end of a chat keeps an assistant message",
"a summary viewer never sees arguments or output bodies" — is a method here,
so it is written once.

Two kinds of values:

- :class:`EventData`: the ``data`` of one ``face.event`` (``chat.started``,
  ``chat.tool_called``, ``approval.resolved`` …). Each knows its event type
  (:meth:`EventData.kind`) and its **summary projection**
  (:meth:`EventData.summary`): what a summary-mode viewer sees (I9).
- :class:`Outbound` payloads of session-level messages (``face.accepted``,
  ``face.result``, ``face.error``, ``face.snapshot``, ``face.reset``,
  ``face.evicted``, ``face.conversation.changed``, ``face.approval.pending`` /
  ``settled``); :func:`to_message` turns one into a shared :class:`Message`.

**A tolerant reader, an exact writer.** Every field a Face may miss has a
default, and decoding ignores unknown fields, so a Face reading a message
of an older or newer Mind takes what is there (a Face must never break on
a field it does not know). The Mind always sets every field; a field that
is *absent* on the wire unless it applies (``error_code``, transparent
``args``/``result``) is ``UNSET`` when it does not, and UNSET fields are
never encoded. The JSON is the one docs/protocol.md describes, field for
field and in the same order.

Pure: no I/O, no clock (``tests/core/test_purity.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from halfpi.core.outbound import Message
from halfpi.core.states import CHAT_EVENT_FOR_STATUS

_encode = msgspec.json.encode


def present(value: Any) -> Any:
    """``value``, or None where it is UNSET (absent on the wire)."""
    return None if value is UNSET else value


class Outbound(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every outbound value: frozen; unknown fields ignored on decode."""


# -- pieces several messages share ----------------------------------------------------


class ConversationInfo(Outbound, frozen=True, kw_only=True):
    """``{id, name, created_at}``: a conversation as lists and snapshots show it.
    ``name`` UNSET on decode means "not said" (keep what you have)."""

    id: str
    name: str | UnsetType | None = UNSET
    created_at: float = 0.0


class TokenUsage(Outbound, frozen=True, kw_only=True):
    """The tokens a reply's model used, summed over its requests (one per
    step), as the provider reported them; absent when it reported none."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    requests: int = 0


class MessageEntry(Outbound, frozen=True, kw_only=True):
    """One message of the conversation's history (``snapshot.messages``,
    ``face.conversation.messages``): the user's message has the ``seq`` of its
    ``chat.message``; a reply has the ``seq`` of its chat's terminal event."""

    seq: int
    role: str
    content: str
    request_id: str | None = None
    status: str | None = None
    ts: float = 0.0
    # Why a reply did not succeed: a stable code and one line for people.
    error_code: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    usage: TokenUsage | UnsetType = UNSET


class ToolOutput(Outbound, frozen=True, kw_only=True):
    """The displayed output of a tool call (transparent only, ≤ 1 MiB)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None


# -- face.event data --------------------------------------------------------------------


class EventData(Outbound, frozen=True, kw_only=True):
    """The ``data`` of one ``face.event``."""

    TYPE: ClassVar[str] = ""

    def kind(self) -> str:
        """The event type (``face.event.type``) this data is published as."""
        return self.TYPE

    def summary(self) -> EventData:
        """What a summary-mode viewer sees instead (I9): the same facts
        without argument or output bodies. ``self`` when nothing is hidden."""
        return self


class ChatMessage(EventData, frozen=True, kw_only=True):
    """``chat.message``: the user's message."""

    TYPE: ClassVar[str] = "chat.message"
    request_id: str | None = None
    role: str = "user"
    content: str = ""

    def entry(self, seq: int, ts: float) -> MessageEntry:
        """The message as the history keeps it."""
        return MessageEntry(
            seq=seq, role=self.role, content=self.content, request_id=self.request_id, ts=ts
        )


class ChatStarted(EventData, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "chat.started"
    request_id: str | None = None
    run_id: str | None = None


class ChatEnded(EventData, frozen=True, kw_only=True):
    """``chat.completed`` | ``chat.failed`` | ``chat.cancelled`` |
    ``chat.interrupted``, by ``status``; ``content`` is the final text."""

    request_id: str | None = None
    run_id: str | None = None
    status: str | None = None
    content: str = ""
    error_code: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    usage: TokenUsage | UnsetType = UNSET

    def kind(self) -> str:
        return CHAT_EVENT_FOR_STATUS[self.status or ""]

    def reply(self, seq: int, ts: float) -> MessageEntry:
        """**Every end keeps an assistant message** (docs/protocol.md §7) —
        with its status, its reason and whatever text it had — so a failed,
        cancelled or interrupted reply stays visible, live and after a resync.
        The Mind stores this; a Face's reducer appends it: one rule."""
        return MessageEntry(
            seq=seq,
            role="assistant",
            content=self.content,
            request_id=self.request_id,
            status=self.status,
            ts=ts,
            error_code=self.error_code,
            reason=self.reason,
            usage=self.usage,
        )


CHAT_END_EVENTS = frozenset(CHAT_EVENT_FOR_STATUS.values())


class ConversationChanged(EventData, frozen=True, kw_only=True):
    """``conversation.changed`` (in the log: a rename or a title), and the
    session-level ``face.conversation.changed`` (``created`` | ``renamed``)."""

    TYPE: ClassVar[str] = "conversation.changed"
    conversation: ConversationInfo
    change: str = "renamed"


class ToolCalled(EventData, frozen=True, kw_only=True):
    """``chat.tool_called`` (DESIGN §6): ``args`` only for a transparent admission."""

    TYPE: ClassVar[str] = "chat.tool_called"
    request_id: str | None = None
    tool_call_id: str
    tool: str = "?"
    args_digest: str = ""
    scan_warnings: list[str] = msgspec.field(default_factory=list)
    detail_mode: str = "summary"
    hand: str | None = None
    args: Any = UNSET

    def summary(self) -> ToolCalled:
        return self if self.args is UNSET else msgspec.structs.replace(self, args=UNSET)


class ToolCompleted(EventData, frozen=True, kw_only=True):
    """``chat.tool_completed``: lengths and digest always cover the full
    output; ``result`` (the display) only for a transparent admission."""

    TYPE: ClassVar[str] = "chat.tool_completed"
    request_id: str | None = None
    tool_call_id: str
    run_id: str | None = None
    tool: str = "?"
    status: str | None = None
    success: bool | None = None
    output_bytes: int | None = None
    digest: str | None = None
    truncated: bool = False
    error_category: str | None = None
    result: ToolOutput | UnsetType = UNSET

    def summary(self) -> ToolCompleted:
        return self if self.result is UNSET else msgspec.structs.replace(self, result=UNSET)


class ApprovalRequested(EventData, frozen=True, kw_only=True):
    """``approval.requested`` (DESIGN §7); also ``snapshot.pending_approvals``."""

    TYPE: ClassVar[str] = "approval.requested"
    approval_id: str
    request_id: str | None = None
    tool_call_id: str | None = None
    tool: str = "?"
    reason: str = ""
    args_digest: str = ""
    expires_at: float = 0.0
    args: Any = UNSET

    def summary(self) -> ApprovalRequested:
        return self if self.args is UNSET else msgspec.structs.replace(self, args=UNSET)


class ApprovalResolved(EventData, frozen=True, kw_only=True):
    """``approval.resolved``: ``decided_by_label`` when a person decided."""

    TYPE: ClassVar[str] = "approval.resolved"
    approval_id: str
    status: str | None = None
    decision: str | None = None
    decided_by: str | None = None
    tool_call_id: str | None = None
    decided_by_label: str | UnsetType = UNSET


class RunChanged(EventData, frozen=True, kw_only=True):
    """``run.changed``: a tool run's state; also ``snapshot.active_runs``."""

    TYPE: ClassVar[str] = "run.changed"
    run_id: str | None = None
    tool_call_id: str | None = None
    hand: str | None = None
    tool: str | None = None
    status: str | None = None


class HandConnected(EventData, frozen=True, kw_only=True):
    """``hand.connected``, in every conversation with a run on that Hand."""

    TYPE: ClassVar[str] = "hand.connected"
    hand_id: str | None = None
    generation: int | None = None


class HandDisconnected(HandConnected, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "hand.disconnected"


class HandLinkRefused(EventData, frozen=True, kw_only=True):
    """``hand.link_refused``: another link claimed the Hand while its link was
    connected and answering, and was refused (docs/hands.md), in every
    conversation with a run on that Hand. ``count``: refusals while this
    link holds the Hand (published for the 1st, 2nd, 4th, 8th…)."""

    TYPE: ClassVar[str] = "hand.link_refused"
    hand_id: str | None = None
    address: str | None = None
    count: int = 1


class TaskView(Outbound, frozen=True, kw_only=True):
    """A background task as Faces see it (DESIGN §8): the Mind's last known
    snapshot of it (``snapshot.tasks``, ``face.task.list|get``, every task
    event). ``stale``: its Hand is away, so the state may have moved on;
    ``args`` only for a transparent admission shown to a transparent viewer (I9)."""

    task_id: str
    conversation_id: str | None = None
    request_id: str | None = None
    hand: str | None = None
    tool: str = "?"
    state: str = "queued"
    stale: bool = False
    attempts: int = 0
    detail_mode: str = "summary"
    created_at: float = 0.0
    updated_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    log_bytes: int | None = None
    log_truncated: bool | None = None
    args: Any = UNSET

    def summary(self) -> TaskView:
        return self if self.args is UNSET else msgspec.structs.replace(self, args=UNSET)


class TaskEvent(EventData, frozen=True, kw_only=True):
    """``task.started`` (admitted, durable), ``task.progress`` (its state
    moved or its Hand came and went: transient, transparent viewers only)
    and ``task.completed`` (a terminal state, durable): each carries the
    task as it stands."""

    task: TaskView

    def summary(self) -> TaskEvent:
        task = self.task.summary()
        return self if task is self.task else msgspec.structs.replace(self, task=task)


class TaskStarted(TaskEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "task.started"


class TaskProgress(TaskEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "task.progress"


class TaskCompleted(TaskEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "task.completed"


# Every event type the Mind publishes, and the struct of its data.
EVENT_TYPES: dict[str, type[EventData]] = {
    ChatMessage.TYPE: ChatMessage,
    ChatStarted.TYPE: ChatStarted,
    **dict.fromkeys(sorted(CHAT_END_EVENTS), ChatEnded),
    ConversationChanged.TYPE: ConversationChanged,
    ToolCalled.TYPE: ToolCalled,
    ToolCompleted.TYPE: ToolCompleted,
    ApprovalRequested.TYPE: ApprovalRequested,
    ApprovalResolved.TYPE: ApprovalResolved,
    RunChanged.TYPE: RunChanged,
    HandConnected.TYPE: HandConnected,
    HandDisconnected.TYPE: HandDisconnected,
    HandLinkRefused.TYPE: HandLinkRefused,
    TaskStarted.TYPE: TaskStarted,
    TaskProgress.TYPE: TaskProgress,
    TaskCompleted.TYPE: TaskCompleted,
}


def decode_event(kind: str, data: Any) -> EventData | None:
    """The typed data of an event of type ``kind`` (from decoded JSON), or
    None for a type this version does not know (still a position in the
    log). Raises ``msgspec.ValidationError`` for data that is not what its
    type says."""
    cls = EVENT_TYPES.get(kind)
    return None if cls is None else msgspec.convert(data or {}, cls)


class FaceEvent(Outbound, frozen=True, kw_only=True):
    """``face.event`` without ``event_seq`` (each connection splices its own)."""

    conversation_id: str
    seq: int
    cursor: str
    type: str
    data: EventData
    ts: float


class ToolProgress(Outbound, frozen=True, kw_only=True):
    """``face.chat.tool.progress`` (transient, droppable; transparent only)."""

    conversation_id: str
    seq: int
    cursor: str
    request_id: str
    tool_call_id: str
    call_seq: int
    kind: str
    data: str
    gap: bool


# -- the snapshot (DESIGN §4.1) ------------------------------------------------------------


class PendingChat(Outbound, frozen=True, kw_only=True):
    request_id: str
    run_id: str | None = None
    status: str = "running"
    text_so_far: str = ""
    started_at: float = 0.0


class ToolRecord(Outbound, frozen=True, kw_only=True):
    """One stored tool-call display record (``snapshot.tool_history``), as of
    the snapshot's position: its completion fields only once it completed."""

    tool_call_id: str
    request_id: str | None = None
    tool: str = "?"
    detail_mode: str = "summary"
    args_digest: str = ""
    scan_warnings: list[str] = msgspec.field(default_factory=list)
    hand: str | None = None
    run_id: str | None = None
    status: str = "running"
    seq: int = 0
    args: Any = UNSET
    success: bool | UnsetType | None = UNSET
    output_bytes: int | UnsetType | None = UNSET
    digest: str | UnsetType | None = UNSET
    truncated: bool | UnsetType | None = UNSET
    error_category: str | UnsetType | None = UNSET
    result: Any = UNSET

    def summary(self) -> ToolRecord:
        if self.args is UNSET and self.result is UNSET:
            return self
        return msgspec.structs.replace(self, args=UNSET, result=UNSET)


class Snapshot(Outbound, frozen=True, kw_only=True):
    """``face.snapshot`` (with the ``request_id`` it answers) and the snapshot
    inside ``face.reset``: exactly the log up to ``cursor``."""

    TYPE: ClassVar[str] = "face.snapshot"
    request_id: str | UnsetType = UNSET
    conversation: ConversationInfo
    cursor: str
    epoch: str
    messages: list[MessageEntry] = msgspec.field(default_factory=list)
    has_more_older: bool = False
    pending_chats: list[PendingChat] = msgspec.field(default_factory=list)
    pending_approvals: list[ApprovalRequested] = msgspec.field(default_factory=list)
    active_runs: list[RunChanged] = msgspec.field(default_factory=list)
    tasks: list[TaskView] = msgspec.field(default_factory=list)
    tool_history: list[ToolRecord] = msgspec.field(default_factory=list)
    detail_mode: str | None = None

    def answering(self, request_id: str) -> Snapshot:
        """This snapshot as the reply to the command ``request_id``."""
        return msgspec.structs.replace(self, request_id=request_id)


# -- session-level messages -------------------------------------------------------------


class Accepted(Outbound, frozen=True, kw_only=True):
    """``face.accepted``: a command entered processing. Which fields it
    carries depends on the operation (docs/protocol.md §5, §6)."""

    TYPE: ClassVar[str] = "face.accepted"
    request_id: str
    operation: str
    conversation_id: str | UnsetType = UNSET
    run_id: str | UnsetType = UNSET
    cursor: str | UnsetType = UNSET
    target_request_id: str | UnsetType = UNSET
    approval_id: str | UnsetType = UNSET
    # face.subscribe only:
    replay: str | UnsetType = UNSET
    conversations: dict[str, str] | UnsetType = UNSET
    heads: dict[str, str] | UnsetType = UNSET


class Result(Outbound, frozen=True, kw_only=True):
    """``face.result``: the one terminal answer of a command. ``data`` is one
    of the ``*Outcome``/``*Page`` values below."""

    TYPE: ClassVar[str] = "face.result"
    request_id: str
    status: str
    content: str | UnsetType = UNSET
    data: Any = UNSET
    error_code: str | UnsetType = UNSET


class Error(Outbound, frozen=True, kw_only=True):
    """``face.error``: a refusal. Clients branch on ``code`` only."""

    TYPE: ClassVar[str] = "face.error"
    code: str
    message: str
    retryable: bool
    request_id: str | UnsetType = UNSET
    field: str | UnsetType = UNSET


class Reset(Outbound, frozen=True, kw_only=True):
    """``face.reset``: resume impossible; here is the truth, live from it (I4)."""

    TYPE: ClassVar[str] = "face.reset"
    conversation_id: str
    reason: str
    snapshot: Snapshot


class Evicted(Outbound, frozen=True, kw_only=True):
    """``face.evicted``: the last frame before 4008 (I7)."""

    TYPE: ClassVar[str] = "face.evicted"
    cursors: dict[str, str]


class ConversationNews(Outbound, frozen=True, kw_only=True):
    """``face.conversation.changed`` (session-level, docs/protocol.md §16):
    ``created`` or ``renamed``, to every Face that may read conversations."""

    TYPE: ClassVar[str] = "face.conversation.changed"
    conversation: ConversationInfo
    change: str


class ApprovalPending(Outbound, frozen=True, kw_only=True):
    """``face.approval.pending`` and a row of ``face.approval.list``: a summary,
    never the arguments, whatever the viewer's detail mode."""

    TYPE: ClassVar[str] = "face.approval.pending"
    conversation_id: str
    approval_id: str
    request_id: str | None = None
    tool: str = "?"
    reason: str = ""
    expires_at: float = 0.0


class ApprovalSettled(Outbound, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "face.approval.settled"
    conversation_id: str
    approval_id: str
    status: str | None = None


class Pong(Outbound, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "face.pong"
    request_id: str | UnsetType = UNSET


class Ping(Outbound, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "face.ping"
    ts: float


class Limits(Outbound, frozen=True, kw_only=True):
    max_frame_bytes: int
    max_chat_bytes: int
    reliable_queue_messages: int
    reliable_queue_bytes: int
    transient_queue_messages: int
    transient_queue_bytes: int


class Welcome(Outbound, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "face.welcome"
    principal_id: str
    label: str
    profile: str
    scopes: list[str]
    protocol: int
    node_id: str
    heartbeat_s: float
    limits: Limits
    replay_safe: list[str]
    features: list[str]


# -- face.result data -------------------------------------------------------------------


class ChatOutcome(Outbound, frozen=True, kw_only=True):
    """A chat's result ``data``: ``cursor`` is the position of its terminal event."""

    conversation_id: str
    run_id: str
    cursor: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    usage: TokenUsage | UnsetType = UNSET


class Created(Outbound, frozen=True, kw_only=True):
    conversation_id: str
    name: str | None
    created_at: float


class Renamed(Outbound, frozen=True, kw_only=True):
    conversation_id: str
    name: str


class CancelOutcome(Outbound, frozen=True, kw_only=True):
    """A cancel's result ``data``: ``cancelled`` if the target ended so, else
    ``already_finished`` with the state that stands (I10)."""

    outcome: str
    target_request_id: str | UnsetType = UNSET
    run_id: str | UnsetType = UNSET
    task_id: str | UnsetType = UNSET
    target_status: str


class Resolution(Outbound, frozen=True, kw_only=True):
    """How an approval stands (DESIGN §7)."""

    approval_id: str
    status: str
    decision: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None


class ApprovalOutcome(Outbound, frozen=True, kw_only=True):
    """``applied`` for the winner, ``already_resolved`` for every later decider."""

    outcome: str
    resolution: Resolution


class Interrupted(Outbound, frozen=True, kw_only=True):
    """The result of a request left open by a Mind that stopped."""

    reason: str


class ConversationPage(Outbound, frozen=True, kw_only=True):
    conversations: list[ConversationInfo]
    has_more: bool


class MessagePage(Outbound, frozen=True, kw_only=True):
    messages: list[MessageEntry]
    has_more_older: bool


class ApprovalPage(Outbound, frozen=True, kw_only=True):
    approvals: list[ApprovalPending]


class HandPage(Outbound, frozen=True, kw_only=True):
    hands: list[dict[str, Any]]


class TaskPage(Outbound, frozen=True, kw_only=True):
    tasks: list[TaskView]


class TaskLogPage(Outbound, frozen=True, kw_only=True):
    """``face.task.log``: a page of the task's log as its Hand keeps it.
    ``data`` (UTF-8, invalid bytes replaced) only for a transparent
    admission read by a transparent viewer (I9); the offsets always."""

    task_id: str
    offset: int
    next_offset: int
    truncated: bool
    state: str
    data: str | UnsetType = UNSET


class Empty(Outbound, frozen=True, kw_only=True):
    pass


# What a command is answered with (a one-shot caller's typed replies).
Reply = Accepted | Result | Snapshot | Pong | Error
REPLIES: dict[str, type[Reply]] = {
    cls.TYPE: cls for cls in (Accepted, Result, Snapshot, Pong, Error)
}


def to_message(payload: Outbound) -> Message:
    """A reliable session-level message (no conversation position) of a
    payload that names its own type (``Accepted``, ``Result``, ``Reset`` …)."""
    type_ = getattr(payload, "TYPE", "")
    assert type_, f"{type(payload).__name__} does not name a message type"
    return Message(type_, _encode(payload))


def builtins(payload: Outbound) -> dict[str, Any]:
    """``payload`` as plain data, as the request registry stores it
    (``RequestRecord.accepted`` / ``.result``): UNSET fields left out."""
    value = msgspec.to_builtins(payload)
    assert isinstance(value, dict)
    return value
