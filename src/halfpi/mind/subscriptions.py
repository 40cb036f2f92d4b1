"""A connection's subscriptions: resume planning, replay and going live (DESIGN §4.2, I4).

A subscription is either *replaying* — it catches up from ``pos`` on what
was published before it was installed — or *live*, when the actor pushes
each event to it as it is published (the actor's done-callback, I3: no hop).

Replay reads are coroutines (a journal may be remote), so each catching-up
subscription has one read at a time under way (a task, only while one is
needed): it fills the subscription's small buffer — journal entries, or
below the journal's window of an unloaded-and-reloaded conversation, the
durable events the Store holds — and wakes the connection. The
connection's flush *pulls* from the buffers within its byte budget
(:meth:`Subscriptions.pull`), only while its transport takes writes, so
catching up on 10,000 events never floods the bounded queue, and a
buffer is refilled only as it drains (back-pressure end to end).

**The switch to live** happens inside ``pull``, in one synchronous step:
when a subscription's buffer is empty, no read is under way and it has
read everything up to the actor's ``published`` seq, it turns live. The
actor's publication (which sets ``published`` and pushes to live
subscriptions) is synchronous too, so every event is either at or below
that seq — read by the replay — or after it — pushed live: no gap, no
overlap. A read that finds the journal behind ``published`` (appends in
flight to a remote journal) waits for them (``ConversationView.journaled``).

:class:`Subscriptions` is everything one connection subscribed to, whatever
its transport: ``face.subscribe`` plans each conversation (exact replay from
a cursor, a reset with a snapshot, or live) and installs it; a window that
moves past a replaying subscription turns into a ``face.reset``. The
connection is only a :class:`Sink`: it sends what it is given, and flushes
(pulls) when woken.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from halfpi.core import wire
from halfpi.core.cursor import encode_cursor, parse_cursor
from halfpi.core.events import Accepted, Reset, Snapshot, to_message
from halfpi.core.outbound import PROGRESS, RELIABLE, Message, OutboundQueue
from halfpi.core.replay import Exact, plan_resume
from halfpi.errors import CloseCode, InvalidRequest, Unavailable
from halfpi.journal.base import Journal, JournalEntry, message_of, prefix_of
from halfpi.mind.actor import Listener

log = logging.getLogger("halfpi.mind")

REPLAY_BATCH = 1024  # journal entries per read (a list of shared references in process)
STORE_BATCH = 256  # durable events per Store read (rebuilt messages)
FRAME_SLACK = 12  # a frame beyond its prefix and body: event_seq digits, a brace
# A subscribe planned while one of its conversations was unloaded is planned
# again (the new actor is the writer); after this many, ``unavailable``.
PLAN_ATTEMPTS = 3
# A subscription moved to another view (cluster mode) is planned again this
# many times before its connection is closed (its Face then resumes).
FOLLOW_ATTEMPTS = 5

# What ``face.subscribe.transient_types`` may name (docs/protocol.md §6):
# ``face.run.progress`` is reserved for background tasks.
TRANSIENT_TYPES = ("face.chat.delta", "face.chat.tool.progress", "face.run.progress")


class ConversationView(Protocol):
    """What a subscription follows: a conversation's actor (this node writes
    it) or, in cluster mode, its replica (another node does,
    ``mind/replica.py``)."""

    @property
    def id(self) -> str: ...

    @property
    def epoch(self) -> str: ...

    @property
    def published(self) -> int: ...

    @property
    def unloaded(self) -> bool: ...

    def cursor(self, seq: int) -> str: ...

    def add_listener(self, key: object, listener: Listener) -> None: ...

    def remove_listener(self, key: object) -> None: ...

    async def journaled(self) -> None: ...

    async def committed_after(
        self, after_seq: int, until: int, limit: int
    ) -> tuple[list[Message], int]: ...

    async def snapshot(self, messages_limit: int, detail_mode: str) -> Snapshot: ...


ActorOf = Callable[[str], Awaitable[ConversationView]]
Spawn = Callable[[Coroutine[Any, Any, None], str], object]


class Sink(Protocol):
    """What subscriptions need of a connection, whatever its transport."""

    @property
    def closed(self) -> bool: ...

    def send(self, message: Message) -> None:
        """Queue ``message`` (the connection's bounded queue, I7)."""

    def wake(self) -> None:
        """Replayed messages wait: flush (and so :meth:`Subscriptions.pull`)
        when the transport takes writes."""

    def close(self, code: int, reason: str) -> None:
        """End the connection (its Face resumes from its cursors)."""


class Subscription:
    __slots__ = (
        "actor",
        "buffer",
        "committed_until",
        "detail_mode",
        "fetching",
        "live",
        "owner",
        "pos",
        "read",
        "session",
        "transient_types",
    )

    def __init__(
        self,
        session: Any,
        actor: ConversationView,
        *,
        pos: int,
        transient_types: frozenset[str] | None,
        detail_mode: str,
        committed_until: int = 0,
        owner: Subscriptions | None = None,
    ) -> None:
        self.session = session  # anything with send(Message)
        self.actor = actor
        # The connection's subscriptions (a replica re-plans through it).
        self.owner = owner
        self.pos = pos  # the last seq handed to the connection (or skipped for it)
        self.read = pos  # the seq read up to (into the buffer)
        # Up to here, the durable events come from the Store (the journal
        # no longer holds them: an unloaded conversation, loaded again).
        self.committed_until = committed_until
        self.buffer: deque[JournalEntry | Message] = deque()
        self.fetching = False  # a read is under way
        self.live = False
        self.transient_types = transient_types
        self.detail_mode = detail_mode

    @property
    def conversation_id(self) -> str:
        return self.actor.id

    def wants(self, message: Message) -> bool:
        """Transient messages pass only if the Face asked for their type."""
        return self.transient_types is None or message.type in self.transient_types

    def skips(self, entry: JournalEntry) -> bool:
        """A replayed entry this subscription would not be sent (I9: no
        progress to summary viewers; transient types it did not ask for)."""
        kind = entry.kind
        if kind == RELIABLE:
            return False
        if kind == PROGRESS and self.detail_mode != "transparent":
            return True
        return self.transient_types is not None and entry.type not in self.transient_types


class Subscriptions:
    """The subscriptions of one connection."""

    __slots__ = (
        "_origins",
        "by_conversation",
        "journal",
        "replaying",
        "resets",
        "sink",
        "sleep",
        "snapshot_messages",
        "spawn",
    )

    def __init__(
        self,
        sink: Sink,
        journal: Journal,
        spawn: Spawn,
        snapshot_messages: int,
        resets: Counter[str] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        # Resets sent, by reason: the Mind's counters (``GET /metrics``).
        self.resets: Counter[str] = Counter() if resets is None else resets
        self.sink = sink
        self.journal = journal
        self.spawn = spawn
        self.snapshot_messages = snapshot_messages
        # The wait between attempts to follow a conversation again: the
        # Mind's scheduler (its monotonic clock; a test's fake one).
        self.sleep = sleep
        self.by_conversation: dict[str, Subscription] = {}
        self.replaying: list[Subscription] = []  # still catching up, in install order
        # Where each conversation was first subscribed from: the cursor to
        # resume from if nothing of it was written to the connection since.
        self._origins: dict[str, str] = {}

    def __contains__(self, conversation_id: str) -> bool:
        return conversation_id in self.by_conversation

    @property
    def ready(self) -> bool:
        """:meth:`pull` has something to do now: replayed messages wait, or
        a subscription may go live or read on. False while every catching-up
        subscription waits for its read (which wakes the connection)."""
        return any(sub.buffer or not sub.fetching for sub in self.replaying)

    # -- face.subscribe / face.unsubscribe -------------------------------------

    async def subscribe(self, p: wire.Subscribe, detail_mode: str, actor_of: ActorOf) -> None:
        """Exact replay from each cursor, or a reset with a snapshot (I4).

        All reads happen first; then, in one synchronous step, the reply, the
        snapshots/resets and the subscriptions are queued and installed, so no
        replayed event can overtake the ``face.accepted`` that announces it.
        If a conversation was unloaded while the reads were under way, the
        whole subscribe is planned again on its new actor.
        """
        since = dict(p.since or {})
        unknown = set(since) - set(p.conversation_ids)
        if unknown:
            raise InvalidRequest(
                f"since names {sorted(unknown)[0]} which is not subscribed", field="since"
            )
        cursors = {cid: parse_cursor(text, field=f"since.{cid}") for cid, text in since.items()}
        for name in p.transient_types or ():
            if name not in TRANSIENT_TYPES:
                raise InvalidRequest(
                    f"transient_types names {name!r}, which is not a transient message type; "
                    f"known: {', '.join(TRANSIENT_TYPES)}",
                    field="transient_types",
                )
        transient = frozenset(p.transient_types) if p.transient_types is not None else None
        for _ in range(PLAN_ATTEMPTS):
            planned = await self._plan(p, cursors, detail_mode, actor_of)
            if planned is not None:
                break
        else:
            raise Unavailable("the conversations were unloaded while subscribing; retry")
        plans, modes, followups = planned
        replay = "exact" if cursors and all(modes[c] == "exact" for c in cursors) else "live"
        # ``heads``: where each log stands at this instant, so a Face knows how
        # many replayed events it is catching up on and when it has caught up.
        heads = {actor.id: actor.cursor(actor.published) for actor, _, _ in plans}
        self.sink.send(
            to_message(
                Accepted(
                    request_id=p.request_id,
                    operation="subscribe",
                    replay=replay,
                    conversations=modes,
                    heads=heads,
                )
            )
        )
        for message in followups:
            self.sink.send(message)
        for actor, pos, committed_until in plans:
            self.install(actor, pos, transient, detail_mode, committed_until)

    async def _plan(
        self,
        p: wire.Subscribe,
        cursors: dict[str, Any],
        detail_mode: str,
        actor_of: ActorOf,
    ) -> tuple[list[tuple[ConversationView, int, int]], dict[str, str], list[Message]] | None:
        """Each conversation's plan: ``(actor, pos, committed_until)``, its mode
        and the snapshots/resets to send first. None if a conversation was
        unloaded meanwhile (its actor no longer writes: plan again)."""
        limit = self.snapshot_messages
        plans: list[tuple[ConversationView, int, int]] = []
        modes: dict[str, str] = {}
        followups: list[Message] = []
        for cid in dict.fromkeys(p.conversation_ids):
            actor = await actor_of(cid)
            cursor = cursors.get(cid)
            if cursor is not None:
                if actor.unloaded:
                    return None
                window = await self.journal.window(cid)
                plan = plan_resume(
                    cursor,
                    epoch=actor.epoch,
                    floor=window.floor,
                    head=actor.published,
                    settled=window.settled,
                )
                if isinstance(plan, Exact):
                    plans.append((actor, plan.after_seq, plan.committed_until or 0))
                    modes[cid] = "exact"
                    continue
                snap = await actor.snapshot(limit, detail_mode)
                followups.append(
                    to_message(Reset(conversation_id=cid, reason=plan.reason.value, snapshot=snap))
                )
                self.resets[plan.reason.value] += 1
                modes[cid] = "reset"
            elif p.snapshot:
                snap = await actor.snapshot(limit, detail_mode)
                followups.append(to_message(snap.answering(p.request_id)))
                modes[cid] = "live"
            else:
                plans.append((actor, actor.published, 0))
                modes[cid] = "live"
                continue
            plans.append((actor, parse_cursor(snap.cursor).seq, 0))
        if any(actor.unloaded for actor, _, _ in plans):
            return None
        return plans, modes, followups

    def install(
        self,
        actor: ConversationView,
        pos: int,
        transient_types: frozenset[str] | None,
        detail_mode: str,
        committed_until: int = 0,
    ) -> None:
        """Subscribe from ``pos``: replay what is newer (the durable events up
        to ``committed_until`` from the Store), then go live."""
        if self.sink.closed:  # the connection went while the subscribe was being read
            return
        self.drop(actor.id)
        sub = Subscription(
            self.sink,
            actor,
            pos=pos,
            transient_types=transient_types,
            detail_mode=detail_mode,
            committed_until=committed_until,
            owner=self,
        )
        self.by_conversation[actor.id] = sub
        actor.add_listener(self.sink, sub)
        self._origins.setdefault(actor.id, actor.cursor(pos))
        if pos >= actor.published and not committed_until:
            sub.live = True  # nothing to catch up on: live from this very step
            return
        self.replaying.append(sub)
        self._fetch(sub)

    def position(self, conversation_id: str) -> int | None:
        """The last seq of the conversation handed to this connection (a live
        subscription has been handed everything its view published)."""
        sub = self.by_conversation.get(conversation_id)
        if sub is None:
            return None
        return sub.actor.published if sub.live else sub.pos

    def move(self, conversation_id: str, view_of: ActorOf, pos: int | None = None) -> None:
        """The conversation changed hands (cluster mode: this node took it
        over or stepped down, or its replica resynced): follow it through
        the view ``view_of`` gives *now*, from where this connection got
        (``pos``, taken when the old view stopped; default: now), exactly or
        with a ``face.reset`` (I4). A view that is replaced while this is
        planned is looked up again, so two moves racing end on the current
        view, never on one that no longer hears anything."""
        sub = self.by_conversation.get(conversation_id)
        if sub is None or self.sink.closed:
            return
        if pos is None:
            pos = sub.actor.published if sub.live else sub.pos
        cursor = encode_cursor(sub.actor.epoch, pos)
        self.drop(conversation_id)
        self.spawn(
            self._follow(conversation_id, view_of, cursor, sub.transient_types, sub.detail_mode),
            "move subscription",
        )

    async def _follow(
        self,
        cid: str,
        view_of: ActorOf,
        cursor: str,
        transient_types: frozenset[str] | None,
        detail_mode: str,
    ) -> None:
        for attempt in range(FOLLOW_ATTEMPTS):
            if self.sink.closed or cid in self.by_conversation:
                return  # gone, or subscribed again meanwhile
            try:
                view = await view_of(cid)
                window = await self.journal.window(cid)
                plan = plan_resume(
                    parse_cursor(cursor),
                    epoch=view.epoch,
                    floor=window.floor,
                    head=view.published,
                    settled=window.settled,
                )
                if isinstance(plan, Exact):
                    if view.unloaded:
                        continue  # replaced while planning: look it up again
                    if cid not in self.by_conversation and not self.sink.closed:
                        committed_until = plan.committed_until or 0
                        self.install(
                            view, plan.after_seq, transient_types, detail_mode, committed_until
                        )
                    return
                snap = await view.snapshot(self.snapshot_messages, detail_mode)
                if view.unloaded:
                    continue
                if self.sink.closed or cid in self.by_conversation:
                    return
                reset = Reset(conversation_id=cid, reason=plan.reason.value, snapshot=snap)
                self.sink.send(to_message(reset))
                self.resets[plan.reason.value] += 1
                self.install(view, parse_cursor(snap.cursor).seq, transient_types, detail_mode)
                return
            except Exception as exc:
                log.warning("could not follow %s again (%s); trying again", cid, exc)
                await self.sleep(0.1 * 2**attempt)  # a backoff between attempts
        # Never a silent gap: a connection that cannot be brought back on the
        # log is closed, and its Face resumes from its cursors.
        self.sink.close(CloseCode.RESTARTING, "the conversation moved; resume")

    def drop(self, conversation_id: str) -> None:
        sub = self.by_conversation.pop(conversation_id, None)
        if sub is None:
            return
        sub.actor.remove_listener(self.sink)
        sub.buffer.clear()
        if sub in self.replaying:
            self.replaying.remove(sub)

    def drop_all(self) -> None:
        for conversation_id in list(self.by_conversation):
            self.drop(conversation_id)

    # -- replay (I4) --------------------------------------------------------------

    def pull(self, budget: int) -> list[Message]:
        """The next replayed messages, about ``budget`` bytes of them, in
        order, for the connection to write now (each subscription's detail
        mode and transient types applied). A subscription that has caught up
        goes live in this same step; one whose buffer runs low reads on."""
        out: list[Message] = []
        self._pull(budget, out, None)
        return out

    def pull_frames(self, queue: OutboundQueue, budget: int) -> list[bytes]:
        """:meth:`pull`, framed at once for a connection whose ``queue`` is
        empty (each frame takes its ``event_seq``; the queue learns the last
        cursor written per conversation): a replayed journal entry becomes a
        frame without a :class:`Message` ever being made of it."""
        out: list[bytes] = []
        self._pull(budget, out, queue)
        return out

    def _pull(self, budget: int, out: list[Any], queue: OutboundQueue | None) -> None:
        append = out.append
        for sub in list(self.replaying):
            actor = sub.actor
            buffer = sub.buffer
            cid, epoch, mode = actor.id, actor.epoch, sub.detail_mode
            summary_mode = mode != "transparent"
            framed = 0  # the last entry framed (its cursor is the queue's to know)
            while budget > 0 and buffer:
                item = buffer.popleft()
                sub.pos = item.seq
                if isinstance(item, JournalEntry):
                    if item.kind != RELIABLE and sub.skips(item):
                        continue
                    if queue is not None:
                        summary = item.summary
                        body = summary if summary_mode and summary is not None else item.body
                        frame = queue.emit_body(prefix_of(item.type), body)
                        framed = item.seq
                        budget -= len(frame)
                        append(frame)
                        continue
                    m = message_of(cid, epoch, item)
                else:  # a durable event from the Store
                    m = item
                shown = m.for_mode(mode)
                if shown is None:
                    continue
                if queue is not None:
                    frame = queue.emit_now(shown)
                    framed = 0
                    budget -= len(frame)
                    append(frame)
                else:
                    # The frame's size, with room for the event_seq the
                    # connection splices in.
                    budget -= len(shown.prefix) + len(shown.encoded_body()) + FRAME_SLACK
                    append(shown)
            if framed:
                assert queue is not None
                queue.wrote(cid, f"{epoch}.{framed}")
            if not sub.fetching:
                if not buffer and sub.read >= actor.published:
                    # Caught up: live from here, in this same step (no event
                    # can be published between the check and the switch).
                    sub.live = True
                    self.replaying.remove(sub)
                elif len(buffer) < REPLAY_BATCH // 2 and sub.read < actor.published:
                    self._fetch(sub)  # read on while the rest is written
            if budget <= 0:
                break

    def _fetch(self, sub: Subscription) -> None:
        sub.fetching = True
        self.spawn(self._read(sub), "replay read")

    async def _read(self, sub: Subscription) -> None:
        """One read for ``sub`` into its buffer; then the connection is woken.
        A window that moved past it resets it (``cursor_expired``)."""
        cid = sub.conversation_id
        try:
            batch = await self._next_batch(sub)
        except Exception:
            if self.by_conversation.get(cid) is sub and not self.sink.closed:
                log.exception("replay of %s failed; the subscription is reset", cid)
            batch = None
        sub.fetching = False
        if self.sink.closed or self.by_conversation.get(cid) is not sub:
            return  # dropped (or replaced) while it read
        if batch is None:
            # The subscription stays installed (not live) until the reset is
            # sent: its actor keeps a listener, so it is not unloaded meanwhile.
            self.replaying.remove(sub)
            self.spawn(self._reset(sub), "reset subscription")
            return
        sub.buffer.extend(batch)
        self.sink.wake()

    async def _next_batch(self, sub: Subscription) -> list[JournalEntry | Message] | None:
        """The next entries after ``sub.read`` (advancing it), from the Store
        below ``committed_until``, then from the journal; None if the journal
        no longer holds what follows ``sub.read``."""
        actor = sub.actor
        if sub.read < sub.committed_until:
            until = sub.committed_until
            messages, sub.read = await actor.committed_after(sub.read, until, STORE_BATCH)
            return list(messages)
        cid = sub.conversation_id
        journal = self.journal
        entries = await journal.read_after(cid, sub.read, REPLAY_BATCH)
        if entries == [] and sub.read < actor.published:
            # Published but not read: appends still on their way to the
            # journal, or seqs that were reserved and never used.
            await actor.journaled()
            head = (await journal.window(cid)).head
            entries = await journal.read_after(cid, sub.read, REPLAY_BATCH)
            if entries == []:
                sub.read = max(sub.read, head)  # nothing exists in (read, head]
                return []
        if entries is None:
            return None
        if entries:
            sub.read = entries[-1].seq
        return list(entries)

    async def _reset(self, sub: Subscription) -> None:
        actor = sub.actor
        snap = await actor.snapshot(self.snapshot_messages, sub.detail_mode)
        if self.sink.closed or self.by_conversation.get(actor.id) is not sub:
            return
        self.sink.send(
            to_message(Reset(conversation_id=actor.id, reason="cursor_expired", snapshot=snap))
        )
        self.resets["cursor_expired"] += 1
        self.install(actor, parse_cursor(snap.cursor).seq, sub.transient_types, sub.detail_mode)

    def resume_cursors(self, written: dict[str, str]) -> dict[str, str]:
        """Where the connection resumes each conversation (``face.evicted``):
        the cursor of the last message ``written`` to it, else where it was
        subscribed from; a subscription still replaying, from where it got."""
        cursors = {**self._origins, **written}
        for sub in self.replaying:
            cursors[sub.conversation_id] = sub.actor.cursor(sub.pos)
        return cursors
