"""The conversations' actors (I2: one writer per conversation), as the Mind
keeps them: loaded on first use (concurrent loads share one), unloaded when
idle (memory follows the work, not the history), and — in cluster mode —
claimed with a fenced lease and stepped down when another node takes over.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from halfpi.config import Config
from halfpi.core.ids import NodeId
from halfpi.core.timers import Deadlines
from halfpi.errors import ErrorCode, FencedOut, NotFound, NotOwner, Unavailable
from halfpi.journal.base import Journal
from halfpi.mind.actor import ActorEnv, ConversationActor
from halfpi.mind.counters import ClusterCounts
from halfpi.mind.trim import Trimmer, malloc_trim
from halfpi.store.base import Fence, Store, WriteTx

if TYPE_CHECKING:
    from halfpi.core.outbound import Message
    from halfpi.mind.subscriptions import ConversationView


class Ownership(Protocol):
    """Cluster mode: this node's part in a cluster (``mind/cluster_node.py``) —
    leases, replicas, forwarding and news between nodes."""

    replicas: dict[str, Any]

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def take(self, conversation_id: str) -> Any:
        """The conversation's lease (with its ``fence``), or NotOwner."""
        ...

    async def give_back(self, conversation_id: str) -> None: ...

    def lost(self, conversation_id: str) -> None: ...

    async def owner_of(self, conversation_id: str) -> str | None: ...

    async def replica(self, conversation_id: str) -> ConversationView: ...

    async def forward(self, owner: str, caller: Any, type_: str, payload: Any) -> None: ...

    async def maintain(self) -> None: ...

    def announce(self, message: Message) -> None: ...

    async def check_leases(self) -> None:
        """Raises unless the node's lease renewals keep up (readiness)."""
        ...

    def counts(self) -> ClusterCounts:
        """What ``GET /metrics`` shows of this node's part."""
        ...


class Host(Protocol):
    """What the actors need of the Mind (``mind/service.py``)."""

    config: Config
    journal: Journal
    env: ActorEnv
    cluster: Ownership | None
    node_id: NodeId

    @property
    def store(self) -> Store: ...

    def monotonic(self) -> float: ...

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]: ...

    async def recover(self, loaded: ConversationActor | None = None) -> None: ...


class Actors:
    """The loaded conversations' actors (``Mind.actors``)."""

    def __init__(self, mind: Host) -> None:
        self.mind = mind
        self._actors: dict[str, ConversationActor] = {}
        self._loading: dict[str, asyncio.Future[ConversationActor]] = {}
        # When each loaded actor is next looked at for unloading (a heap: a
        # round visits only the actors whose idle time may have run out).
        self._idle: Deadlines[ConversationActor] = Deadlines()
        # Journal windows being dropped: a load of the same conversation waits.
        self._releasing: dict[str, asyncio.Task[None]] = {}
        # The allocator asked to give back what unloading freed (mind/trim.py).
        self.trimmer = Trimmer(malloc_trim())

    def __len__(self) -> int:
        return len(self._actors)

    def __iter__(self) -> Iterator[ConversationActor]:
        return iter(list(self._actors.values()))

    async def actor(self, conversation_id: str) -> ConversationActor:
        """The one actor of a conversation; concurrent loads share one load.

        A conversation loaded in this process for the first time (or whose
        journal lost continuity) gets a new epoch, stored before the actor
        exists, so no cursor of it is shown before the Store holds it; one
        loaded again after it was unloaded keeps its epoch and continues
        its seq (from the Store's head: past its seq reservation)."""
        actor = self._loaded(conversation_id)
        if actor is not None:
            actor.used_at = self.mind.monotonic()
            return actor
        loading = self._loading.get(conversation_id)
        if loading is None:
            loading = asyncio.get_running_loop().create_future()
            self._loading[conversation_id] = loading
            try:
                row = await self.mind.store.get_conversation(conversation_id)
                if row is None:
                    raise NotFound(
                        ErrorCode.CONVERSATION_NOT_FOUND,
                        f"no conversation {conversation_id}",
                        field="conversation_id",
                    )
                fence = None
                if self.mind.cluster is not None:
                    fence = await self._claim(conversation_id)
                head = await self.mind.store.head_seq(conversation_id)
                releasing = self._releasing.get(conversation_id)
                if releasing is not None:  # its window is being dropped: after that
                    await asyncio.wait({releasing})
                epoch = await self.mind.journal.open(conversation_id, row.epoch, head)
                if epoch != row.epoch:
                    # Continuity lost (a restart of the in-process journal):
                    # cursors of the old epoch get epoch_changed from now on.
                    await self.mind.store.write(
                        WriteTx(epochs=[(conversation_id, epoch)], fence=fence)
                    )
                    row = dataclasses.replace(row, epoch=epoch)
                actor = ConversationActor(self.mind.env, row, head, epoch)
                actor.fence = fence
                self._actors[conversation_id] = actor
                self._idle.set(actor, actor.idle_since() + self.unload_idle_s)
                if fence is not None:
                    # Taken over: close what the previous owner left open —
                    # before any command gets the actor (they wait for the
                    # load): a request retried meanwhile is answered with
                    # its outcome, never as still running.
                    await self.mind.recover(loaded=actor)
                loading.set_result(actor)
            except BaseException as exc:
                loading.set_exception(exc)
                loading.exception()  # mark retrieved: waiters re-raise it themselves
                raise
            finally:
                del self._loading[conversation_id]
            return actor
        return await asyncio.shield(loading)

    async def _claim(self, conversation_id: str) -> Fence:
        """Cluster mode: take the conversation's lease and claim its token in
        the Store (a write with only a fence): from that commit on, no write
        of an earlier owner lands. Raises NotOwner when another node owns it."""
        assert self.mind.cluster is not None
        lease = await self.mind.cluster.take(conversation_id)
        fence = Fence(conversation_id, lease.fence)
        try:
            await self.mind.store.write(WriteTx(fence=fence))
        except FencedOut:
            self.mind.cluster.lost(conversation_id)
            raise Unavailable("the conversation changed owner while loading; retry") from None
        return fence

    async def view(self, conversation_id: str) -> ConversationView:
        """What a subscription or a read follows: the conversation's actor,
        or in cluster mode, when another node owns it, this node's replica."""
        actor = self._loaded(conversation_id)
        if actor is not None:
            actor.used_at = self.mind.monotonic()
            return actor
        cluster = self.mind.cluster
        if cluster is None:
            return await self.actor(conversation_id)
        replica = cluster.replicas.get(conversation_id)
        if replica is not None and not replica.unloaded:
            return replica  # type: ignore[no-any-return]
        owner = await cluster.owner_of(conversation_id)
        if owner is None or owner == self.mind.node_id:
            try:
                return await self.actor(conversation_id)
            except NotOwner:
                pass  # taken by another node meanwhile: follow it
        if await self.mind.store.get_conversation(conversation_id) is None:
            raise NotFound(
                ErrorCode.CONVERSATION_NOT_FOUND,
                f"no conversation {conversation_id}",
                field="conversation_id",
            )
        return await cluster.replica(conversation_id)

    def _loaded(self, conversation_id: str) -> ConversationActor | None:
        """The conversation's actor once it is loaded — not while a take-over
        still closes what the previous owner left open: commands, reads and
        subscriptions wait for that (through :meth:`actor`)."""
        if conversation_id in self._loading:
            return None
        return self._actors.get(conversation_id)

    def owned(self, conversation_id: str) -> ConversationActor | None:
        """The conversation's actor if it is loaded here (and so owned)."""
        return self._actors.get(conversation_id)

    def step_down(self, conversation_id: str) -> None:
        """Cluster mode: another node owns the conversation now (a lease lost,
        a write refused for its fencing token). The actor never writes again,
        its running chat is left to the new owner, and its followers move to
        a replica (or to a new actor, should the conversation be free)."""
        if self.mind.cluster is not None:
            self.mind.cluster.lost(conversation_id)
        actor = self._actors.pop(conversation_id, None)
        if actor is None:
            return
        actor.unloaded = True
        self._idle.discard(actor)
        run = actor.chat_run
        if run is not None:
            actor.stop(run, "interrupted", "another node took the conversation over")
        # Where each connection got, taken now: a commit still in flight may
        # publish on this actor, but to nobody (the new view replays it).
        listeners = [
            (sub, sub.owner.position(conversation_id))
            for sub in actor.subscribers.values()
            if sub.owner is not None
        ]
        actor.subscribers.clear()
        for listener, pos in listeners:  # onto whatever view the conversation has now
            listener.owner.move(conversation_id, self.view, pos)

    @property
    def unload_idle_s(self) -> float:
        """How long an idle actor stays loaded (default: the journal's window)."""
        configured = self.mind.config.unload_idle_s
        return self.mind.config.journal.seconds if configured is None else configured

    async def unload_idle(self, now: float) -> int:
        """Unload every actor idle (``ConversationActor.idle``) for
        ``unload_idle_s`` at ``now`` (time passed in): memory follows the
        work, not the history. Its journal window is dropped, its epoch
        stays in the Store; loading it again is transparent, and a resume
        from a cursor of before replays from the Store (docs/protocol.md).
        Returns how many were unloaded. A round looks only at the actors
        whose idle time may have run out (a heap of deadlines)."""
        idle_s = self.unload_idle_s
        releases: list[asyncio.Task[None]] = []
        for actor in self._idle.pop_due(now):
            if self._actors.get(actor.id) is not actor:
                continue
            if not actor.idle():  # working, or someone follows it: look again later
                self._idle.set(actor, now + idle_s)
                continue
            due = actor.idle_since() + idle_s
            if due > now:
                self._idle.set(actor, due)
                continue
            # In one synchronous step: from here on a load makes a new actor
            # (after the window is dropped), and this one never writes (I2).
            del self._actors[actor.id]
            actor.unloaded = True
            releases.append(self._release(actor.id))
        if releases:
            await asyncio.wait(releases)
            self.trimmer.unloaded(len(releases))
        # After the windows were dropped: the pages they held go back to the
        # system (at most every few seconds, only after an unload).
        self.trimmer.maybe_trim(now, idle=not self._actors)
        return len(releases)

    def _release(self, conversation_id: str) -> asyncio.Task[None]:
        task = self.mind.spawn(self._release_window(conversation_id), "release a journal window")
        self._releasing[conversation_id] = task

        def released(_: object) -> None:
            if self._releasing.get(conversation_id) is task:
                del self._releasing[conversation_id]

        task.add_done_callback(released)
        return task

    async def _release_window(self, conversation_id: str) -> None:
        await self.mind.journal.release(conversation_id)
        if self.mind.cluster is not None:
            await self.mind.cluster.give_back(conversation_id)
