"""A conversation another node owns, as this node's Faces follow it (DESIGN §10).

In cluster mode a Face may subscribe on any node. Where the conversation's
owner (its actor, the one writer) is another node, this node keeps a
:class:`Replica`: what a subscription needs of an actor — the epoch, the
last seq published, a replay source, a snapshot — fed by the owner's
fan-out (``halfpi:f:{C}``, the same serialised entries the owner journals).

**Continuity.** Entries arrive in seq order; the replica hands on only the
next seq. A seq that skips (a lost pub/sub message, a lost link, a new
owner that settled the window) makes it *resync*: it reads the epoch and
head from Redis again and re-plans every subscription from where its
connection got (``Subscriptions.move``) — an exact replay from the stream
or, below it, from the Store, or a ``face.reset`` with a snapshot (a new
epoch). Never a silent gap (I4).

**Writes** are never made here: commands for the conversation are
forwarded to the owner (``ClusterNode.forward``, ``mind/cluster_node.py``);
a snapshot is the owner's, asked over the same link, so it shows the
owner's in-memory view (a streaming reply's text so far).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from halfpi.core.cursor import encode_cursor
from halfpi.core.events import Snapshot
from halfpi.core.outbound import DELTA, RELIABLE, Message
from halfpi.errors import Unavailable
from halfpi.journal.base import JournalEntry, message_of
from halfpi.mind.actor import Listener, committed_after

if TYPE_CHECKING:
    from halfpi.journal.redis import RedisJournal
    from halfpi.store.base import Store

log = logging.getLogger("halfpi.cluster")

SnapshotOf = Callable[[str, int, str], Awaitable[Snapshot]]


class _Delta(msgspec.Struct):
    text: str | None = None


_delta_text = msgspec.json.Decoder(_Delta).decode


def live_message(conversation_id: str, epoch: str, entry: JournalEntry) -> Message:
    """A fanned-out entry as a live message: a delta keeps its text (a slow
    connection's queue merges deltas by text), everything else its bytes."""
    if entry.kind == DELTA and entry.request_id is not None:
        seq = entry.seq
        message = Message(
            "face.chat.delta",
            None,
            kind=DELTA,
            conversation_id=conversation_id,
            seq=seq,
            cursor=f"{epoch}.{seq}",
            request_id=entry.request_id,
            text=_delta_text(entry.body).text or "",
        )
        message.encoded_body()
        return message
    return message_of(conversation_id, epoch, entry)


class Replica:
    """A followed conversation owned elsewhere (the actor's reading side)."""

    def __init__(
        self,
        conversation_id: str,
        epoch: str,
        head: int,
        journal: RedisJournal,
        store: Store,
        snapshot_of: SnapshotOf,
        spawn: Callable[[Any, str], object],
        view_of: Callable[[str], Awaitable[Any]],
    ) -> None:
        self.id = conversation_id
        self.epoch = epoch
        self.published = head
        self.journal = journal
        self.store = store
        self._snapshot_of = snapshot_of
        self._spawn = spawn
        self._view_of = view_of  # the conversation's view now (Mind.view)
        self.subscribers: dict[object, Listener] = {}
        # Set once this replica is replaced (this node took the conversation
        # over, or stopped following it): a plan made on it is made again.
        self.unloaded = False
        # Since when nobody follows it (the node drops it after a while).
        self.empty_since: float | None = None
        self._resyncing: list[JournalEntry] | None = None
        self._again = False  # resync once more when the running one ends

    # -- what a subscription needs -------------------------------------------------

    def cursor(self, seq: int) -> str:
        return encode_cursor(self.epoch, seq)

    def add_listener(self, key: object, listener: Listener) -> None:
        self.subscribers[key] = listener

    def remove_listener(self, key: object) -> None:
        self.subscribers.pop(key, None)

    async def journaled(self) -> None:
        """What a replica has published came from Redis: it is there."""

    def message_of(self, entry: JournalEntry) -> Message:
        return message_of(self.id, self.epoch, entry)

    async def committed_after(
        self, after_seq: int, until: int, limit: int
    ) -> tuple[list[Message], int]:
        return await committed_after(self.store, self.id, self.epoch, after_seq, until, limit)

    async def snapshot(self, messages_limit: int, detail_mode: str) -> Snapshot:
        snap = await self._snapshot_of(self.id, messages_limit, detail_mode)
        if snap.epoch != self.epoch:
            # The owner's epoch moved on (Redis lost the journal): follow it
            # anew, so the snapshot's cursor is one this replica serves.
            self.resync()
            raise Unavailable("the conversation's journal changed epoch; retry")
        return snap

    # -- the fan-out ---------------------------------------------------------------

    def receive(self, entries: list[JournalEntry]) -> None:
        """Entries the owner appended, in seq order: each next one is
        published to the live subscriptions; a skipped seq resyncs, and so
        does an empty batch (a new owner settled the journal: what the last
        one stored may never have been fanned out)."""
        if not entries:
            if self._resyncing is not None:
                self._again = True  # the running resync may have read too early
            else:
                self.resync()
            return
        if self._resyncing is not None:
            self._resyncing.extend(entries)
            return
        for entry in entries:
            seq = entry.seq
            if seq <= self.published:
                continue  # already had it (read from the stream at a resync)
            if seq != self.published + 1:
                self.resync()
                self._resyncing = self._resyncing or []
                self._resyncing.extend(e for e in entries if e.seq >= seq)
                return
            self._publish(entry)

    def _publish(self, entry: JournalEntry) -> None:
        self.published = entry.seq
        self.journal.followed(self.id, entry.seq)
        if not self.subscribers:
            return
        message = live_message(self.id, self.epoch, entry)
        kind = message.kind
        for sub in list(self.subscribers.values()):
            if sub.live and (kind == RELIABLE or sub.wants(message)):
                shown = message.for_mode(sub.detail_mode)
                if shown is not None:
                    sub.session.send(shown)

    def resync(self) -> None:
        """Read the epoch and head again from Redis and re-plan every
        subscription from where its connection got (exact, or a reset)."""
        if self._resyncing is None:
            self._resyncing = []
        self._spawn(self._resync(), "replica resync")

    async def _resync(self) -> None:
        if self.unloaded:  # replaced meanwhile: its followers were moved already
            self._resyncing = None
            return
        try:
            followed = await self.journal.follow(self.id)
        except Exception as exc:
            log.warning("could not resync %s: %s", self.id, exc)
            followed = None
        held = self._resyncing or []
        self._resyncing = None
        # Where each connection got, before the head moves on.
        moves = []
        for sub in list(self.subscribers.values()):
            owner = sub.owner
            if owner is not None:
                moves.append((owner, owner.position(self.id)))
        if followed is not None:
            epoch, head = followed
            if epoch == self.epoch:
                self.published = max(head, self.published)
            else:  # a new epoch: every subscription's cursor resets
                self.epoch, self.published = epoch, head
        for owner, pos in moves:
            owner.move(self.id, self._view_of, pos)
        if held:
            self.receive(held)
        if self._again and self._resyncing is None:
            self._again = False
            self.resync()
