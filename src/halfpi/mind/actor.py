"""The conversation actor: single writer of one conversation (DESIGN §1, I2, I3).

Everything that changes a conversation goes through its actor, on the event
loop thread, so the actor's synchronous sections are its mailbox order. The
actor assigns ``seq``, stages events in an outbox, and *publishes* them —
to the journal, to its in-memory view and to subscribed connections — only
once they and every durable event before them have committed (I3). The
publication step runs as the store future's done-callback, so an event is
shown the moment it is durable, never before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from halfpi.agents.base import Agent, AgentFailed, ChatInput
from halfpi.config import Config
from halfpi.core.backoff import backoff
from halfpi.core.cursor import encode_cursor
from halfpi.core.ids import new_run_id
from halfpi.core.outbound import DELTA, RELIABLE, Message
from halfpi.core.projection import summary_data, summary_record
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.core.states import CHAT, CHAT_EVENT_FOR_STATUS
from halfpi.core.titles import title_from_message
from halfpi.errors import Busy, StoreError, TerminalExists
from halfpi.journal.base import Journal
from halfpi.mind.tools import call_tool, progress_message
from halfpi.store.base import (
    ConversationRow,
    FinishedRequest,
    MessageRow,
    RunRow,
    Store,
    StoredEvent,
    TxOutcome,
    WriteTx,
)

if TYPE_CHECKING:
    from halfpi.mind.approvals import Approval, Approvals
    from halfpi.mind.hands import HandRegistry, ToolRun
    from halfpi.mind.subscriptions import Subscription

log = logging.getLogger("halfpi.actor")

_encode = msgspec.json.encode


class ActorHost(Protocol):
    """What an actor needs from the Mind around it."""

    store: Store
    journal: Journal
    agent: Agent
    config: Config
    hands: HandRegistry
    approvals: Approvals
    draining: bool
    # Waits ``seconds`` (injected: tests advance time themselves).
    sleep: Callable[[float], Awaitable[object]]

    def now(self) -> float: ...

    def deliver_result(
        self, principal_id: str, request_id: str, payload: dict[str, Any]
    ) -> None: ...

    def announce(self, type_: str, payload: dict[str, Any]) -> None:
        """A session-level message to every Face that may read conversations."""
        ...


class ChatRun:
    """One admitted chat, from ``chat.started`` to its terminal event."""

    __slots__ = (
        "completed_calls",
        "content",
        "detail_mode",
        "done",
        "ending",
        "principal_id",
        "request_id",
        "retry_wait",
        "run_id",
        "saved_at",
        "saved_chars",
        "started_at",
        "state",
        "stop_reason",
        "stop_why",
        "task",
        "text",
        "tool_runs",
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
    ) -> None:
        self.run_id = run_id
        self.request_id = request_id
        self.principal_id = principal_id
        self.content = content
        self.started_at = started_at
        self.state = CHAT.initial
        self.text: list[str] = []  # every delta produced so far
        self.visible_text: list[str] = []  # deltas published so far (snapshot)
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
        # The text-so-far checkpoint (DESIGN §5): when, and how much was saved.
        self.saved_at = started_at
        self.saved_chars = 0
        # Resolves with the terminal status once it is committed.
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def pending_view(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "run_id": self.run_id,
            "status": self.state,
            "text_so_far": "".join(self.visible_text),
            "started_at": self.started_at,
        }


_OnPublish = Callable[[], None] | None

SEQ_BLOCK = 4096
CHECKPOINT_S = 1.0  # the text so far is saved at most this often while it streams

# Committing a chat's end is retried until the Store takes it (a full disk,
# a lost database connection): 0.25 s, doubling, at most 30 s apart.
END_RETRY_INITIAL_S = 0.25
END_RETRY_CAP_S = 30.0


class ConversationActor:
    def __init__(self, host: ActorHost, row: ConversationRow, head: int) -> None:
        self.host = host
        self.row = row
        self.id = row.conversation_id
        self.epoch = host.journal.open(self.id, head)
        self.next_seq = head + 1
        self.published = head
        self.subscribers: dict[object, Subscription] = {}
        self.reserved = head  # seqs up to here are durably reserved
        self._outbox: deque[tuple[Message | None, asyncio.Future[TxOutcome] | None, _OnPublish]] = (
            deque()
        )
        self.run: ChatRun | None = None  # the admitted, not yet finished chat
        self.visible_runs: dict[str, ChatRun] = {}  # started and not yet ended, as published
        self.visible_approvals: dict[str, Approval] = {}  # requested, not yet resolved
        self.visible_tool_runs: dict[str, dict[str, Any]] = {}  # queued or running
        # A name is set or on its way: no automatic title may overwrite it.
        self.named = row.name is not None

    # -- staging and publication (I3) ------------------------------------------

    def cursor(self, seq: int) -> str:
        return encode_cursor(self.epoch, seq)

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
        future = self.host.store.write(WriteTx(seq_reservations=[(self.id, self.reserved)]))
        self._outbox.append((None, future, None))  # a barrier: later messages wait
        future.add_done_callback(self._drain)

    def _event(
        self,
        type_: str,
        data: dict[str, Any],
        now: float,
        summary: dict[str, Any] | None = None,
    ) -> tuple[Message, StoredEvent]:
        """Stage one event. ``data`` is already a display projection (never raw
        tool arguments); ``summary`` is its downgrade for summary viewers (I9)."""
        seq = self._take_seq()
        cursor = self.cursor(seq)
        message = self._event_message(type_, data, now, seq, cursor)
        if summary is not None:
            message.with_summary(self._event_message(type_, summary, now, seq, cursor))
        return message, StoredEvent(self.id, seq, type_, _encode(data), now)

    def _event_message(
        self, type_: str, data: dict[str, Any], now: float, seq: int, cursor: str
    ) -> Message:
        body = _encode(
            {
                "conversation_id": self.id,
                "seq": seq,
                "cursor": cursor,
                "type": type_,
                "data": data,
                "ts": now,
            }
        )
        return Message("face.event", body, conversation_id=self.id, seq=seq, cursor=cursor)

    def _commit(
        self, tx: WriteTx, staged: list[tuple[Message, _OnPublish]]
    ) -> asyncio.Future[TxOutcome]:
        future = self.host.store.write(tx)
        for message, hook in staged:
            self._outbox.append((message, future, hook))
        future.add_done_callback(self._drain)
        # Shielded: a cancelled caller (a cancelled chat) must not cancel the
        # write itself — it commits regardless, and what commits is shown.
        return asyncio.shield(future)

    def _drain(self, _: object = None) -> None:
        outbox = self._outbox
        while outbox:
            message, future, hook = outbox[0]
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
            if hook is not None:
                hook()

    def _publish(self, message: Message) -> None:
        self.published = message.seq
        self.host.journal.append(message, self.host.now())
        if message.kind == DELTA and message.request_id is not None:
            run = self.visible_runs.get(message.request_id)
            if run is not None:
                run.visible_text.append(message.text or "")
        # A copy: sending may evict a slow subscriber, which unsubscribes it.
        for sub in list(self.subscribers.values()):
            if sub.live and (message.kind == RELIABLE or sub.wants(message)):
                shown = message.for_mode(sub.detail_mode)
                if shown is not None:
                    sub.session.send(shown)

    # -- chat ------------------------------------------------------------------

    async def admit_chat(
        self,
        record: RequestRecord,
        content: str,
        on_accepted: Callable[[RequestRecord], None],
        detail_mode: str = "transparent",
    ) -> RequestRecord | Tombstone:
        """Admit one chat: request record, user message, run and events in one
        transaction (DESIGN §5). Returns the record that stands: ours, or an
        existing one if the key raced in from elsewhere (I5)."""
        if self.run is not None:
            raise Busy("a chat is already running in this conversation")
        now = self.host.now()
        run = ChatRun(
            new_run_id(now), record.request_id, record.principal_id, content, now, detail_mode
        )
        self.run = run  # reserve the slot before awaiting: one active chat
        try:
            m_message, e_message = self._event(
                "chat.message",
                {"request_id": record.request_id, "role": "user", "content": content},
                now,
            )
            m_started, e_started = self._event(
                "chat.started", {"request_id": record.request_id, "run_id": run.run_id}, now
            )

            def started() -> None:
                self.visible_runs[run.request_id] = run

            staged: list[tuple[Message, _OnPublish]] = [(m_message, None), (m_started, started)]
            events = [e_message, e_started]
            names: list[tuple[str, str]] = []
            title = None if self.named else title_from_message(content)
            if title is not None:
                # An unnamed conversation is titled from its first message,
                # in the same transaction as the message itself.
                m_title, e_title = self._name_event(title, now)
                staged.append((m_title, partial(self._named, title)))
                events.append(e_title)
                names.append((self.id, title))
            record.run_id = run.run_id
            record.conversation_id = self.id
            record.accepted = {
                "request_id": record.request_id,
                "operation": "chat",
                "conversation_id": self.id,
                "run_id": run.run_id,
                "cursor": m_started.cursor,
            }
            tx = WriteTx(
                admit=record,
                messages=[
                    MessageRow(
                        self.id, e_message.seq, "user", content, record.request_id, None, now
                    )
                ],
                runs=[
                    RunRow(
                        run.run_id, self.id, record.request_id, record.principal_id, "running", now
                    )
                ],
                events=events,
                conversation_names=names,
            )
            self.named = self.named or bool(names)
            outcome = await self._commit(tx, staged)
        except BaseException:
            self.run = None
            self.named = self.row.name is not None
            raise
        if outcome.existing is not None:
            self.run = None
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
            run.task = asyncio.create_task(self._drive(run), name=f"chat {run.run_id}")
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
        if self._outbox:
            self._outbox.append((message, None, None))
        else:
            self._publish(message)
        now = self.host.now()
        if now - run.saved_at >= CHECKPOINT_S:
            self._checkpoint(run, now)

    def _checkpoint(self, run: ChatRun, now: float) -> None:
        """DESIGN §5: save the text Faces were shown so far (published deltas
        only, never more), riding the group commit, so a reply cut short by a
        crash keeps it. At most once per ``CHECKPOINT_S`` per chat."""
        run.saved_at = now
        text = "".join(run.visible_text)
        if len(text) == run.saved_chars or CHAT.is_terminal(run.state):
            return
        run.saved_chars = len(text)
        row = RunRow(
            run.run_id, self.id, run.request_id, run.principal_id, "running", run.started_at
        )
        row = dataclasses.replace(row, content=text)
        future = self.host.store.write(WriteTx(runs=[row]))
        # A lost checkpoint costs only text a crash would lose: log, go on.
        future.add_done_callback(_log_checkpoint_failure)

    def emit_progress(
        self, run: ChatRun, tool_call_id: str, kind: str, text: str, gap: bool, call_seq: int
    ) -> None:
        """Tool output as it happens: transient and droppable (DESIGN §6)."""
        message = progress_message(
            self, run.request_id, tool_call_id, kind, text, gap, call_seq, self._take_seq()
        )
        if self._outbox:
            self._outbox.append((message, None, None))
        else:
            self._publish(message)

    async def _drive(self, run: ChatRun) -> None:
        status, error_code, why = "succeeded", None, None
        try:
            async for delta in self.host.agent.reply(
                ChatInput(self.id, run.request_id, run.content, partial(call_tool, self, run))
            ):
                if delta.text:
                    self.emit_delta(run, delta.text)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            status = run.stop_reason or "interrupted"
            why = run.stop_why
        except AgentFailed as exc:
            status, error_code, why = "failed", exc.code, str(exc)
            log.info("chat %s failed: %s", run.run_id, exc)
        except Exception:
            log.exception("agent crashed in chat %s", run.run_id)
            status, error_code = "failed", "internal_error"
            why = "the agent failed unexpectedly (the Mind's log has the details)"
        await self.finish(run, status, error_code, why)

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
    ) -> None:
        """Commit the chat's terminal state: run, request result, assistant
        message and the ``chat.*`` event in one transaction; first terminal wins.

        While the Store refuses the write the chat stays pending (its
        conversation busy) and the commit is retried with backoff until it
        lands, so every admitted chat reaches a terminal state Faces see. A
        drain that finds it still failing leaves it to restart recovery
        (``interrupted``). If the Store already holds another outcome for the
        run, that one stands and this chat converges on it (I10).

        Every end keeps an assistant message — with its status, its reason and
        whatever text it had — so a failed, cancelled or interrupted reply
        stays visible, live and after a resync."""
        if run.ending is not None or not CHAT.first_terminal_wins(run.state, status):
            return
        run.ending = status
        content = "".join(run.text)
        delays = backoff(END_RETRY_INITIAL_S, 2.0, END_RETRY_CAP_S, jitter=False)
        while True:
            try:
                try:
                    await self._commit_end(run, status, error_code, content, why)
                except TerminalExists:
                    await self._converge(run)
                return
            except StoreError as exc:
                if not retry:
                    raise
                if self.host.draining:
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
        """Wait ``delay`` (host time), or less if :meth:`stop` wakes us."""
        waiter = run.retry_wait = asyncio.ensure_future(self.host.sleep(delay))
        try:
            await asyncio.wait({waiter})
        finally:
            waiter.cancel()
            run.retry_wait = None

    async def _commit_end(
        self, run: ChatRun, status: str, error_code: str | None, content: str, why: str | None
    ) -> None:
        """One attempt: a fresh event (a new ``seq``: a failed attempt's seq
        was never shown, and later events may have been shown since)."""
        now = self.host.now()
        event_type = CHAT_EVENT_FOR_STATUS[status]
        data: dict[str, Any] = {
            "request_id": run.request_id,
            "run_id": run.run_id,
            "status": status,
            "content": content,
        }
        if error_code:
            data["error_code"] = error_code
        if why:
            data["reason"] = why
        m_done, e_done = self._event(event_type, data, now)
        result: dict[str, Any] = {
            "request_id": run.request_id,
            "status": status,
            "content": content,
            "data": {"conversation_id": self.id, "run_id": run.run_id, "cursor": m_done.cursor},
        }
        if error_code:
            result["error_code"] = error_code
        if why:
            result["data"]["reason"] = why
        reply = MessageRow(
            self.id, e_done.seq, "assistant", content, run.request_id, status, now, error_code, why
        )
        tx = WriteTx(
            events=[e_done],
            messages=[reply],
            runs=[
                RunRow(
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
        await self._commit(tx, [(m_done, partial(self._ended, run, status, result))])

    def _ended(self, run: ChatRun, status: str, result: dict[str, Any]) -> None:
        """The end is committed (and published, or known to stand): the chat
        leaves the pending list, the conversation is free, waiters learn it."""
        run.state = status
        self.visible_runs.pop(run.request_id, None)
        if self.run is run:
            self.run = None
        self.host.deliver_result(run.principal_id, run.request_id, result)
        if not run.done.done():
            run.done.set_result(status)

    async def _converge(self, run: ChatRun) -> None:
        """The Store holds another outcome for this run (I10): it stands.
        Whoever waits on the chat learns that one, not ours."""
        store = self.host.store
        row = await store.run_for_request(self.id, run.request_id, run.principal_id)
        record = await store.get_request(run.principal_id, run.request_id)
        status = row.status if row is not None and CHAT.is_terminal(row.status) else "failed"
        result = getattr(record, "result", None)
        if not isinstance(result, dict):
            result = {
                "request_id": run.request_id,
                "status": status,
                "content": (row.content if row is not None else None) or "",
                "data": {"conversation_id": self.id, "run_id": run.run_id},
            }
        log.warning(
            "chat %s already had an outcome in the store (%s); it stands", run.run_id, status
        )
        self._ended(run, str(result.get("status", status)), result)

    # -- the conversation's name -------------------------------------------------

    async def rename(self, record: RequestRecord, name: str) -> RequestRecord | Tombstone:
        """``face.conversation.rename``: the request record, the new name and
        its ``conversation.changed`` event in one transaction (I5)."""
        now = self.host.now()
        message, event = self._name_event(name, now)
        record.conversation_id = self.id
        record.accepted = {
            "request_id": record.request_id,
            "operation": "conversation.rename",
            "conversation_id": self.id,
        }
        record.finish(
            {
                "request_id": record.request_id,
                "status": "succeeded",
                "data": {"conversation_id": self.id, "name": name},
            },
            now,
        )
        was_named, self.named = self.named, True
        tx = WriteTx(admit=record, conversation_names=[(self.id, name)], events=[event])
        try:
            outcome = await self._commit(tx, [(message, partial(self._named, name))])
        except BaseException:
            self.named = was_named or self.row.name is not None
            raise
        if outcome.existing is not None:
            self.named = was_named or self.row.name is not None
            return outcome.existing
        return record

    def _name_event(self, name: str, now: float) -> tuple[Message, StoredEvent]:
        data = {"conversation": {**self.meta(), "name": name}, "change": "renamed"}
        return self._event("conversation.changed", data, now)

    def _named(self, name: str) -> None:
        """Published: the name is now the truth; every Face that may read
        conversations hears of it (a session-level message, not in any log)."""
        self.row = dataclasses.replace(self.row, name=name)
        self.host.announce(
            "face.conversation.changed", {"conversation": self.meta(), "change": "renamed"}
        )

    # -- recovery ----------------------------------------------------------------

    async def interrupt_recovered(self, row: RunRow) -> None:
        """A run found open at start-up: its outcome is unknown, so it is
        ``interrupted`` (I11) — never resumed, never re-run."""
        run = ChatRun(row.run_id, row.request_id, row.principal_id, "", row.started_at)
        if row.content:
            run.text.append(row.content)  # the last checkpoint: what Faces were shown
        # No retry: a Store that refuses writes at start-up fails the start.
        await self.finish(
            run, "interrupted", None, "the Mind stopped before the reply finished", retry=False
        )

    # -- reads -------------------------------------------------------------------

    async def snapshot(self, messages_limit: int, detail_mode: str) -> dict[str, Any]:
        """DESIGN §4.1. The position and in-memory state are captured in one
        synchronous step; the message page is read from the store *bounded by
        that position*, so the snapshot is exactly the log up to ``cursor`` and
        a subscription from ``cursor`` continues it with no gap or overlap."""
        position = self.published
        pending = [run.pending_view() for run in self.visible_runs.values()]
        approvals = [a.requested_data() for a in self.visible_approvals.values()]
        tool_runs = list(self.visible_tool_runs.values())
        page = await self.host.store.messages(
            self.id, limit=messages_limit, before_seq=None, max_seq=position
        )
        calls = await self.host.store.tool_history(
            self.id, max_seq=position, limit=self.host.config.tool_history
        )
        history = [c.to_wire(position) for c in calls]
        if detail_mode != "transparent":
            approvals = [summary_data("approval.requested", a) for a in approvals]
            history = [summary_record(r) for r in history]
        return {
            "conversation": self.meta(),
            "cursor": self.cursor(position),
            "epoch": self.epoch,
            "messages": [m.to_wire() for m in page.messages],
            "has_more_older": page.has_more_older,
            "pending_chats": pending,
            "pending_approvals": approvals,
            "active_runs": tool_runs,
            "tasks": [],
            "tool_history": history,
            "detail_mode": detail_mode,
        }

    def active_run_for(self, request_id: str) -> ChatRun | None:
        run = self.run
        return run if run is not None and run.request_id == request_id else None

    def meta(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.row.name,
            "created_at": self.row.created_at,
        }


def _log_checkpoint_failure(future: asyncio.Future[TxOutcome]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("could not save the text so far: %s", future.exception())
