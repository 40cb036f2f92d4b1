"""The conversation actor: single writer of one conversation (DESIGN §1, I2, I3).

Everything that changes a conversation goes through its actor, on the event
loop thread, so the actor's synchronous sections are its mailbox order. The
actor assigns ``seq``, stages events in an outbox, and *publishes* them —
to the journal, to its in-memory view and to subscribed connections — only
once they and every committed event before them have committed (I3). The
publication step runs as the store future's done-callback, so an event is
shown the moment it is committed, never before.

**One way to append.** Every other part of the Mind (tool calls, approvals,
recovery, Hand presence) appends through :meth:`ConversationActor.stage`
(a typed event, a ``seq``, encoded once) and :meth:`ConversationActor.commit`
(those events with the rows they go with, in one transaction; each shown
once committed, then its ``on_shown`` hook), or :meth:`append` for one
event. The actor's in-memory view (pending approvals, active tool runs) is
a fold of what it published, so it can never disagree with the log.

An actor is given what it needs — an :class:`ActorEnv`: the store, the
journal, the clock, the chat driver and where results and news go — not
the Mind around it. It does not run the agent or tools itself: the chat
driver (``mind/chat.py``) does, and appends through this API.

**Loaded while it works.** The Mind unloads an actor that is :meth:`idle`
(no subscriber, no chat, nothing shown pending, nothing waiting to commit or
to reach the journal) for long enough; the journal drops its window, the
Store keeps its epoch. Whoever still holds an unloaded actor cannot write
through it (:meth:`stage` refuses, ``unavailable``): the next load is the
one writer (I2). What it published it rebuilds for a replay, from journal
entries (:meth:`message_of`) or, below the journal, from the Store
(:meth:`committed_after`), byte for byte as it was sent live.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from halfpi.core.backoff import backoff
from halfpi.core.cursor import encode_cursor
from halfpi.core.events import (
    EVENT_TYPES,
    Accepted,
    ApprovalRequested,
    ApprovalResolved,
    ChatEnded,
    ChatMessage,
    ChatOutcome,
    ChatStarted,
    ConversationChanged,
    ConversationInfo,
    ConversationNews,
    EventData,
    FaceEvent,
    Outbound,
    PendingChat,
    Renamed,
    Result,
    RunChanged,
    Snapshot,
    TaskView,
    TokenUsage,
    ToolProgress,
    builtins,
)
from halfpi.core.ids import new_run_id
from halfpi.core.outbound import DELTA, PROGRESS, RELIABLE, Message
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.core.states import CHAT
from halfpi.core.timers import Timer
from halfpi.core.titles import title_from_message
from halfpi.errors import Busy, FencedOut, StoreError, TerminalExists, Unavailable
from halfpi.journal.base import Journal, JournalEntry, entry_of, message_of
from halfpi.mind.counters import MindMetrics
from halfpi.mind.records import message_entry, message_row, tool_record
from halfpi.store.base import (
    ChatRunRow,
    ConversationRow,
    Fence,
    FinishedRequest,
    Store,
    StoredEvent,
    TextAppend,
    TxOutcome,
    WriteTx,
)

if TYPE_CHECKING:
    from halfpi.mind.hands import ToolRun

log = logging.getLogger("halfpi.actor")

_encode = msgspec.json.encode


@dataclass(slots=True)
class ActorEnv:
    """What every actor needs from the Mind around it, passed explicitly.

    One value shared by all actors of a Mind: swapping its ``store`` (tests
    do, to hold or fail commits) reaches every actor at once."""

    store: Store
    journal: Journal
    # Wall time: what events and rows are stamped with (``ts``, ``started_at``).
    clock: Callable[[], float]
    # Monotonic time: every duration (idle time, the checkpoint interval, a
    # chat's length), so a step of the wall clock changes none of them.
    monotonic: Callable[[], float]
    # Waits ``seconds`` (injected: tests advance time themselves).
    sleep: Callable[[float], Awaitable[object]]
    # Runs an admitted chat to its end (``mind/chat.py``).
    drive: Callable[[ConversationActor, ChatRun], Coroutine[Any, Any, None]]
    # A terminal ``face.result`` payload, to whoever waits for that request.
    deliver: Callable[[str, str, dict[str, Any]], None]
    # A session-level message to every Face that may read conversations.
    announce: Callable[[Outbound], None]
    tool_history: int = 50
    draining: bool = False
    # The text-so-far checkpoint (DESIGN §5): at most this many seconds or
    # characters behind what was shown (None: never, for benchmarks' baseline),
    # and the Mind's timer that saves a reply whose stream stalled.
    checkpoint_s: float | None = 1.0
    checkpoint_chars: int = 4096
    call_later: Callable[..., Timer] | None = None
    # Cluster mode: a write was refused for its fencing token (another node
    # owns the conversation now): the Mind steps down for it.
    fenced_out: Callable[[str], None] | None = None
    # What /metrics reads (mind/metrics.py): plain ints, counted here.
    metrics: MindMetrics = field(default_factory=MindMetrics)
    # The conversation's background tasks as Faces see them (snapshot.tasks).
    tasks: Callable[[str], Awaitable[list[TaskView]]] | None = None


class Receiver(Protocol):
    def send(self, message: Message) -> None: ...


class Listener(Protocol):
    """A subscription as the actor publishes to it (``mind/subscriptions.py``)."""

    @property
    def live(self) -> bool: ...

    @property
    def detail_mode(self) -> str: ...

    @property
    def session(self) -> Receiver: ...

    @property
    def owner(self) -> Any:
        """The connection's subscriptions (``Subscriptions``): where a
        subscription is moved from, when its conversation changes hands."""
        ...

    def wants(self, message: Message) -> bool: ...


class ChatRun:
    """One admitted chat, from ``chat.started`` to its terminal event."""

    __slots__ = (
        "began",
        "completed_calls",
        "content",
        "detail_mode",
        "done",
        "ending",
        "principal_id",
        "request_id",
        "retry_wait",
        "run_id",
        "save_timer",
        "saved_at",
        "saved_chars",
        "saved_pieces",
        "saving",
        "started_at",
        "state",
        "stop_reason",
        "stop_why",
        "task",
        "text",
        "text_chars",
        "tool_runs",
        "visible_chars",
        "visible_text",
    )

    def __init__(
        self,
        run_id: str,
        request_id: str,
        principal_id: str,
        content: str,
        started_at: float,
        detail_mode: str = "transparent",
        *,
        began: float,
    ) -> None:
        self.run_id = run_id
        self.request_id = request_id
        self.principal_id = principal_id
        self.content = content
        self.started_at = started_at  # wall time, shown and stored
        self.began = began  # the same moment on the monotonic clock (durations)
        self.state = CHAT.initial
        self.text: list[str] = []  # every delta produced so far
        self.text_chars = 0  # their length
        self.visible_text: list[str] = []  # deltas published so far (snapshot)
        self.visible_chars = 0  # their length: what a checkpoint can save
        self.task: asyncio.Task[None] | None = None
        # Frozen at admission (I9): every tool call of this chat inherits it.
        self.detail_mode = detail_mode
        self.tool_runs: dict[str, ToolRun] = {}
        self.completed_calls: set[str] = set()  # tool calls whose end is recorded
        self.stop_reason: str | None = None
        # The terminal status decided but not yet committed (``state`` moves
        # to it once it is): the chat is still pending until then.
        self.ending: str | None = None
        # The backoff wait between attempts to commit the end, if one runs.
        self.retry_wait: asyncio.Future[object] | None = None
        self.stop_why: str | None = None  # one line for people: who or what stopped it
        # The text-so-far checkpoint (DESIGN §5): when, and how much was saved;
        # the timer that saves what a stalled stream showed since.
        self.saved_at = began
        self.saved_chars = 0
        self.saved_pieces = 0  # of visible_text: the rest is what the next save appends
        # A save in flight: the next one appends on top of it only once it
        # committed (one at a time; after a failure the next saves it whole).
        self.saving = False
        self.save_timer: Timer | None = None
        # Resolves with the terminal status once it is committed.
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def pending_view(self) -> PendingChat:
        return PendingChat(
            request_id=self.request_id,
            run_id=self.run_id,
            status=self.state,
            text_so_far="".join(self.visible_text),
            started_at=self.started_at,
        )


@dataclass(slots=True)
class Staged:
    """One event with its ``seq``, encoded, waiting to be committed."""

    message: Message
    event: StoredEvent
    data: EventData
    # Runs once the event is shown (after it, and all before it, committed).
    on_shown: Callable[[], None] | None = None

    @property
    def seq(self) -> int:
        return self.message.seq

    @property
    def cursor(self) -> str:
        assert self.message.cursor is not None
        return self.message.cursor


# An outbox entry: a message (None: a reservation barrier), the commit it
# waits for (None: a transient message behind committed ones), and what was
# staged with it (its view update and hook).
_Entry = tuple[Message | None, asyncio.Future[TxOutcome] | None, Staged | None]

SEQ_BLOCK = 4096

# Committing a chat's end is retried until the Store takes it (a full disk,
# a lost database connection): 0.25 s, doubling, at most 30 s apart.
END_RETRY_INITIAL_S = 0.25
END_RETRY_CAP_S = 30.0


def event_message(
    conversation_id: str, kind: str, data: EventData, now: float, seq: int, cursor: str
) -> Message:
    """The ``face.event`` message of one event of a conversation."""
    body = _encode(
        FaceEvent(
            conversation_id=conversation_id, seq=seq, cursor=cursor, type=kind, data=data, ts=now
        )
    )
    return Message("face.event", body, conversation_id=conversation_id, seq=seq, cursor=cursor)


def stored_message(conversation_id: str, epoch: str, event: StoredEvent) -> Message:
    """A committed event from the Store, rebuilt as it was sent live: the
    stored data is the event's JSON as encoded live (spliced in raw, the body
    is the same bytes); the summary variant is derived from the typed data
    the way :meth:`ConversationActor.stage` derived it (I9)."""
    seq, kind, ts = event.seq, event.type, event.ts
    cursor = encode_cursor(epoch, seq)
    raw: Any = msgspec.Raw(event.data)
    message = event_message(conversation_id, kind, raw, ts, seq, cursor)
    cls = EVENT_TYPES.get(kind)
    if cls is not None:
        data = msgspec.json.decode(event.data, type=cls)
        summary = data.summary()
        if summary is not data:
            message.with_summary(event_message(conversation_id, kind, summary, ts, seq, cursor))
    return message


async def committed_after(
    store: Store, conversation_id: str, epoch: str, after_seq: int, until: int, limit: int
) -> tuple[list[Message], int]:
    """The committed events of a conversation in ``(after_seq, until]`` from the
    Store, at most ``limit``, rebuilt as they were sent live (with their
    summary variant, I9); and the seq read up to (``until`` once all are read)."""
    events = await store.events(conversation_id, after_seq, limit)
    inside = [e for e in events if e.seq <= until]
    read = inside[-1].seq if len(inside) == limit else until
    return [stored_message(conversation_id, epoch, e) for e in inside], read


class ConversationActor:
    def __init__(self, env: ActorEnv, row: ConversationRow, head: int, epoch: str) -> None:
        """``head``: the highest seq the conversation may have shown (the
        Store's); ``epoch``: the one the Store holds for it, which the
        journal continues (``Mind.actor`` opens the window)."""
        self.env = env
        self.row = row
        self.id = row.conversation_id
        self.epoch = epoch
        self.next_seq = head + 1
        self.published = head
        # When it last published, and when the Mind last handed it out: the
        # idle time the unloading counts from (the Mind's monotonic clock).
        self.active_at = self.used_at = env.monotonic()
        # Set once the Mind unloaded it: it never writes again (I2).
        self.unloaded = False
        # The last journal append still under way (None: all are in).
        self._journaling: asyncio.Future[None] | None = None
        # Live subscriptions, by their connection (``add_listener``).
        self.subscribers: dict[object, Listener] = {}
        self.reserved = head  # seqs up to here are durably reserved
        self._outbox: deque[_Entry] = deque()
        self.chat_run: ChatRun | None = None  # the admitted, not yet finished chat
        # The in-memory view, as published (what a snapshot shows):
        self.visible_chat_runs: dict[str, ChatRun] = {}  # started and not yet ended
        self.visible_approvals: dict[str, ApprovalRequested] = {}  # requested, not resolved
        self.visible_tool_runs: dict[str, RunChanged] = {}  # queued or running
        # A name is set or on its way: no automatic title may overwrite it.
        self.named = row.name is not None
        # Cluster mode: the lease's fencing token every write carries (the
        # Store refuses it once another node took over, DESIGN §10).
        self.fence: Fence | None = None

    def wall(self) -> float:
        """Wall time, for stamps (durations count on ``env.monotonic``)."""
        return self.env.clock()

    def cursor(self, seq: int) -> str:
        return encode_cursor(self.epoch, seq)

    # -- listeners ---------------------------------------------------------------

    def add_listener(self, key: object, listener: Listener) -> None:
        """``listener`` receives every event published from now on (while it
        says it is ``live``), in its detail mode; one per ``key``."""
        self.subscribers[key] = listener

    def remove_listener(self, key: object) -> None:
        self.subscribers.pop(key, None)

    # -- loaded while it works -------------------------------------------------------

    def idle(self) -> bool:
        """Nothing would be lost by unloading it now: no subscriber, no chat
        (running, or its end not yet shown), no approval or tool run shown
        pending, nothing waiting to commit or to reach the journal."""
        journaling = self._journaling
        return (
            not self.subscribers
            and self.chat_run is None
            and not self.visible_chat_runs
            and not self.visible_approvals
            and not self.visible_tool_runs
            and not self._outbox
            and (journaling is None or journaling.done())
        )

    def idle_since(self) -> float:
        return max(self.active_at, self.used_at)

    async def journaled(self) -> None:
        """Every published message is in the journal (a reader that must not
        miss one waits for this; an in-process journal is never behind)."""
        journaling = self._journaling
        if journaling is not None and not journaling.done():
            await asyncio.shield(journaling)

    def message_of(self, entry: JournalEntry) -> Message:
        """A journal entry of this conversation as it was sent live."""
        return message_of(self.id, self.epoch, entry)

    async def committed_after(
        self, after_seq: int, until: int, limit: int
    ) -> tuple[list[Message], int]:
        """The committed events in ``(after_seq, until]`` from the Store, at
        most ``limit``, rebuilt as they were sent live (with their summary
        variant, I9); and the seq read up to (``until`` once all are read)."""
        return await committed_after(self.env.store, self.id, self.epoch, after_seq, until, limit)

    # -- the append API (I3) -----------------------------------------------------

    def stage(
        self,
        data: EventData,
        now: float | None = None,
        *,
        on_shown: Callable[[], None] | None = None,
    ) -> Staged:
        """Stage one event: take its ``seq`` and encode it once (with its
        summary variant when that differs, I9). ``data`` is already a
        display projection (never raw tool arguments). Nothing is shown
        until :meth:`commit`; ``on_shown`` runs once it is.

        Raises :class:`Unavailable` (retryable) on an actor the Mind has
        unloaded: the conversation's writer is the one loaded now (I2)."""
        if self.unloaded:
            raise Unavailable("the conversation was unloaded while this command waited; retry")
        now = self.wall() if now is None else now
        seq = self._take_seq()
        cursor = self.cursor(seq)
        kind = data.kind()
        message = self._event_message(kind, data, now, seq, cursor)
        summary = data.summary()
        if summary is not data:
            message.with_summary(self._event_message(kind, summary, now, seq, cursor))
        return Staged(message, StoredEvent(self.id, seq, kind, _encode(data), now), data, on_shown)

    def commit(self, *staged: Staged, tx: WriteTx | None = None) -> asyncio.Future[TxOutcome]:
        """Commit ``staged`` events and the rows of ``tx`` in one transaction.
        Each event is shown — journal, view, subscribers, then its hook — once
        it and every committed event before it committed (I3); one that never
        commits is never shown.

        Shielded: a cancelled caller (a cancelled chat) must not cancel the
        write itself — it commits regardless, and what commits is shown."""
        events = [s.event for s in staged]
        if tx is None:
            tx = WriteTx(events=events, fence=self.fence)
        else:
            # Completed in place (a copy costs more than the rest of the
            # call): ``tx`` is the caller's, built for this commit.
            assert not tx.events or tx.events == events, "events come staged, never as rows"
            tx.events = events
            tx.fence = self.fence
        future = self.env.store.write(tx)
        for entry in staged:
            self._outbox.append((entry.message, future, entry))
        future.add_done_callback(self._drain)
        if self.fence is not None:
            future.add_done_callback(self._fenced)
        return asyncio.shield(future)

    def append(
        self,
        data: EventData,
        tx: WriteTx | None = None,
        *,
        on_shown: Callable[[], None] | None = None,
    ) -> asyncio.Future[TxOutcome]:
        """:meth:`stage` and :meth:`commit` one event (with the rows of ``tx``)."""
        return self.commit(self.stage(data, on_shown=on_shown), tx=tx)

    def _take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq = seq + 1
        if seq > self.reserved:
            self._reserve(seq)
        return seq

    def _reserve(self, seq: int) -> None:
        """I2 across restarts: seqs are reserved durably in blocks, and nothing
        numbered past the reservation is shown before it commits. A restarted
        Mind continues after the reservation, so no seq a Face ever saw (a
        delta's included) is reused."""
        self.reserved = seq + SEQ_BLOCK - 1
        future = self.env.store.write(
            WriteTx(seq_reservations=[(self.id, self.reserved)], fence=self.fence)
        )
        self._outbox.append((None, future, None))  # a barrier: later messages wait
        future.add_done_callback(self._drain)

    def _event_message(
        self, kind: str, data: EventData, now: float, seq: int, cursor: str
    ) -> Message:
        return event_message(self.id, kind, data, now, seq, cursor)

    def _drain(self, _: object = None) -> None:
        outbox = self._outbox
        while outbox:
            message, future, staged = outbox[0]
            if future is not None:
                if not future.done():
                    return
                if future.cancelled() or future.exception() is not None:
                    outbox.popleft()  # never committed: never shown
                    continue
                if not future.result().committed:
                    outbox.popleft()
                    continue
            outbox.popleft()
            if message is not None:
                self._publish(message)
            if staged is not None:
                self._fold(staged.data)
                if staged.on_shown is not None:
                    staged.on_shown()

    def _fenced(self, future: asyncio.Future[TxOutcome]) -> None:
        if future.cancelled() or not isinstance(future.exception(), FencedOut):
            return
        if self.env.fenced_out is not None and not self.unloaded:
            self.env.fenced_out(self.id)  # (an actor already replaced stays quiet)

    def _fold(self, data: EventData) -> None:
        """The in-memory view follows what was published."""
        if isinstance(data, ApprovalRequested):
            self.visible_approvals[data.approval_id] = data
        elif isinstance(data, ApprovalResolved):
            self.visible_approvals.pop(data.approval_id, None)
        elif isinstance(data, RunChanged) and data.run_id is not None:
            if data.status in ("queued", "running"):
                self.visible_tool_runs[data.run_id] = data
            else:
                self.visible_tool_runs.pop(data.run_id, None)

    def _publish(self, message: Message) -> None:
        self.published = message.seq
        self.env.metrics.published += 1
        self.active_at = self.env.monotonic()
        now = self.env.clock()
        # In seq order, not waited for: the journal keeps its order, and a
        # replay that needs the entry waits for it (``journaled``).
        appending = self.env.journal.append(self.id, entry_of(message, now))
        if appending is not None:
            self._journaling = appending
        kind = message.kind
        if kind == DELTA and message.request_id is not None:
            run = self.visible_chat_runs.get(message.request_id)
            if run is not None:
                text = message.text or ""
                run.visible_text.append(text)
                run.visible_chars += len(text)
        # A copy: sending may evict a slow subscriber, which unsubscribes it.
        for sub in list(self.subscribers.values()):
            if sub.live and (kind == RELIABLE or sub.wants(message)):
                shown = message.for_mode(sub.detail_mode)
                if shown is not None:
                    sub.session.send(shown)

    def _transient(self, message: Message) -> None:
        """A display message: shown now, or behind the committed ones still
        committing (never before an event it follows)."""
        if self._outbox:
            self._outbox.append((message, None, None))
        else:
            self._publish(message)

    # -- chat ------------------------------------------------------------------

    async def admit_chat(
        self,
        record: RequestRecord,
        content: str,
        on_accepted: Callable[[RequestRecord], None],
        detail_mode: str = "transparent",
    ) -> RequestRecord | Tombstone:
        """Admit one chat: request record, user message, run and events in one
        transaction (DESIGN §5), then start it (``ActorEnv.drive``). Returns the
        record that stands: ours, or an existing one if the key raced in from
        elsewhere (I5). ``on_accepted`` runs once it is admitted, before the
        chat starts."""
        if self.chat_run is not None:
            raise Busy("a chat is already running in this conversation")
        now = self.wall()
        run = ChatRun(
            new_run_id(now), record.request_id, record.principal_id, content, now, detail_mode,
            began=self.env.monotonic(),
        )
        self.chat_run = run  # reserve the slot before awaiting: one active chat
        try:
            said = self.stage(
                ChatMessage(request_id=record.request_id, role="user", content=content), now
            )

            def started() -> None:
                self.visible_chat_runs[run.request_id] = run

            staged = [
                said,
                self.stage(
                    ChatStarted(request_id=record.request_id, run_id=run.run_id),
                    now,
                    on_shown=started,
                ),
            ]
            names: list[tuple[str, str]] = []
            title = None if self.named else title_from_message(content)
            if title is not None:
                # An unnamed conversation is titled from its first message,
                # in the same transaction as the message itself.
                staged.append(self._name_event(title, now))
                names.append((self.id, title))
            record.run_id = run.run_id
            record.conversation_id = self.id
            record.accepted = builtins(
                Accepted(
                    request_id=record.request_id,
                    operation="chat",
                    conversation_id=self.id,
                    run_id=run.run_id,
                    cursor=staged[1].cursor,
                )
            )
            assert isinstance(said.data, ChatMessage)
            tx = WriteTx(
                admit=record,
                messages=[message_row(self.id, said.data.entry(said.seq, now))],
                chat_runs=[
                    ChatRunRow(
                        run.run_id, self.id, record.request_id, record.principal_id, "running", now
                    )
                ],
                conversation_names=names,
            )
            self.named = self.named or bool(names)
            outcome = await self.commit(*staged, tx=tx)
        except BaseException:
            self.chat_run = None
            self.named = self.row.name is not None
            raise
        if outcome.existing is not None:
            self.chat_run = None
            self.named = self.row.name is not None
            return outcome.existing
        on_accepted(record)
        if run.stop_reason is not None:
            # Cancelled (or the Mind began draining) while the admission was
            # committing: the chat ends now, without ever starting the agent.
            run.task = asyncio.create_task(
                self.finish(run, run.stop_reason, None, run.stop_why), name=f"chat {run.run_id}"
            )
        else:
            run.task = asyncio.create_task(self.env.drive(self, run), name=f"chat {run.run_id}")
        return record

    def emit_delta(self, run: ChatRun, text: str) -> None:
        seq = self._take_seq()
        message = Message(
            "face.chat.delta",
            None,
            kind=DELTA,
            conversation_id=self.id,
            seq=seq,
            cursor=self.cursor(seq),
            request_id=run.request_id,
            text=text,
        )
        message.encoded_body()  # encode once; every subscriber shares the bytes
        run.text.append(text)
        run.text_chars += len(text)
        self._transient(message)
        env = self.env
        if env.checkpoint_s is None:
            return
        # 4 KiB shown, or an eighth of what is saved when that is more: a long
        # fast reply rewrites its row a bounded number of times (at most ~9x
        # its size). Counted on what was shown, the only text a checkpoint
        # saves: text waiting behind a commit makes no checkpoint due (each
        # delta would assemble the same text again for nothing).
        unsaved = run.visible_chars - run.saved_chars
        if unsaved >= env.checkpoint_chars and unsaved >= run.saved_chars >> 3:
            self._checkpoint(run, env.monotonic())
        elif run.save_timer is None:
            # ``checkpoint_s`` after the last save: while its timer is armed,
            # the timer saves (no clock read per delta of a fast stream).
            now = env.monotonic()
            if now - run.saved_at >= env.checkpoint_s:
                self._checkpoint(run, now)
            elif env.call_later is not None:
                delay = run.saved_at + env.checkpoint_s - now
                run.save_timer = env.call_later(delay, self._checkpoint_due, run)

    def _checkpoint_due(self, run: ChatRun) -> None:
        run.save_timer = None
        self._checkpoint(run, self.env.monotonic())

    def _checkpoint(self, run: ChatRun, now: float) -> None:  # now: monotonic
        """DESIGN §5: save the text Faces were shown so far (published deltas
        only, never more), riding the group commit, so a reply cut short by a
        crash keeps it: once ``checkpoint_s`` passed or ``checkpoint_chars``
        came since the last save, and a timer saves what a stream that stalled
        showed since (text still waiting behind a commit, too)."""
        run.saved_at = now
        if run.save_timer is not None:
            run.save_timer.cancel()
            run.save_timer = None
        if run.ending is not None or CHAT.is_terminal(run.state):
            return  # the end is committing, with the whole text
        visible = run.visible_chars
        if visible < run.text_chars and self.env.call_later is not None:
            assert self.env.checkpoint_s is not None
            run.save_timer = self.env.call_later(
                self.env.checkpoint_s, self._checkpoint_due, run
            )
        if visible == run.saved_chars or run.saving:
            return  # nothing new, or the save in flight re-checks when it is done
        pieces = len(run.visible_text)
        if run.saved_chars == 0:
            # The first save (or the first after a lost one) writes it whole.
            row = ChatRunRow(
                run.run_id, self.id, run.request_id, run.principal_id, "running",
                run.started_at, content="".join(run.visible_text),
            )
            tx = WriteTx(chat_runs=[row], fence=self.fence)
        else:
            # O(new text): only what was shown since the last save.
            text = "".join(run.visible_text[run.saved_pieces:pieces])
            tx = WriteTx(run_text=[TextAppend(run.run_id, text)], fence=self.fence)
        run.saved_chars = visible
        run.saved_pieces = pieces
        run.saving = True
        future = self.env.store.write(tx)
        future.add_done_callback(partial(self._checkpoint_done, run))

    def _checkpoint_done(self, run: ChatRun, future: asyncio.Future[TxOutcome]) -> None:
        run.saving = False
        if future.cancelled() or future.exception() is not None:
            # A lost checkpoint costs only text a crash would lose: log, and
            # let the next save write the text whole.
            _log_checkpoint_failure(future)
            run.saved_chars = run.saved_pieces = 0
            return
        if run.visible_chars == run.saved_chars or run.ending is not None:
            return
        # Text was shown while this one saved: due now by size, else by time.
        env = self.env
        unsaved = run.visible_chars - run.saved_chars
        if unsaved >= env.checkpoint_chars and unsaved >= run.saved_chars >> 3:
            self._checkpoint(run, env.monotonic())
        elif run.save_timer is None and env.call_later is not None and env.checkpoint_s:
            delay = max(0.0, run.saved_at + env.checkpoint_s - env.monotonic())
            run.save_timer = env.call_later(delay, self._checkpoint_due, run)

    def emit_progress(
        self, run: ChatRun, tool_call_id: str, kind: str, text: str, gap: bool, call_seq: int
    ) -> None:
        """Tool output as it happens: transient and droppable (DESIGN §6)."""
        seq = self._take_seq()
        cursor = self.cursor(seq)
        body = ToolProgress(
            conversation_id=self.id,
            seq=seq,
            cursor=cursor,
            request_id=run.request_id,
            tool_call_id=tool_call_id,
            call_seq=call_seq,
            kind=kind,
            data=text,
            gap=gap,
        )
        self._transient(
            Message(
                "face.chat.tool.progress",
                _encode(body),
                kind=PROGRESS,
                conversation_id=self.id,
                seq=seq,
                cursor=cursor,
                stream=tool_call_id,
            )
        )

    def emit_event(self, data: EventData, stream: str | None = None) -> None:
        """A transient ``face.event`` (``task.progress``): it takes a ``seq``
        and reaches the journal (an exact resume replays it) but never the
        Store; like tool progress it may be dropped under pressure (per
        ``stream``) and is shown to transparent viewers only (DESIGN §6)."""
        if self.unloaded:
            return
        seq = self._take_seq()
        cursor = self.cursor(seq)
        body = FaceEvent(
            conversation_id=self.id, seq=seq, cursor=cursor, type=data.kind(), data=data,
            ts=self.wall(),
        )
        self._transient(
            Message(
                "face.event",
                _encode(body),
                kind=PROGRESS,
                conversation_id=self.id,
                seq=seq,
                cursor=cursor,
                stream=stream,
            )
        )

    def stop(self, run: ChatRun, reason: str, why: str | None = None) -> bool:
        """Ask a running chat to stop (``cancelled`` or ``interrupted``).

        Returns False if the chat already reached a terminal state (I10).
        ``why`` is the line a person reads (``cancelled by laptop``).
        """
        if CHAT.is_terminal(run.state):
            return False
        if run.ending is not None:
            # Its outcome is decided and waits for the Store: try again now
            # (a drain's last chance; a cancel just wrote, so writes may work).
            if run.retry_wait is not None:
                run.retry_wait.cancel()
            return False
        if run.stop_reason is not None:
            return True  # asked already: one cancellation, so cleanup is never cut short
        if run.state == "running":
            run.state = CHAT.check(run.state, "cancel_requested")
        run.stop_reason = reason
        run.stop_why = why
        if run.task is not None and not run.task.done():
            run.task.cancel()
        return True

    async def finish(
        self,
        run: ChatRun,
        status: str,
        error_code: str | None,
        why: str | None = None,
        *,
        retry: bool = True,
        usage: TokenUsage | None = None,
    ) -> None:
        """Commit the chat's terminal state: run, request result, assistant
        message and the ``chat.*`` event in one transaction; first terminal wins.

        While the Store refuses the write the chat stays pending (its
        conversation busy) and the commit is retried with backoff until it
        lands, so every admitted chat reaches a terminal state Faces see. A
        drain that finds it still failing leaves it to restart recovery
        (``interrupted``). If the Store already holds another outcome for the
        run, that one stands and this chat converges on it (I10).

        Every end keeps an assistant message (``ChatEnded.reply``)."""
        if run.ending is not None or not CHAT.first_terminal_wins(run.state, status):
            return
        run.ending = status
        if run.save_timer is not None:
            run.save_timer.cancel()
            run.save_timer = None
        content = "".join(run.text)
        delays = backoff(END_RETRY_INITIAL_S, 2.0, END_RETRY_CAP_S, jitter=False)
        while True:
            try:
                try:
                    await self._commit_end(run, status, error_code, content, why, usage)
                except TerminalExists:
                    await self._converge(run)
                return
            except (StoreError, Unavailable) as exc:
                if isinstance(exc, Unavailable) and not self.unloaded:
                    raise
                if not retry and not self.unloaded:
                    raise
                if isinstance(exc, FencedOut) or self.unloaded:
                    # Another node owns the conversation now: it ends this
                    # chat (``interrupted``), not this one.
                    log.warning("chat %s left to the conversation's new owner", run.run_id)
                    if not run.done.done():
                        run.done.set_result("interrupted")
                    return
                if self.env.draining:
                    log.warning(
                        "could not commit the end of chat %s before shutdown (%s);"
                        " restart recovery will end it as interrupted",
                        run.run_id,
                        exc,
                    )
                    if not run.done.done():
                        run.done.set_result("interrupted")
                    return
                delay = next(delays)
                log.warning(
                    "could not commit the end of chat %s (%s); retrying in %.2f s",
                    run.run_id,
                    exc,
                    delay,
                )
            await self._wait_to_retry(run, delay)

    async def _wait_to_retry(self, run: ChatRun, delay: float) -> None:
        """Wait ``delay`` (injected time), or less if :meth:`stop` wakes us."""
        waiter = run.retry_wait = asyncio.ensure_future(self.env.sleep(delay))
        try:
            await asyncio.wait({waiter})
        finally:
            waiter.cancel()
            run.retry_wait = None

    async def _commit_end(
        self,
        run: ChatRun,
        status: str,
        error_code: str | None,
        content: str,
        why: str | None,
        usage: TokenUsage | None = None,
    ) -> None:
        """One attempt: a fresh event (a new ``seq``: a failed attempt's seq
        was never shown, and later events may have been shown since)."""
        now = self.wall()
        data = ChatEnded(
            request_id=run.request_id,
            run_id=run.run_id,
            status=status,
            content=content,
            error_code=error_code or msgspec.UNSET,
            reason=why or msgspec.UNSET,
            usage=usage or msgspec.UNSET,
        )
        done = self.stage(data, now)
        result = builtins(
            Result(
                request_id=run.request_id,
                status=status,
                content=content,
                data=ChatOutcome(
                    conversation_id=self.id,
                    run_id=run.run_id,
                    cursor=done.cursor,
                    reason=why or msgspec.UNSET,
                    usage=usage or msgspec.UNSET,
                ),
                error_code=error_code or msgspec.UNSET,
            )
        )
        done.on_shown = partial(self._ended, run, status, result)
        tx = WriteTx(
            messages=[message_row(self.id, data.reply(done.seq, now))],
            chat_runs=[
                ChatRunRow(
                    run.run_id,
                    self.id,
                    run.request_id,
                    run.principal_id,
                    status,
                    run.started_at,
                    now,
                    content,
                    error_code,
                )
            ],
            finished=[FinishedRequest(run.principal_id, run.request_id, status, result, now)],
        )
        await self.commit(done, tx=tx)

    def _ended(self, run: ChatRun, status: str, result: dict[str, Any]) -> None:
        """The end is committed (and published, or known to stand): the chat
        leaves the pending list, the conversation is free, waiters learn it."""
        run.state = status
        data = result.get("data")
        self.env.metrics.chat_ended(
            status,
            self.env.monotonic() - run.began,
            result.get("error_code"),
            data.get("usage") if isinstance(data, dict) else None,
        )
        self.visible_chat_runs.pop(run.request_id, None)
        if self.chat_run is run:
            self.chat_run = None
        self.env.deliver(run.principal_id, run.request_id, result)
        if not run.done.done():
            run.done.set_result(status)

    async def _converge(self, run: ChatRun) -> None:
        """The Store holds another outcome for this run (I10): it stands.
        Whoever waits on the chat learns that one, not ours."""
        store = self.env.store
        row = await store.chat_run_for_request(self.id, run.request_id, run.principal_id)
        record = await store.get_request(run.principal_id, run.request_id)
        status = row.status if row is not None and CHAT.is_terminal(row.status) else "failed"
        result = getattr(record, "result", None)
        if not isinstance(result, dict):
            result = builtins(
                Result(
                    request_id=run.request_id,
                    status=status,
                    content=(row.content if row is not None else None) or "",
                    data=ChatOutcome(conversation_id=self.id, run_id=run.run_id),
                )
            )
        log.warning(
            "chat %s already had an outcome in the store (%s); it stands", run.run_id, status
        )
        self._ended(run, str(result.get("status", status)), result)

    # -- the conversation's name -------------------------------------------------

    async def rename(self, record: RequestRecord, name: str) -> RequestRecord | Tombstone:
        """``face.conversation.rename``: the request record, the new name and
        its ``conversation.changed`` event in one transaction (I5)."""
        now = self.wall()
        staged = self._name_event(name, now)
        record.conversation_id = self.id
        record.accepted = builtins(
            Accepted(
                request_id=record.request_id,
                operation="conversation.rename",
                conversation_id=self.id,
            )
        )
        record.finish(
            builtins(
                Result(
                    request_id=record.request_id,
                    status="succeeded",
                    data=Renamed(conversation_id=self.id, name=name),
                )
            ),
            now,
        )
        was_named, self.named = self.named, True
        tx = WriteTx(admit=record, conversation_names=[(self.id, name)])
        try:
            outcome = await self.commit(staged, tx=tx)
        except BaseException:
            self.named = was_named or self.row.name is not None
            raise
        if outcome.existing is not None:
            self.named = was_named or self.row.name is not None
            return outcome.existing
        return record

    def _name_event(self, name: str, now: float) -> Staged:
        info = ConversationInfo(id=self.id, name=name, created_at=self.row.created_at)
        data = ConversationChanged(conversation=info, change="renamed")
        return self.stage(data, now, on_shown=partial(self._named, name))

    def _named(self, name: str) -> None:
        """Published: the name is now the truth; every Face that may read
        conversations hears of it (a session-level message, not in any log)."""
        self.row = dataclasses.replace(self.row, name=name)
        self.env.announce(ConversationNews(conversation=self.meta(), change="renamed"))

    # -- recovery ----------------------------------------------------------------

    async def interrupt_recovered(self, row: ChatRunRow) -> None:
        """A run found open at start-up: its outcome is unknown, so it is
        ``interrupted`` (I11) — never resumed, never re-run."""
        # Began as long ago as its stored start says (its length, for /metrics).
        began = self.env.monotonic() - max(0.0, self.wall() - row.started_at)
        run = ChatRun(
            row.run_id, row.request_id, row.principal_id, "", row.started_at, began=began
        )
        if row.content:
            run.text.append(row.content)  # the last checkpoint: what Faces were shown
        # No retry: a Store that refuses writes at start-up fails the start.
        await self.finish(
            run, "interrupted", None, "the Mind stopped before the reply finished", retry=False
        )

    # -- reads -------------------------------------------------------------------

    async def snapshot(self, messages_limit: int, detail_mode: str) -> Snapshot:
        """DESIGN §4.1. The position and in-memory state are captured in one
        synchronous step; the message page is read from the store *bounded by
        that position*, so the snapshot is exactly the log up to ``cursor`` and
        a subscription from ``cursor`` continues it with no gap or overlap."""
        position = self.published
        pending = [run.pending_view() for run in self.visible_chat_runs.values()]
        approvals = list(self.visible_approvals.values())
        tool_runs = list(self.visible_tool_runs.values())
        store = self.env.store
        page = await store.messages(
            self.id, limit=messages_limit, before_seq=None, max_seq=position
        )
        calls = await store.tool_history(self.id, max_seq=position, limit=self.env.tool_history)
        history = [tool_record(c, position) for c in calls]
        tasks = [] if self.env.tasks is None else await self.env.tasks(self.id)
        if detail_mode != "transparent":
            approvals = [a.summary() for a in approvals]
            history = [r.summary() for r in history]
            tasks = [t.summary() for t in tasks]
        return Snapshot(
            conversation=self.meta(),
            cursor=self.cursor(position),
            epoch=self.epoch,
            messages=[message_entry(m) for m in page.messages],
            has_more_older=page.has_more_older,
            pending_chats=pending,
            pending_approvals=approvals,
            active_runs=tool_runs,
            tasks=tasks,
            tool_history=history,
            detail_mode=detail_mode,
        )

    def active_run_for(self, request_id: str) -> ChatRun | None:
        run = self.chat_run
        return run if run is not None and run.request_id == request_id else None

    def meta(self) -> ConversationInfo:
        return ConversationInfo(id=self.id, name=self.row.name, created_at=self.row.created_at)


def _log_checkpoint_failure(future: asyncio.Future[TxOutcome]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("could not save the text so far: %s", future.exception())
