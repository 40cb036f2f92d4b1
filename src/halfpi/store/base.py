"""The Store seam: the durable source of truth (DESIGN §1), as a Protocol.

SQLite (default) implements it here; PostgreSQL implements the same
Protocol for cluster mode. Writes are described as data (:class:`WriteTx`)
so a backend can group many of them into one commit (group commit) without
knowing what they mean, and so the same transaction is portable SQL-wise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from halfpi.core.limits import RequestRetention
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.core.states import CHAT_EVENT_FOR_STATUS, OUTBOX, REQUEST, RUN_TERMINAL
from halfpi.errors import IllegalTransition


@dataclass(frozen=True, slots=True)
class Credential:
    principal_id: str
    label: str
    kind: str  # "face" | "hand"
    profile: str
    scopes: frozenset[str]
    token_hash: str
    created_at: float
    revoked_at: float | None = None

    @property
    def live(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class ConversationRow:
    conversation_id: str
    name: str | None
    created_at: float
    created_by: str | None = None
    # The journal epoch its cursors carry (DESIGN §3): the Store's, written by
    # the Mind when the journal starts a new window of continuity; None until
    # a Mind first loads the conversation.
    epoch: str | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    conversation_id: str
    seq: int
    type: str
    data: bytes  # JSON
    ts: float


# The events that end a run, and the id naming that run in their data.
_TERMINAL_EVENTS: dict[str, tuple[str, str]] = {
    **{t: ("chat", "run_id") for t in CHAT_EVENT_FOR_STATUS.values()},
    "chat.tool_completed": ("tool", "tool_call_id"),
    "approval.resolved": ("approval", "approval_id"),
    "run.changed": ("run", "run_id"),  # terminal only with a terminal status
}


TERMINAL_EVENT_TYPES = frozenset(_TERMINAL_EVENTS)


def terminal_of(event: StoredEvent) -> str | None:
    """The run an event ends, as a key unique across the log
    (``chat:<run_id>``, ``tool:<tool_call_id>``, ``approval:<approval_id>``,
    ``run:<tool run id>``), or None if the event ends nothing.

    Every backend stores it under a uniqueness constraint, so no bug can
    record two outcomes for one run (I10, DESIGN §12). Derived here from the
    event itself, not passed by callers: a caller cannot forget it."""
    kind = _TERMINAL_EVENTS.get(event.type)
    if kind is None:
        return None
    data = msgspec.json.decode(event.data)
    if not isinstance(data, dict):
        return None
    if event.type == "run.changed" and data.get("status") not in RUN_TERMINAL:
        return None
    ident = data.get(kind[1])
    return None if ident is None else f"{kind[0]}:{ident}"


@dataclass(frozen=True, slots=True)
class MessageRow:
    conversation_id: str
    seq: int
    role: str  # "user" | "assistant"
    content: str
    request_id: str | None
    status: str | None
    ts: float
    # Why a reply did not succeed: a stable code and one line for people.
    error_code: str | None = None
    reason: str | None = None
    # The tokens a reply's model used ({prompt_tokens, completion_tokens,
    # total_tokens, requests}), when the provider said.
    usage: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class ChatRunRow:
    """One chat run: the agent answering one chat request (DESIGN §5), in
    the ``runs`` table. Not a :class:`ToolRunRow` (a command on a Hand)."""

    run_id: str
    conversation_id: str
    request_id: str
    principal_id: str
    status: str
    started_at: float
    finished_at: float | None = None
    content: str | None = None
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class TextAppend:
    """A text checkpoint after the first (DESIGN §5): ``text`` goes on the
    end of the run's saved ``content``. Only what was shown since the last
    save travels, so a long reply costs the Mind O(new text) per save; the
    Mind sends one at a time per run, each on a save that committed."""

    run_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallRow:
    """The persisted display record of one tool call (DESIGN §6), written in
    two steps: at the call (args projection) and at completion (result
    projection). A summary admission stores ``args``/``result`` as None."""

    tool_call_id: str
    conversation_id: str
    chat_run_id: str
    request_id: str
    tool: str
    detail_mode: str
    args_digest: str
    args: Any
    scan_warnings: tuple[str, ...]
    called_seq: int
    status: str
    created_at: float
    hand_id: str | None = None
    run_id: str | None = None
    success: bool | None = None
    output_bytes: int | None = None
    digest: str | None = None
    truncated: bool | None = None
    error_category: str | None = None
    result: Any = None
    completed_seq: int | None = None
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    approval_id: str
    conversation_id: str
    request_id: str
    tool_call_id: str
    tool: str
    reason: str
    args_digest: str
    args: Any
    detail_mode: str
    status: str
    created_at: float
    expires_at: float
    decision: str | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
    decided_at: float | None = None


@dataclass(frozen=True, slots=True)
class ToolRunRow:
    """One tool run: a command a Hand executes for a tool call, in the
    ``tool_runs`` table. Not a :class:`ChatRunRow` (an agent's answer)."""

    run_id: str
    tool_call_id: str
    conversation_id: str
    hand_id: str
    tool: str
    status: str
    created_at: float
    finished_at: float | None = None
    exit_code: int | None = None
    output_bytes: int | None = None
    digest: str | None = None


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A background task in the Mind's durable outbox (DESIGN §8, docs/hands.md).

    Created (``WriteTx.tasks``) in the transaction that admits its request
    and writes its event, in state ``queued``, due at ``next_attempt_at``.
    Then changed only by :class:`TaskUpdate`: the dispatcher's attempts, the
    Hand's receipts, refusals and updates. ``args`` is what is delivered,
    kept whole for a redelivery after a restart (a Face is to be shown it
    only as projected by ``detail_mode``); ``digest`` is :func:`halfpi.core.tasks.task_digest`
    of tool, args and timeout. Times are the Mind's clock."""

    task_id: str
    delivery_id: str
    conversation_id: str
    hand_id: str  # the Hand's principal
    hand_label: str
    tool: str
    args: Any
    timeout_s: float | None
    digest: str
    detail_mode: str
    principal_id: str  # who asked, and the request that admitted it
    request_id: str
    created_at: float
    next_attempt_at: float
    state: str = OUTBOX.initial
    approved: bool = False  # a human allowed it (sent with each delivery)
    attempts: int = 0
    updated_at: float | None = None  # None: created_at
    delivered_at: float | None = None  # the first receipt: the Hand has it
    hand_task_id: str | None = None  # the Hand's own id for it
    answer: Any = None  # the Hand's last receipt or refusal, as it sent it
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    log_bytes: int | None = None
    log_truncated: bool | None = None

    def __post_init__(self) -> None:
        if self.updated_at is None:
            object.__setattr__(self, "updated_at", self.created_at)

    @property
    def terminal(self) -> bool:
        return OUTBOX.is_terminal(self.state)


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    """A change to one task's outbox row: each field given (not None) is
    set, the others stay; ``at`` becomes its ``updated_at``.

    The Store applies it by the outbox's state table (``core.states.OUTBOX``),
    in the database: a move the table does not allow fails the write, and
    once the task is terminal its outcome (state, times, exit code, error,
    log size, attempts) never changes again — the same terminal state again
    is harmless, another one fails the whole write with
    :class:`~halfpi.errors.TerminalExists` (I10: the first terminal state
    wins). ``answer`` and ``at`` are always recorded; ``delivered_at`` keeps
    the first one given. An update of an unknown task changes nothing."""

    task_id: str
    at: float
    state: str | None = None
    attempts: int | None = None
    next_attempt_at: float | None = None
    delivered_at: float | None = None
    hand_task_id: str | None = None
    answer: Any = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    log_bytes: int | None = None
    log_truncated: bool | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in OUTBOX.states:
            raise IllegalTransition(f"outbox: {self.state!r} is not a task state")


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """Moves an accepted request record to its terminal result."""

    principal_id: str
    request_id: str
    status: str
    result: dict[str, Any]
    finished_at: float

    def __post_init__(self) -> None:
        REQUEST.check(REQUEST.initial, self.status)  # an outcome, or it raises


@dataclass(frozen=True, slots=True)
class Fence:
    """The fencing token a write carries in cluster mode (DESIGN §10): the
    node's lease token for ``conversation_id``, which increases on every
    take-over. A backend that fences (PostgreSQL) checks it in the same
    transaction as the write: a token older than the highest it has seen for
    the conversation fails the write with :class:`~halfpi.errors.FencedOut`;
    a newer one becomes the highest. A write with only a fence claims the
    conversation. SQLite ignores fences: one Mind per home (the home lock)
    leaves nothing to fence."""

    conversation_id: str
    token: int


@dataclass(slots=True)
class WriteTx:
    """One atomic write. ``admit`` is inserted only if its key is new; if the
    key exists the whole transaction is dropped and the outcome carries the
    existing record (or tombstone) instead — I5's backstop under races."""

    # Empty tuples by default: a write allocates only what it carries (the
    # plain event append, the hot path, carries one list).
    admit: RequestRecord | None = None
    conversations: Sequence[ConversationRow] = ()
    events: Sequence[StoredEvent] = ()
    messages: Sequence[MessageRow] = ()
    chat_runs: Sequence[ChatRunRow] = ()
    # text appended to runs' saved content (applied after ``chat_runs``)
    run_text: Sequence[TextAppend] = ()
    finished: Sequence[FinishedRequest] = ()
    tool_calls: Sequence[ToolCallRow] = ()
    approvals: Sequence[ApprovalRow] = ()
    tool_runs: Sequence[ToolRunRow] = ()
    # background tasks: new outbox rows (a task id or delivery id already
    # there fails the write), then changes to rows (applied after the new ones)
    tasks: Sequence[TaskRow] = ()
    task_updates: Sequence[TaskUpdate] = ()
    # (conversation_id, seq): seqs up to it may be shown (DESIGN I2, across restarts)
    seq_reservations: Sequence[tuple[str, int]] = ()
    # (conversation_id, name): a rename or an automatic title
    conversation_names: Sequence[tuple[str, str]] = ()
    # (conversation_id, epoch): the journal lost continuity; cursors carry this now
    epochs: Sequence[tuple[str, str]] = ()
    # the writer's fencing token for its conversation (cluster mode), else None
    fence: Fence | None = None
    # (key, value) rows of the meta table to set: the readiness probe's own
    # write, a real one (a row changes, pages are written) as a chat's is
    meta: Sequence[tuple[str, str]] = ()

    @property
    def only_events(self) -> bool:
        """True when the write carries events and nothing else: the writer
        merges such writes into one insert. Derived from the fields, so a
        new kind of write can never be mistaken for a plain append."""
        return not any(_ALL_BUT_EVENTS(self))


# Every field of WriteTx except ``events``, read at C speed (the hot path).
_ALL_BUT_EVENTS = operator.attrgetter(
    *(f.name for f in dataclasses.fields(WriteTx) if f.name != "events")
)


@dataclass(frozen=True, slots=True)
class TxOutcome:
    existing: RequestRecord | Tombstone | None = None

    @property
    def committed(self) -> bool:
        return self.existing is None


COMMITTED = TxOutcome()


@dataclass(frozen=True, slots=True)
class MessagePage:
    messages: list[MessageRow]
    has_more_older: bool


class Store(Protocol):
    """Everything the Mind must not lose. All methods may raise StoreError."""

    # True when the database refused the last group commit as a whole (a full
    # disk, a lost connection), until a later one commits: ``/readyz`` reads it.
    last_commit_failed: bool

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def write(self, tx: WriteTx) -> asyncio.Future[TxOutcome]:
        """Queue ``tx`` for a group commit; the future resolves once it is durable.

        A future (not a coroutine) so the actor can attach its publication
        step as a done-callback: events are shown the moment they commit.
        """
        ...

    async def get_request(
        self, principal_id: str, request_id: str
    ) -> RequestRecord | Tombstone | None: ...

    async def prune_requests(self, now: float, retention: RequestRetention) -> int:
        """Turn terminal records past retention into tombstones (DESIGN §5)."""
        ...

    async def get_conversation(self, conversation_id: str) -> ConversationRow | None: ...

    async def list_conversations(self, limit: int, before: str | None) -> list[ConversationRow]: ...

    async def head_seq(self, conversation_id: str) -> int:
        """Highest seq the conversation may have shown: its highest committed
        event or its seq reservation, whichever is higher (0 if none)."""
        ...

    async def fence_of(self, conversation_id: str) -> int:
        """The highest fencing token a write of the conversation carried (0:
        none; always 0 where the backend does not fence). A node taking the
        conversation over asks its lease for a larger one."""
        ...

    async def messages(
        self, conversation_id: str, *, limit: int, before_seq: int | None, max_seq: int | None
    ) -> MessagePage: ...

    async def chat_run_for_request(
        self, conversation_id: str, request_id: str, principal_id: str | None = None
    ) -> ChatRunRow | None:
        """The newest chat run of ``request_id`` in the conversation, of
        ``principal_id`` if given, else of any principal."""
        ...

    async def tool_history(
        self, conversation_id: str, *, max_seq: int, limit: int
    ) -> list[ToolCallRow]:
        """The newest tool-call records called at or before ``max_seq``, oldest first."""
        ...

    async def get_approval(self, approval_id: str) -> ApprovalRow | None: ...

    async def get_tool_run(self, run_id: str) -> ToolRunRow | None: ...

    async def open_approvals(self) -> Sequence[ApprovalRow]: ...

    async def open_tool_calls(self) -> Sequence[ToolCallRow]: ...

    async def open_tool_runs(self) -> Sequence[ToolRunRow]: ...

    async def get_task(self, task_id: str) -> TaskRow | None: ...

    async def task_for_delivery(self, delivery_id: str) -> TaskRow | None:
        """The task a delivery id belongs to (a Hand's receipt names it)."""
        ...

    async def list_tasks(
        self,
        *,
        limit: int,
        before: str | None = None,
        conversation_id: str | None = None,
        hand_id: str | None = None,
        states: Sequence[str] | None = None,
    ) -> list[TaskRow]:
        """Tasks newest first (``created_at``, then ``task_id``), filtered by
        conversation, Hand and states when given; ``before`` is the
        ``task_id`` of the last task of the previous page."""
        ...

    async def due_tasks(self, now: float, limit: int) -> list[TaskRow]:
        """The deliveries that are due: tasks no Hand has acknowledged
        (``delivered_at`` unset), not terminal, ``next_attempt_at <= now``;
        the most overdue first (``next_attempt_at``, ``created_at``,
        ``task_id``), at most ``limit``."""
        ...

    async def open_chat_runs(self) -> Sequence[ChatRunRow]:
        """Chat runs that were not terminal when the Mind stopped (for recovery)."""
        ...

    async def open_requests(self) -> Sequence[RequestRecord]:
        """Accepted, non-terminal request records (for recovery)."""
        ...

    async def events(
        self, conversation_id: str, after_seq: int, limit: int
    ) -> list[StoredEvent]: ...

    # Credentials (I8): the Mind reads them, the CLI adds, lists and revokes
    # them, possibly from another process while the Mind runs.

    async def credentials(self) -> list[Credential]:
        """Every credential, live and revoked, oldest first."""
        ...

    async def credentials_version(self) -> int:
        """A number that changes whenever any process adds or revokes a
        credential on this storage. The Mind polls it (``credential_poll_s``)
        and re-reads the credentials when it moved, so a revocation closes
        live connections within a second."""
        ...

    async def add_credential(self, credential: Credential) -> None:
        """Store a new credential. Raises :class:`~halfpi.errors.LabelInUse`
        when a live credential of the same kind has its label."""
        ...

    async def revoke_credential(self, kind: str, label: str, now: float) -> bool:
        """Revoke the live credential of ``kind`` labelled ``label`` (the label
        is free again); False if there is none."""
        ...
