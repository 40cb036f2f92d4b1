"""A connection's subscriptions: resume planning, replay and going live (DESIGN §4.2, I4).

A subscription is either *replaying* — the connection pulls events from the
journal after ``pos`` as fast as its transport drains (so catching up on
10,000 events never floods the bounded queue) — or *live*, when the actor
pushes each event as it is published. The switch happens in one synchronous
step when the pull finds nothing newer, so there is no gap and no overlap.

:class:`Subscriptions` is everything one connection subscribed to, whatever
its transport: ``face.subscribe`` plans each conversation (exact replay from
a cursor, a reset with a snapshot, or live) and installs it; the
connection's flush asks :meth:`Subscriptions.pull` for the next replayed
messages within a byte budget instead of reading the journal itself; a
window that moves past a replaying subscription turns into a
``face.reset``. The connection is only a :class:`Sink`: it sends what it is
given, and flushes (pulls) when woken.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from halfpi.core import wire
from halfpi.core.cursor import parse_cursor
from halfpi.core.events import Accepted, Reset, to_message
from halfpi.core.outbound import RELIABLE, Message
from halfpi.core.replay import Exact, plan_resume
from halfpi.errors import InvalidRequest
from halfpi.journal.base import Journal
from halfpi.mind.actor import ConversationActor

REPLAY_BATCH = 256
FRAME_SLACK = 12  # a frame beyond its prefix and body: event_seq digits, a brace

# What ``face.subscribe.transient_types`` may name (docs/protocol.md §6):
# ``face.run.progress`` is reserved for background tasks.
TRANSIENT_TYPES = ("face.chat.delta", "face.chat.tool.progress", "face.run.progress")

ActorOf = Callable[[str], Awaitable[ConversationActor]]
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


class Subscription:
    __slots__ = ("actor", "detail_mode", "live", "pos", "session", "transient_types")

    def __init__(
        self,
        session: Any,
        actor: ConversationActor,
        *,
        pos: int,
        transient_types: frozenset[str] | None,
        detail_mode: str,
    ) -> None:
        self.session = session  # anything with send(Message)
        self.actor = actor
        self.pos = pos
        self.live = False
        self.transient_types = transient_types
        self.detail_mode = detail_mode

    @property
    def conversation_id(self) -> str:
        return self.actor.id

    def wants(self, message: Message) -> bool:
        """Transient messages pass only if the Face asked for their type."""
        return self.transient_types is None or message.type in self.transient_types


class Subscriptions:
    """The subscriptions of one connection."""

    __slots__ = (
        "_origins",
        "by_conversation",
        "journal",
        "replaying",
        "sink",
        "snapshot_messages",
        "spawn",
    )

    def __init__(self, sink: Sink, journal: Journal, spawn: Spawn, snapshot_messages: int) -> None:
        self.sink = sink
        self.journal = journal
        self.spawn = spawn
        self.snapshot_messages = snapshot_messages
        self.by_conversation: dict[str, Subscription] = {}
        self.replaying: list[Subscription] = []  # still catching up, in install order
        # Where each conversation was first subscribed from: the cursor to
        # resume from if nothing of it was written to the connection since.
        self._origins: dict[str, str] = {}

    def __contains__(self, conversation_id: str) -> bool:
        return conversation_id in self.by_conversation

    # -- face.subscribe / face.unsubscribe -------------------------------------

    async def subscribe(self, p: wire.Subscribe, detail_mode: str, actor_of: ActorOf) -> None:
        """Exact replay from each cursor, or a reset with a snapshot (I4).

        All reads happen first; then, in one synchronous step, the reply, the
        snapshots/resets and the subscriptions are queued and installed, so no
        replayed event can overtake the ``face.accepted`` that announces it.
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
        limit = self.snapshot_messages
        plans: list[tuple[ConversationActor, int]] = []
        modes: dict[str, str] = {}
        followups: list[Message] = []
        for cid in dict.fromkeys(p.conversation_ids):
            actor = await actor_of(cid)
            cursor = cursors.get(cid)
            if cursor is not None:
                epoch, floor, head = self.journal.window(cid)
                plan = plan_resume(cursor, epoch=epoch, floor=floor, head=head)
                if isinstance(plan, Exact):
                    plans.append((actor, plan.after_seq))
                    modes[cid] = "exact"
                    continue
                snap = await actor.snapshot(limit, detail_mode)
                followups.append(
                    to_message(Reset(conversation_id=cid, reason=plan.reason.value, snapshot=snap))
                )
                modes[cid] = "reset"
            elif p.snapshot:
                snap = await actor.snapshot(limit, detail_mode)
                followups.append(to_message(snap.answering(p.request_id)))
                modes[cid] = "live"
            else:
                plans.append((actor, actor.published))
                modes[cid] = "live"
                continue
            plans.append((actor, parse_cursor(snap.cursor).seq))
        replay = "exact" if cursors and all(modes[c] == "exact" for c in cursors) else "live"
        # ``heads``: where each log stands at this instant, so a Face knows how
        # many replayed events it is catching up on and when it has caught up.
        heads = {actor.id: actor.cursor(actor.published) for actor, _ in plans}
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
        for actor, pos in plans:
            self.install(actor, pos, transient, detail_mode)

    def install(
        self,
        actor: ConversationActor,
        pos: int,
        transient_types: frozenset[str] | None,
        detail_mode: str,
    ) -> None:
        """Subscribe from ``pos``: replay what is newer, then go live."""
        if self.sink.closed:  # the connection went while the subscribe was being read
            return
        self.drop(actor.id)
        sub = Subscription(
            self.sink, actor, pos=pos, transient_types=transient_types, detail_mode=detail_mode
        )
        self.by_conversation[actor.id] = sub
        actor.add_listener(self.sink, sub)
        self._origins.setdefault(actor.id, actor.cursor(pos))
        self.replaying.append(sub)
        self.sink.wake()

    def drop(self, conversation_id: str) -> None:
        sub = self.by_conversation.pop(conversation_id, None)
        if sub is None:
            return
        sub.actor.remove_listener(self.sink)
        if sub in self.replaying:
            self.replaying.remove(sub)

    def drop_all(self) -> None:
        for conversation_id in list(self.by_conversation):
            self.drop(conversation_id)

    # -- replay (I4) --------------------------------------------------------------

    def pull(self, budget: int) -> list[Message]:
        """The next replayed messages, about ``budget`` bytes of them, in
        order, for the connection to write now (each subscription's detail
        mode and transient types applied). A subscription that reaches the
        head goes live in this same step; one whose window moved past it is
        dropped and reset (``face.reset{reason: cursor_expired}``)."""
        out: list[Message] = []
        for sub in list(self.replaying):
            while budget > 0:
                batch = self.journal.read_after(sub.conversation_id, sub.pos, REPLAY_BATCH)
                if batch is None:  # the window moved past us while we replayed
                    self.drop(sub.conversation_id)
                    self.spawn(self._reset(sub), "reset subscription")
                    break
                if not batch:
                    sub.live = True
                    self.replaying.remove(sub)
                    break
                for m in batch:
                    if budget <= 0:
                        break  # the rest comes with the next flush
                    sub.pos = m.seq
                    shown = m.for_mode(sub.detail_mode)
                    if shown is not None and (m.kind == RELIABLE or sub.wants(m)):
                        # The frame's size, with room for the event_seq the
                        # connection splices in.
                        budget -= len(shown.prefix) + len(shown.encoded_body()) + FRAME_SLACK
                        out.append(shown)
            if budget <= 0:
                break
        return out

    async def _reset(self, sub: Subscription) -> None:
        actor = sub.actor
        snap = await actor.snapshot(self.snapshot_messages, sub.detail_mode)
        if self.sink.closed:
            return
        self.sink.send(
            to_message(Reset(conversation_id=actor.id, reason="cursor_expired", snapshot=snap))
        )
        self.install(actor, parse_cursor(snap.cursor).seq, sub.transient_types, sub.detail_mode)

    def resume_cursors(self, written: dict[str, str]) -> dict[str, str]:
        """Where the connection resumes each conversation (``face.evicted``):
        the cursor of the last message ``written`` to it, else where it was
        subscribed from; a subscription still replaying, from where it got."""
        cursors = {**self._origins, **written}
        for sub in self.replaying:
            cursors[sub.conversation_id] = sub.actor.cursor(sub.pos)
        return cursors
