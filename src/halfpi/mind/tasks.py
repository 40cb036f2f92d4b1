"""Background tasks, the Mind's side (DESIGN §8, docs/hands.md): admission,
the outbox dispatcher, the Hand's answers and the last known snapshot.

- **Admission** (:meth:`TaskDispatcher.admit`): the agent starts a task;
  its outbox row (``WriteTx.tasks``) and its ``task.started`` event are one
  transaction through the conversation's actor (so a cluster node's fence
  guards it), and the dispatcher is woken.
- **Delivery** on the Mind's scheduler: every due row is sent
  to its Hand as ``hand.task.deliver`` with its ``delivery_id``, the attempt
  counted first (a crash after the send still counts it). No receipt within
  :func:`halfpi.core.tasks.answer_wait` (2 s * 2^n, ±25 %, cap 30 s): the next
  attempt; after the third, ``dead`` with its ``task.completed`` event. A
  Hand that is away gets no attempt: the row waits for it, and its
  (re)connect delivers at once.
- **The Hand's answers** (``hand.task.receipt|refused|update``) are applied
  one at a time: the receipt marks the row delivered (from then on only the
  Hand moves it), an update moves it as ``core.states.OUTBOX`` allows — a
  terminal state with its durable ``task.completed`` (the Store keeps the
  first terminal state, I10), another with a transient ``task.progress``.
- **Two clocks**: a row's schedule (``next_attempt_at``) is stored, so it
  is wall time; the timer that looks for it counts the delay on the
  scheduler's monotonic clock, and when it fires the rows due by then are
  sent even if the wall clock was set back meanwhile.
- **Stale**: a task whose Hand is away is shown ``stale``; the Hand's
  re-announcement after it reconnects refreshes it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import heapq
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from halfpi.core.events import (
    TaskCompleted,
    TaskLogPage,
    TaskProgress,
    TaskStarted,
    TaskView,
)
from halfpi.core.hand_wire import (
    HandTaskCancel,
    HandTaskDeliver,
    HandTaskLog,
    HandTaskLogPage,
    HandTaskReceipt,
    HandTaskRefused,
    HandTaskUpdate,
    MindMessage,
)
from halfpi.core.ids import new_id
from halfpi.core.projection import project_args
from halfpi.core.redact import MAX_CARRY, window_page
from halfpi.core.states import OUTBOX, TASK
from halfpi.core.tasks import DELIVERY_ATTEMPTS, answer_wait, task_digest
from halfpi.core.timers import Timer
from halfpi.errors import (
    IllegalTransition,
    NotOwner,
    StoreError,
    TerminalExists,
    Unavailable,
)
from halfpi.mind.hands import HandRegistry
from halfpi.mind.redaction import OutputRedaction
from halfpi.mind.scheduler import Scheduler
from halfpi.mind.tools import TOOL_RULES
from halfpi.store.base import Store, TaskRow, TaskUpdate, WriteTx

if TYPE_CHECKING:
    from halfpi.mind.actor import ChatRun, ConversationActor

log = logging.getLogger("halfpi.tasks")

PAGE = 64  # due rows read per look
AWAY_RECHECK_S = 30.0  # a due row whose Hand is away is looked at again after this
LOG_WAIT_S = 30.0  # how long face.task.log waits for the Hand's page
LOG_PAGE_BYTES = 64 * 1024
DEAD_ERROR = f"no Hand acknowledged the task after {DELIVERY_ATTEMPTS} attempts"

ActorOf = Callable[[str], Awaitable["ConversationActor"]]


class TaskDispatcher:
    def __init__(
        self,
        store: Callable[[], Store],
        scheduler: Scheduler,
        hands: HandRegistry,
        actor: ActorOf,
        spawn: Callable[[Any, str], asyncio.Task[Any]],
        *,
        draw: Callable[[], float] = random.random,
        redaction: OutputRedaction | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.scheduler = scheduler
        self.clock = wall  # stored times; the scheduler's clock counts the waits
        self.hands = hands
        self.actor = actor
        self.spawn = spawn
        self.draw = draw  # the jitter's randomness (a test fixes it)
        # The Mind's secrets never leave through a task's log or error (DESIGN §8).
        self.redaction = redaction or OutputRedaction(dict)
        self._timer: Timer | None = None
        # Every wake asked for and not reached yet: (when, on the scheduler's
        # monotonic clock; the wall time the rows are due at). One timer, for
        # the earliest; none forgotten. The wall time reached (by the
        # monotonic delay) since the last look.
        self._wakes: list[tuple[float, float]] = []
        self._reached = float("-inf")
        self._pumping = False
        self._again = False
        self._attempting: set[str] = set()
        self._answers = asyncio.Lock()  # a Hand's answers, applied one at a time
        self._terminal: dict[str, list[asyncio.Future[str]]] = {}
        self._logs: dict[tuple[str, str, int], list[asyncio.Future[HandTaskLogPage]]] = {}
        # Cancels for delivered tasks whose Hand is away: sent when it is back.
        self._cancel_later: dict[str, set[str]] = {}
        self.closed = False
        # Read by GET /metrics: tasks admitted, deliveries sent (first ones
        # and retries), tasks this Mind saw end, by terminal state.
        self.admitted = 0
        self.deliveries = 0
        self.ended: Counter[str] = Counter()

    @property
    def store(self) -> Store:
        return self._store()

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Look at once, and again when each row still waiting is due (the
        rows a previous Mind process left are due again)."""
        self.wake(self.clock())
        before: str | None = None
        while True:
            rows = await self.store.list_tasks(limit=PAGE, before=before, states=["queued"])
            for row in rows:
                if row.delivered_at is None:
                    self.wake(row.next_attempt_at)
            if len(rows) < PAGE:
                return
            before = rows[-1].task_id

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def wake(self, at: float) -> None:
        """Look for due rows at ``at`` (wall time, as stored), or earlier if
        asked: after ``at - now`` seconds of the scheduler's clock, counted
        from now — a step of the wall clock later changes nothing."""
        if self.closed:
            return
        delay = at - self.clock()
        if delay <= 0:
            self._fire()
            return
        heapq.heappush(self._wakes, (self.scheduler.now() + delay, at))
        self._arm()

    def _arm(self) -> None:
        if not self._wakes or self.closed:
            return
        when = self._wakes[0][0]
        timer = self._timer
        if timer is not None and not timer.done and timer.when <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timer = self.scheduler.call_at(when, self._due)

    def _due(self) -> None:
        """The earliest wait ran out: the rows due at its wall time (and any
        other's that ran out with it) are due."""
        self._timer = None
        now = self.scheduler.now()
        while self._wakes and self._wakes[0][0] <= now:
            self._reached = max(self._reached, heapq.heappop(self._wakes)[1])
        self._arm()
        self._fire()

    def _fire(self) -> None:
        if self._pumping:
            self._again = True
            return
        self._pumping = True
        self.spawn(self._pump(), "task dispatch")

    async def _pump(self) -> None:
        try:
            while True:
                self._again = False
                now = self.clock()
                # A wall clock set back meanwhile delays nothing: the rows
                # due when the timer's delay ran out are due.
                reached, self._reached = self._reached, float("-inf")
                rows = await self.store.due_tasks(max(now, reached), PAGE)
                for row in rows:
                    await self._attempt(row, now)
                if len(rows) < PAGE and not self._again:
                    return
        except Exception:
            log.exception("task dispatch failed; looking again in %.0f s", AWAY_RECHECK_S)
            self.wake(self.clock() + AWAY_RECHECK_S)
        finally:
            self._pumping = False

    # -- admission ---------------------------------------------------------------

    async def admit(
        self, actor: ConversationActor, run: ChatRun, tool: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """The agent starts a background task: its outbox row and its
        ``task.started`` in one transaction (with the chat's request), then
        the dispatcher delivers it. Returns what the agent is told."""
        now = actor.wall()
        args = dict(args)
        hand_label = args.pop("hand", None) or self.hands.default_hand()
        hand = self.hands.hands.get(hand_label) if isinstance(hand_label, str) else None
        if hand is None:
            why = f"no Hand {hand_label!r}" if hand_label else "no Hand is connected"
            return {"tool": tool, "status": "failed", "error_category": "hand_unavailable",
                    "error": why}
        timeout = args.get("timeout_s")
        timeout_s = float(timeout) if isinstance(timeout, int | float) else None
        row = TaskRow(
            task_id=new_id("k", now),
            delivery_id=new_id("d", now),
            conversation_id=actor.id,
            hand_id=hand.principal_id,
            hand_label=hand.hand_id,
            tool=tool,
            args=args,
            timeout_s=timeout_s,
            digest=task_digest(tool, args, timeout_s),
            detail_mode=run.detail_mode,
            principal_id=run.principal_id,
            request_id=run.request_id,
            created_at=now,
            next_attempt_at=now,
        )
        started = actor.stage(TaskStarted(task=self.view(row)), now)
        await actor.commit(started, tx=WriteTx(tasks=[row]))
        self.admitted += 1
        self.wake(now)
        return {"tool": tool, "status": "accepted", "task_id": row.task_id, "state": row.state,
                "hand": hand.hand_id}

    # -- delivery ------------------------------------------------------------------

    async def _attempt(self, row: TaskRow, now: float) -> None:
        if row.task_id in self._attempting:
            return
        self._attempting.add(row.task_id)
        try:
            if row.attempts >= DELIVERY_ATTEMPTS:
                await self._settle(row, "dead", error=DEAD_ERROR)
                return
            link = self._link_of(row)
            if link is None:
                # Away: no attempt is counted; its (re)connect delivers it.
                recheck = now + AWAY_RECHECK_S
                await self._write(row, TaskUpdate(row.task_id, now, next_attempt_at=recheck))
                self.wake(recheck)
                link = self._link_of(row)
                if link is None:
                    return
                # Back while this was written: its reconnect's attempt found
                # this one in flight and left the task to it: deliver now.
                now = self.clock()
            attempts = row.attempts + 1
            due = now + answer_wait(attempts, self.draw())
            await self._write(row, TaskUpdate(row.task_id, now, attempts=attempts,
                                              next_attempt_at=due))
            link.send(HandTaskDeliver(
                delivery_id=row.delivery_id, tool=row.tool, args=row.args,
                approved=row.approved,
                timeout_s=msgspec.UNSET if row.timeout_s is None else row.timeout_s))
            self.deliveries += 1
            self.wake(due)
        except NotOwner:
            pass  # cluster mode: the conversation's owner delivers it
        except (StoreError, Unavailable) as exc:
            log.warning("task %s: delivery not recorded (%s); later", row.task_id, exc)
            self.wake(now + AWAY_RECHECK_S)
        finally:
            self._attempting.discard(row.task_id)

    def _link_of(self, row: TaskRow) -> Any:
        """The link of the task's Hand (the same credential), or None: away."""
        hand = self.hands.hands.get(row.hand_label)
        return hand.link if hand is not None and hand.principal_id == row.hand_id else None

    async def _write(self, row: TaskRow, update: TaskUpdate) -> None:
        """A change of the row with no event, through its conversation's actor
        (its fence, in cluster mode)."""
        actor = await self.actor(row.conversation_id)
        await actor.commit(tx=WriteTx(task_updates=[update]))

    async def _settle(self, row: TaskRow, state: str, **fields: Any) -> None:
        """A terminal state decided by the Mind (``dead``; ``cancelled`` before
        any Hand had it), with its ``task.completed``."""
        now = self.clock()
        update = TaskUpdate(row.task_id, now, state=state, ended_at=now, **fields)
        await self._move(row, update)

    # -- the Hand's answers ------------------------------------------------------------

    def on_receipt(self, hand_label: str, msg: HandTaskReceipt) -> None:
        self.spawn(self._answer(hand_label, msg), "task receipt")

    def on_update(self, hand_label: str, msg: HandTaskUpdate) -> None:
        self.spawn(self._answer(hand_label, msg), "task update")

    def on_refused(self, hand_label: str, msg: HandTaskRefused) -> None:
        self.spawn(self._answer(hand_label, msg), "task refusal")

    def on_log_page(self, hand_label: str, msg: HandTaskLogPage) -> None:
        for future in self._logs.pop((hand_label, msg.task_id, msg.offset), []):
            if not future.done():
                future.set_result(msg)

    async def _answer(
        self, hand_label: str, msg: HandTaskReceipt | HandTaskUpdate | HandTaskRefused
    ) -> None:
        async with self._answers:
            try:
                await self._apply_answer(hand_label, msg)
            except NotOwner:
                pass
            except Exception:
                log.exception("could not apply a task answer of Hand %s", hand_label)

    async def _apply_answer(
        self, hand_label: str, msg: HandTaskReceipt | HandTaskUpdate | HandTaskRefused
    ) -> None:
        now = self.clock()
        if isinstance(msg, HandTaskRefused):
            await self._refused(hand_label, msg)
            return
        row = await self.store.task_for_delivery(msg.delivery_id)
        if row is None or row.hand_label != hand_label:
            log.warning("Hand %s answered for unknown delivery %s", hand_label, msg.delivery_id)
            return
        if isinstance(msg, HandTaskReceipt):
            update = TaskUpdate(row.task_id, now, delivered_at=now, hand_task_id=msg.task_id,
                                answer=msgspec.to_builtins(msg))
        else:
            error = self.redaction.text(msg.error, f"task {row.task_id}, Hand {hand_label}")
            update = TaskUpdate(
                row.task_id, now, delivered_at=now, hand_task_id=msg.task_id,
                started_at=msg.started_at, ended_at=msg.ended_at, exit_code=msg.exit_code,
                error=error, log_bytes=msg.log_bytes, log_truncated=msg.log_truncated,
            )
        if row.terminal:
            if row.state == "cancelled" and not TASK.is_terminal(msg.state):
                # Cancelled here before its Hand had it: the Hand stops it too.
                self._send(hand_label, HandTaskCancel(task_id=msg.task_id))
            if row.delivered_at is None and row.state != "dead":
                await self._write(row, update)  # the outcome stays; the Hand's id is kept
            self._ended(row.task_id, row.state)
            return
        moves = msg.state != row.state and msg.state in OUTBOX.transitions.get(row.state, ())
        if moves:
            await self._move(row, dataclasses.replace(update, state=msg.state))
        else:
            await self._write(row, update)
            if row.delivered_at is None:  # now delivered: no longer due
                after = _merged(row, update)
                await self._progress(after)

    async def _refused(self, hand_label: str, msg: HandTaskRefused) -> None:
        if msg.delivery_id is None:
            # A cancel or a log read of a task this Hand does not know.
            for key in [k for k in self._logs if k[0] == hand_label and k[1] == msg.task_id]:
                for future in self._logs.pop(key):
                    if not future.done():
                        future.set_exception(Unavailable(f"the Hand refused: {msg.message}"))
            return
        row = await self.store.task_for_delivery(msg.delivery_id)
        if row is None or row.hand_label != hand_label or row.terminal:
            return
        if row.delivered_at is None:
            # The Hand will never run this delivery (another payload under
            # its id, or no state to keep it): the outbox gives up on it.
            await self._settle(row, "dead", error=f"{msg.code}: {msg.message}",
                               answer=msgspec.to_builtins(msg))

    async def _move(self, row: TaskRow, update: TaskUpdate) -> None:
        """Move the row's state, with its event: ``task.completed`` (durable)
        for a terminal state, ``task.progress`` (transient) otherwise."""
        after = _merged(row, update)
        actor = await self.actor(row.conversation_id)
        if not after.terminal:
            await actor.commit(tx=WriteTx(task_updates=[update]))
            await self._progress(after, actor)
            return
        done = actor.stage(TaskCompleted(task=self.view(after)))
        try:
            await actor.commit(done, tx=WriteTx(task_updates=[update]))
        except TerminalExists:
            stored = await self.store.get_task(row.task_id)
            log.info("task %s already ended %s; that stands", row.task_id,
                     stored.state if stored else "?")
            if stored is not None:
                self._ended(row.task_id, stored.state)
            return
        except (StoreError, IllegalTransition) as exc:
            log.warning("task %s: %s → %s refused (%s)", row.task_id, row.state,
                        update.state, exc)
            return
        self.ended[after.state] += 1
        self._ended(row.task_id, after.state)

    async def _progress(self, row: TaskRow, actor: ConversationActor | None = None) -> None:
        actor = actor or await self.actor(row.conversation_id)
        actor.emit_event(TaskProgress(task=self.view(row)), stream=row.task_id)

    def _ended(self, task_id: str, state: str) -> None:
        for future in self._terminal.pop(task_id, []):
            if not future.done():
                future.set_result(state)

    def _send(self, hand_label: str, message: MindMessage) -> bool:
        hand = self.hands.hands.get(hand_label)
        if hand is None or hand.link is None:
            return False
        hand.link.send(message)
        return True

    # -- presence ------------------------------------------------------------------------

    def on_presence(self, hand_label: str, connected: bool) -> None:
        """A Hand came or went: its open tasks are shown (not) ``stale``; one
        that came back gets what waits for it at once."""
        if not self.closed:
            self.spawn(self._presence(hand_label, connected), "task presence")

    async def _presence(self, hand_label: str, connected: bool) -> None:
        # With the Hand's answers, one at a time: the rows read here are not
        # older than an answer already applied.
        async with self._answers:
            await self._present(hand_label, connected)

    async def _present(self, hand_label: str, connected: bool) -> None:
        hand = self.hands.hands.get(hand_label)
        if hand is None:
            return
        try:
            rows = await self.store.list_tasks(limit=500, hand_id=hand.principal_id,
                                               states=["queued", "running"])
            for row in rows:
                if row.hand_label != hand_label:
                    continue
                await self._progress(row)
                if connected and row.delivered_at is None and row.attempts < DELIVERY_ATTEMPTS:
                    # Whatever was sent on the previous link may be lost: at once.
                    await self._attempt(row, self.clock())
            if connected:
                for hand_task_id in sorted(self._cancel_later.pop(hand_label, set())):
                    self._send(hand_label, HandTaskCancel(task_id=hand_task_id))
        except NotOwner:
            pass
        except Exception:
            log.exception("tasks of Hand %s after it %s", hand_label,
                          "came back" if connected else "went away")

    # -- Faces' commands ------------------------------------------------------------------

    def view(self, row: TaskRow, *, transparent: bool = True) -> TaskView:
        """The task as Faces see it: ``args`` only for a transparent
        admission to a transparent viewer (I9), projected (DESIGN §6)."""
        shown: Any = UNSET
        if transparent and row.detail_mode == "transparent":
            shown = project_args(row.args or {}, TOOL_RULES.get(row.tool)).args
        return TaskView(
            task_id=row.task_id, conversation_id=row.conversation_id,
            request_id=row.request_id, hand=row.hand_label, tool=row.tool, state=row.state,
            stale=not row.terminal and not self.hands.connected(row.hand_label),
            attempts=row.attempts, detail_mode=row.detail_mode, created_at=row.created_at,
            updated_at=row.updated_at, started_at=row.started_at, ended_at=row.ended_at,
            exit_code=row.exit_code, error=row.error, log_bytes=row.log_bytes,
            log_truncated=row.log_truncated, args=shown,
        )

    async def of_conversation(self, conversation_id: str) -> list[TaskView]:
        """``snapshot.tasks``: the conversation's newest tasks, oldest first."""
        rows = await self.store.list_tasks(limit=200, conversation_id=conversation_id)
        return [self.view(r) for r in reversed(rows)]

    def terminal(self, task_id: str) -> asyncio.Future[str]:
        """Resolved with the task's terminal state once it stands."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._terminal.setdefault(task_id, []).append(future)
        return future

    def cancel(self, row: TaskRow) -> None:
        """Ask for the task's end: a task no Hand has yet ends ``cancelled``
        here (should its Hand report it later, it is told to stop); a
        delivered one is cancelled by its Hand, now or when it is back."""
        self.spawn(self._cancel(row.task_id), "task cancel")

    async def _cancel(self, task_id: str) -> None:
        async with self._answers:
            row = await self.store.get_task(task_id)
            if row is None:
                return
            if row.terminal:
                self._ended(task_id, row.state)
                return
            if row.hand_task_id is None:
                await self._settle(row, "cancelled", error="cancelled before its Hand had it")
                return
            if not self._send(row.hand_label, HandTaskCancel(task_id=row.hand_task_id)):
                self._cancel_later.setdefault(row.hand_label, set()).add(row.hand_task_id)

    async def read_log(self, row: TaskRow, offset: int, limit: int, body: bool) -> TaskLogPage:
        """A page of the task's log, from its Hand (which keeps it)."""
        hand_task_id = row.hand_task_id
        hand = self.hands.hands.get(row.hand_label)
        if hand_task_id is None or hand is None or hand.link is None:
            why = "its Hand does not have it yet" if hand_task_id is None else "its Hand is away"
            raise Unavailable(f"the task's log cannot be read now: {why}")
        # The Mind asks its Hand for a window around the page: what comes
        # before it (a secret the reader's offset would start inside) and
        # after it (one the page's end would cut) — always the same size,
        # so readers of one window share its answer (core/redact.py).
        lead = min(offset, MAX_CARRY)
        start = offset - lead
        key = (row.hand_label, hand_task_id, start)
        future: asyncio.Future[HandTaskLogPage] = asyncio.get_running_loop().create_future()
        self._logs.setdefault(key, []).append(future)
        hand.link.send(HandTaskLog(task_id=hand_task_id, offset=start, limit=LOG_PAGE_BYTES))
        timer = self.scheduler.call_later(LOG_WAIT_S, _give_up, future)
        try:
            page = await future
        finally:
            timer.cancel()
            waiting = self._logs.get(key)
            if waiting is not None and future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._logs[key]
        window = base64.b64decode(page.data_b64)
        want = max(1, min(limit, LOG_PAGE_BYTES - MAX_CARRY - lead))
        # More may follow the window: a page may not end where a secret could.
        more = len(window) >= LOG_PAGE_BYTES or not TASK.is_terminal(page.state)
        shown, end, found = window_page(
            self.redaction.of_bytes(), window.decode("latin-1"), lead, want, more)
        data: Any = UNSET
        if body:
            self.redaction.record(
                found, f"the log of task {row.task_id}, Hand {row.hand_label}")
            data = shown.encode("latin-1").decode("utf-8", errors="replace")
        return TaskLogPage(task_id=row.task_id, offset=offset,
                           next_offset=start + end, truncated=page.truncated,
                           state=page.state, data=data)


def _give_up(future: asyncio.Future[HandTaskLogPage]) -> None:
    if not future.done():
        future.set_exception(Unavailable("the task's Hand did not send its log in time"))


def _merged(row: TaskRow, update: TaskUpdate) -> TaskRow:
    """The row as the Store will hold it after ``update`` (docs/hands.md)."""
    changes: dict[str, Any] = {"updated_at": update.at}
    for field in dataclasses.fields(TaskUpdate):
        name = field.name
        value = getattr(update, name)
        if name in ("task_id", "at") or value is None:
            continue
        if name in ("delivered_at", "hand_task_id") and getattr(row, name) is not None:
            continue
        changes[name] = value
    return dataclasses.replace(row, **changes)
