"""The Mind: actors, the request registry, credentials and recovery, wired together.

Transports (gateway) hand decoded commands to the Mind API (``mind/api.py``)
with a caller (``mind/caller.py``); the Mind never knows which transport a
session came in on, and imports none (nor the Hand: the embedded local Hand
is built by the process wiring and handed in as a factory).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from halfpi.agents.base import Agent
from halfpi.config import Config
from halfpi.core.events import (
    Accepted,
    ApprovalPending,
    ConversationInfo,
    ConversationNews,
    Created,
    EventData,
    HandConnected,
    HandDisconnected,
    Interrupted,
    Outbound,
    Result,
    builtins,
    to_message,
)
from halfpi.core.ids import NodeId, new_conversation_id, new_node_id
from halfpi.core.outbound import Message
from halfpi.core.requests import RequestRecord, Tombstone
from halfpi.core.scopes import SESSIONS_READ, scopes_for
from halfpi.core.throttle import HandshakeThrottle, worth_logging
from halfpi.core.timers import Deadlines
from halfpi.errors import (
    CloseCode,
    ErrorCode,
    FencedOut,
    NotFound,
    NotOwner,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from halfpi.journal.base import Journal
from halfpi.mind.actor import ActorEnv, ConversationActor
from halfpi.mind.approvals import Approvals
from halfpi.mind.auth import CredentialCache, SharedReread, make_credential, write_token_file
from halfpi.mind.chat import ChatDriver
from halfpi.mind.connection import Connection, Framing, Liveness
from halfpi.mind.connections import NO_NEWS, Connections
from halfpi.mind.counters import ClusterCounts
from halfpi.mind.hands import HandRegistry
from halfpi.mind.records import approval_pending
from halfpi.mind.recovery import recover_tools
from halfpi.mind.redaction import OutputRedaction
from halfpi.mind.registry import Registry
from halfpi.mind.scheduler import Scheduler
from halfpi.mind.subscriptions import ConversationView, Sink, Subscriptions
from halfpi.mind.tasks import TaskDispatcher
from halfpi.mind.tickets import StreamTickets
from halfpi.mind.tools import ToolCalls
from halfpi.store.base import (
    ConversationRow,
    Credential,
    Fence,
    FinishedRequest,
    Store,
    WriteTx,
)

log = logging.getLogger("halfpi.mind")


class LocalHand(Protocol):
    """The embedded Hand, as the Mind runs it (built by the process wiring)."""

    connected: asyncio.Event

    async def run_forever(self) -> bool: ...

    async def stop(self) -> None: ...


# How long a handshake waits for the credentials version before it goes on
# with the credentials read last (a Store that stopped answering).
RECHECK_TIMEOUT_S = 1.0
# How long shutting down waits for the local Hand to end its runs and tasks
# (its own bound, hand/node.py WORK_END_S, and a margin).
LOCAL_HAND_END_S = 10.0
# A known token's handshake reads the credentials version unless a read that
# started at most this long ago has finished: a token revoked earlier than
# that is refused, on every node, and a stream of HTTP requests (each one a
# handshake) costs at most ten reads a second, not one each
# (benchmarks/http_requests.py).
RECHECK_FRESH_S = 0.1


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


# (url, connector or None) -> the local Hand dialling the Mind at url.
LocalHandFactory = Callable[[str, Any], LocalHand]


class Mind:
    def __init__(
        self,
        config: Config,
        store: Store,
        journal: Journal,
        agent: Agent,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] | None = None,
        local_hand: LocalHandFactory | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.agent = agent
        # Two clocks (STYLE; docs/operations.md "Clocks"): ``clock``, wall
        # time, for what is shown and stored (``ts``, ``expires_at``,
        # ``created_at``); ``monotonic`` for every duration and timer, so a
        # step of the system clock neither stalls nor hastens any of them.
        self.clock = clock
        self.monotonic = monotonic
        self.registry = Registry(store, clock)
        # Every timer of the Mind, on ``monotonic``: tests move a fake clock
        # and run what is due (``scheduler.run_due``), nothing waits for real.
        self.scheduler = Scheduler(monotonic)
        self.node_id = NodeId(config.node_id) if config.node_id else new_node_id(clock())
        # Cluster mode (docs/cluster.md): set by the process wiring before start.
        self.cluster: Ownership | None = None
        self.auth = CredentialCache()
        self.throttle = HandshakeThrottle(config.handshake_throttle)
        # Stream tickets and the key of SSE resume tokens (docs/protocol.md §17).
        self.tickets = StreamTickets(config.home, monotonic, clock)
        self._reread = SharedReread(
            self.refresh_credentials, monotonic, config.credential_reread_s, self.scheduler.sleep
        )
        # A known token is checked against the credentials version at its
        # handshake (a hello, an HTTP request), unless the view is fresher
        # than RECHECK_FRESH_S (those arriving together share one read): a
        # credential revoked from another process or node since the last
        # poll is refused within RECHECK_FRESH_S, never welcomed for the
        # poll's interval. A Store slower than RECHECK_TIMEOUT_S leaves the
        # view read last in force.
        self._recheck = SharedReread(
            self.refresh_credentials, monotonic, 0.0, self.scheduler.sleep
        )
        self._credentials_read_at = float("-inf")  # when the last read that finished began
        self._refreshing = asyncio.Lock()
        self.hands = HandRegistry(
            self.scheduler, config.hand_grace_s, local_label=config.local_hand_label, wall=clock
        )
        self.hands.on_presence = self._hand_presence
        self.hands.on_audit = self._publish_in
        self.approvals = Approvals(config.approval_ttl_s, self.scheduler)
        self.approvals.announce = self.announce
        # What the Mind redacts from tool output: its secrets (mind/redaction.py).
        self.redaction = OutputRedaction.of(config)
        # Background tasks: the outbox's dispatcher, on the same clock.
        self.tasks = TaskDispatcher(
            lambda: self.store, self.scheduler, self.hands, self.actor, self.spawn, wall=clock
        )
        self.tasks.redaction = self.redaction
        self.hands.on_link = self.tasks.on_presence
        # What every actor is given (not the Mind): the store, the journal,
        # time, the chat driver, and where results and news go.
        self.env = ActorEnv(
            store=store,
            journal=journal,
            clock=clock,
            monotonic=monotonic,
            # The Mind's waits between retries: on the same clock, unless injected.
            sleep=sleep or self.scheduler.sleep,
            drive=ChatDriver(
                agent, ToolCalls(self.hands, self.approvals, config, self.redaction), self.tasks
            ),
            deliver=self.registry.deliver,
            announce=self.announce,
            tool_history=config.tool_history,
            checkpoint_s=config.checkpoint_s,
            checkpoint_chars=config.checkpoint_chars,
            call_later=self.scheduler.call_later,
            fenced_out=self.step_down,
            tasks=self.tasks.of_conversation,
        )
        self._local_hand_factory = local_hand
        self.local_hand: LocalHand | None = None
        self._local_hand_task: asyncio.Task[bool] | None = None
        # Every live connection, whatever its door (mind/connections.py).
        self.connections = Connections(self)
        self._actors: dict[str, ConversationActor] = {}
        self._loading: dict[str, asyncio.Future[ConversationActor]] = {}
        # When each loaded actor is next looked at for unloading (a heap: a
        # round visits only the actors whose idle time may have run out).
        self._idle: Deadlines[ConversationActor] = Deadlines()
        # Journal windows being dropped: a load of the same conversation waits.
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._last_prune = float("-inf")  # the first maintenance round prunes

    def now(self) -> float:
        """The Mind's monotonic clock: what every timer, deadline and
        duration (liveness, throttling, idle time) counts on."""
        return self.monotonic()

    def wall(self) -> float:
        """Wall time: what is shown and stored (``ts``, ``created_at``)."""
        return self.clock()

    # One store, one sleep, one draining flag, shared with the actors and the
    # registry: swapping the store (tests do, to hold or fail commits)
    # reaches every part that writes.

    @property
    def store(self) -> Store:
        return self.env.store

    @store.setter
    def store(self, store: Store) -> None:
        self.env.store = store
        self.registry.store = store

    @property
    def sleep(self) -> Callable[[float], Awaitable[object]]:
        return self.env.sleep

    @sleep.setter
    def sleep(self, sleep: Callable[[float], Awaitable[object]]) -> None:
        self.env.sleep = sleep

    @property
    def draining(self) -> bool:
        return self.env.draining

    @draining.setter
    def draining(self, draining: bool) -> None:
        self.env.draining = draining

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        if self.cluster is not None:
            await self.cluster.start()
        await self.refresh_credentials()
        if not self.auth.has_face():
            await self._create_local_face()
        label = self.config.local_hand_label
        if self.config.local_hand and not self.auth.has_kind_label("hand", label):
            await self._create_local_hand_credential()
        await self._recover()
        self.scheduler.start()
        await self.tasks.start()
        self.scheduler.call_later(self.config.credential_poll_s, self._maintenance_round)
        check = getattr(self.agent, "check", None)
        if check is not None:  # a model provider: is its server there? (one line if not)
            self.spawn(_check_agent(check), "agent check")

    async def _create_local_face(self) -> None:
        """First start: the owner's own terminal gets an operator credential
        that may approve, its token written to ``face.token`` (mode 0600)."""
        scopes = scopes_for("operator", approve=True)
        credential, token = make_credential("face", "local", "operator", scopes, self.wall())
        await self.store.add_credential(credential)
        write_token_file(self.config.face_token_path, token)
        await self.refresh_credentials()
        log.info("created the local operator credential; token in %s", self.config.face_token_path)

    async def _create_local_hand_credential(self) -> None:
        label = self.config.local_hand_label
        credential, token = make_credential("hand", label, "hand", frozenset(), self.wall())
        await self.store.add_credential(credential)
        write_token_file(self.config.hand_token_path, token)
        await self.refresh_credentials()

    def start_local_hand(self, url: str, connector: Any = None) -> None:
        """The embedded set-up's Hand: in this process, through the same
        ``/v1/hand`` path as any other, so there is one code path to trust
        (over TLS too, when the Mind serves wss://: ``connector``). Built by
        the factory the process wiring gave (``local_hand=``)."""
        if self._local_hand_factory is None:
            raise RuntimeError("this Mind was built without a local Hand factory")
        self.local_hand = self._local_hand_factory(url, connector)
        self._local_hand_task = asyncio.create_task(
            self.local_hand.run_forever(), name="local hand"
        )

    def _hand_presence(self, hand_id: str, connected: bool, conversations: set[str]) -> None:
        """``hand.connected`` / ``hand.disconnected`` in every conversation that
        has a run on that Hand: where a person is waiting on it."""
        hand = self.hands.hands.get(hand_id)
        kind = HandConnected if connected else HandDisconnected
        data = kind(hand_id=hand_id, generation=hand.generation if hand else None)
        for conversation_id in sorted(conversations):
            actor = self._actors.get(conversation_id)
            if actor is not None:
                actor.append(data)

    def _publish_in(self, conversations: set[str], data: EventData) -> None:
        """``data`` in each of ``conversations`` that is loaded here."""
        for conversation_id in sorted(conversations):
            actor = self._actors.get(conversation_id)
            if actor is not None:
                actor.append(data)

    async def _recover(self, loaded: ConversationActor | None = None) -> None:
        """After a crash: open runs become ``interrupted`` (I11), open requests
        get a terminal result, and ``seq`` continues from the store.

        In cluster mode nothing is recovered at start (other nodes own their
        conversations): each conversation is, when a node takes it over
        (``loaded``: its actor, being loaded — what arrives meanwhile waits)."""
        only = None if loaded is None else loaded.id
        if self.cluster is not None and only is None:
            return

        async def actor_of(conversation_id: str) -> ConversationActor:
            if loaded is not None and conversation_id == loaded.id:
                return loaded  # being loaded: others wait until this is done
            return await self.actor(conversation_id)

        await recover_tools(self.store, actor_of, self.wall(), only=only)
        for row in await self.store.open_chat_runs():
            if only is not None and row.conversation_id != only:
                continue
            actor = await actor_of(row.conversation_id)
            await actor.interrupt_recovered(row)
        leftovers = [
            r for r in await self.store.open_requests()
            if only is None or r.conversation_id == only
        ]
        if leftovers:
            now = self.wall()
            tx = WriteTx(
                finished=[
                    FinishedRequest(
                        r.principal_id,
                        r.request_id,
                        "interrupted",
                        builtins(
                            Result(
                                request_id=r.request_id,
                                status="interrupted",
                                data=Interrupted(reason="mind_restarted"),
                            )
                        ),
                        now,
                    )
                    for r in leftovers
                ]
            )
            await self.store.write(tx)

    async def drain(self) -> None:
        """Graceful shutdown: tell Faces (1012), interrupt chats, commit, close."""
        self.draining = True
        self.connections.close_all(CloseCode.RESTARTING, "mind restarting")
        stopping = []
        for actor in self._actors.values():
            run = actor.chat_run
            if run is not None:
                # Running: interrupted. Ended but not yet committed: one last try.
                actor.stop(run, "interrupted", "the Mind shut down")
                stopping.append(run.done)
        if stopping:
            await asyncio.wait(stopping, timeout=self.config.shutdown_grace_s)
        if self.local_hand is not None:
            await self.local_hand.stop()
        if self._local_hand_task is not None:
            # It ends its runs and tasks (bounded) before it returns: cut
            # short, it would leave them to the event loop's shutdown.
            serving = self._local_hand_task
            await asyncio.wait({serving}, timeout=LOCAL_HAND_END_S)
            if not serving.done():
                serving.cancel()
                await asyncio.wait({serving}, timeout=1.0)
        # No timer fires any more (TTLs, graces, deadlines, maintenance).
        self.tasks.close()
        self.scheduler.close()
        if self.cluster is not None:  # give the leases back: others take over at once
            await self.cluster.close()
        for task in list(self._background):
            task.cancel()
        close = getattr(self.agent, "aclose", None)
        if close is not None:  # a model provider's connections
            await close()
        await self.store.close()

    # -- actors (I2) -------------------------------------------------------------

    async def actor(self, conversation_id: str) -> ConversationActor:
        """The one actor of a conversation; concurrent loads share one load.

        A conversation loaded in this process for the first time (or whose
        journal lost continuity) gets a new epoch, stored before the actor
        exists, so no cursor of it is shown before the Store holds it; one
        loaded again after it was unloaded keeps its epoch and continues
        its seq (from the Store's head: past its seq reservation)."""
        actor = self._loaded(conversation_id)
        if actor is not None:
            actor.used_at = self.monotonic()
            return actor
        loading = self._loading.get(conversation_id)
        if loading is None:
            loading = asyncio.get_running_loop().create_future()
            self._loading[conversation_id] = loading
            try:
                row = await self.store.get_conversation(conversation_id)
                if row is None:
                    raise NotFound(
                        ErrorCode.CONVERSATION_NOT_FOUND,
                        f"no conversation {conversation_id}",
                        field="conversation_id",
                    )
                fence = None
                if self.cluster is not None:
                    fence = await self._claim(conversation_id)
                head = await self.store.head_seq(conversation_id)
                releasing = self._releasing.get(conversation_id)
                if releasing is not None:  # its window is being dropped: after that
                    await asyncio.wait({releasing})
                epoch = await self.journal.open(conversation_id, row.epoch, head)
                if epoch != row.epoch:
                    # Continuity lost (a restart of the in-process journal):
                    # cursors of the old epoch get epoch_changed from now on.
                    await self.store.write(WriteTx(epochs=[(conversation_id, epoch)], fence=fence))
                    row = dataclasses.replace(row, epoch=epoch)
                actor = ConversationActor(self.env, row, head, epoch)
                actor.fence = fence
                self._actors[conversation_id] = actor
                self._idle.set(actor, actor.idle_since() + self.unload_idle_s)
                if fence is not None:
                    # Taken over: close what the previous owner left open —
                    # before any command gets the actor (they wait for the
                    # load): a request retried meanwhile is answered with
                    # its outcome, never as still running.
                    await self._recover(loaded=actor)
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
        assert self.cluster is not None
        lease = await self.cluster.take(conversation_id)
        fence = Fence(conversation_id, lease.fence)
        try:
            await self.store.write(WriteTx(fence=fence))
        except FencedOut:
            self.cluster.lost(conversation_id)
            raise Unavailable("the conversation changed owner while loading; retry") from None
        return fence

    async def view(self, conversation_id: str) -> ConversationView:
        """What a subscription or a read follows: the conversation's actor,
        or in cluster mode, when another node owns it, this node's replica."""
        actor = self._loaded(conversation_id)
        if actor is not None:
            actor.used_at = self.monotonic()
            return actor
        cluster = self.cluster
        if cluster is None:
            return await self.actor(conversation_id)
        replica = cluster.replicas.get(conversation_id)
        if replica is not None and not replica.unloaded:
            return replica  # type: ignore[no-any-return]
        owner = await cluster.owner_of(conversation_id)
        if owner is None or owner == self.node_id:
            try:
                return await self.actor(conversation_id)
            except NotOwner:
                pass  # taken by another node meanwhile: follow it
        if await self.store.get_conversation(conversation_id) is None:
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
        if self.cluster is not None:
            self.cluster.lost(conversation_id)
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

    def is_loaded(self, conversation_id: str) -> bool:
        return conversation_id in self._actors

    def loaded(self) -> int:
        """How many conversations have an actor in memory now."""
        return len(self._actors)

    @property
    def unload_idle_s(self) -> float:
        """How long an idle actor stays loaded (default: the journal's window)."""
        configured = self.config.unload_idle_s
        return self.config.journal.seconds if configured is None else configured

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
        return len(releases)

    def _release(self, conversation_id: str) -> asyncio.Task[None]:
        task = self.spawn(self._release_window(conversation_id), "release a journal window")
        self._releasing[conversation_id] = task

        def released(_: object) -> None:
            if self._releasing.get(conversation_id) is task:
                del self._releasing[conversation_id]

        task.add_done_callback(released)
        return task

    async def _release_window(self, conversation_id: str) -> None:
        await self.journal.release(conversation_id)
        if self.cluster is not None:
            await self.cluster.give_back(conversation_id)

    async def create_conversation(
        self, record: RequestRecord, name: str | None
    ) -> RequestRecord | Tombstone:
        now = self.wall()
        conversation_id = new_conversation_id(now)
        row = ConversationRow(conversation_id, name, now, record.principal_id)
        record.conversation_id = conversation_id
        record.accepted = builtins(
            Accepted(
                request_id=record.request_id,
                operation="conversation.create",
                conversation_id=conversation_id,
            )
        )
        record.finish(
            builtins(
                Result(
                    request_id=record.request_id,
                    status="succeeded",
                    data=Created(conversation_id=conversation_id, name=name, created_at=now),
                )
            ),
            now,
        )
        outcome = await self.store.write(WriteTx(admit=record, conversations=[row]))
        if outcome.existing is not None:
            return outcome.existing
        info = ConversationInfo(id=conversation_id, name=name, created_at=now)
        self.announce(ConversationNews(conversation=info, change="created"))
        return record

    # -- session-level news (not in any conversation's log) -----------------------

    def announce(self, news: Outbound) -> None:
        """Send ``news`` (a session-level message) to every welcomed Face
        session whose credential may read conversations, now; encoded once.
        Reliable on a connection; a Face that was away re-reads the list it
        keeps (``face.conversation.list``, ``face.approval.list``) after every
        (re)connect, so nothing is missed."""
        message = to_message(news)
        self.announce_message(message)
        if self.cluster is not None:  # every node's Faces hear it
            self.cluster.announce(message)

    def announce_message(self, message: Message) -> None:
        """Send a session-level message to every welcomed Face of this node
        that may read conversations."""
        for conn in self.connections:
            # Not welcomed yet (it reads the lists after its hello), a Hand,
            # or a one-shot request: not told.
            if conn.principal_id is None or conn.kind in NO_NEWS:
                continue
            credential = self.credential(conn.principal_id)
            if credential is not None and SESSIONS_READ in credential.scopes:
                conn.send(message)

    async def waiting_approvals(self) -> list[ApprovalPending]:
        """:meth:`pending_approvals`; in cluster mode every node's, read from
        the Store (each node holds only its own conversations' in memory)."""
        if self.cluster is None:
            return self.pending_approvals()
        rows = list(await self.store.open_approvals())  # undecided
        rows.sort(key=lambda r: (r.created_at, r.approval_id))
        return [approval_pending(r) for r in rows]

    def pending_approvals(self) -> list[ApprovalPending]:
        """Every approval still waiting for a decision, in every conversation,
        oldest first: the summary only, never the arguments."""
        waiting = [a for a in self.approvals.live.values() if a.state == "pending" and a.shown]
        waiting.sort(key=lambda a: (a.row.created_at, a.approval_id))
        return [a.pending_summary() for a in waiting]

    # -- callers ---------------------------------------------------------------

    def subscriptions_for(self, sink: Sink) -> Subscriptions:
        """An empty set of subscriptions for a new connection (``sink``)."""
        return Subscriptions(
            sink, self.journal, self.spawn, self.config.snapshot_messages,
            self.env.metrics.resets, self.scheduler.sleep,
        )

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- credentials (I8) --------------------------------------------------------

    async def refresh_credentials(self) -> None:
        async with self._refreshing:  # one load at a time: never an older view last
            began = self.monotonic()
            version = await self.store.credentials_version()
            if version == self.auth.version:
                self._credentials_read_at = began
                return
            revoked = self.auth.load(await self.store.credentials(), version)
            self._credentials_read_at = began
        if revoked:  # every door's connections alike (I8)
            self.connections.revoke(revoked)

    async def authenticate(
        self, token: str, kind: str, address: str, *, label: str | None = None
    ) -> Credential | None:
        """Check a handshake's token (and, for a Hand, its label), throttled
        per address (DESIGN §11, ``core/throttle.py``).

        Raises :class:`RateLimited` when the address must not try yet; waits
        its turn otherwise. An unknown token triggers a re-read of the
        credential table first, so a credential created a moment ago works at
        once — one shared re-read per ``credential_reread_s``, however many
        unknown tokens arrive; a known one a read of the credentials version
        unless one began at most ``RECHECK_FRESH_S`` ago (shared by the
        handshakes that arrive together), so one revoked earlier than that,
        from another process or node, is refused. Failures are
        logged with the address and the count, never the token.
        """
        wait = self.throttle.admit(address, self.now())
        if wait is None:
            refused = self.throttle.refused(address)
            if worth_logging(refused):
                log.warning(
                    "handshake from %s refused unchecked: %d attempts while throttled",
                    address,
                    refused,
                )
            self.env.metrics.handshakes_throttled += 1
            raise RateLimited("too many failed handshakes from this address; retry later")
        if wait > 0:
            await self.scheduler.sleep(wait)
        credential = self.auth.authenticate(token, kind)
        known = credential is not None
        if not known:
            await self._reread.wait_within(RECHECK_TIMEOUT_S)
            credential = self.auth.authenticate(token, kind)
        if credential is None or (label is not None and credential.label != label):
            count = self.throttle.failed(address, self.now())
            self.env.metrics.handshakes_failed[kind] += 1
            log.warning(
                "handshake from %s failed: unknown or revoked %s credential "
                "(failure %d from this address; its next check waits %.2f s)",
                address,
                kind,
                count,
                self.throttle.delay(count),
            )
            return None
        self.throttle.succeeded(address)  # the token is right: no longer a guess in flight
        if known and self.monotonic() - self._credentials_read_at > RECHECK_FRESH_S:
            # Known from the view read last: still live? (Revoked by the CLI
            # or on another node since the last poll.) Read after the
            # throttle let go, so a burst of right tokens never waits on it.
            await self._recheck.wait_within(RECHECK_TIMEOUT_S)
            if self.auth.authenticate(token, kind) is None:
                self.env.metrics.handshakes_failed[kind] += 1
                log.warning("handshake from %s failed: its %s credential was just revoked",
                            address, kind)
                return None
        return credential

    def credential(self, principal_id: str) -> Credential | None:
        return self.auth.get(principal_id)

    # -- maintenance -------------------------------------------------------------

    def connect(
        self, credential: Credential | None, framing: Framing, liveness: Liveness,
        *, capped: bool = True, collect: Callable[[Message], None] | None = None,
    ) -> Connection:
        r"""A new connection through ``framing``, kept alive by ``liveness``.
        With a ``credential`` (a door that authenticates per request) it is
        welcomed at once, counted against the principal's cap unless not
        ``capped`` (a one-shot request): :class:`RateLimited` when the cap
        is full, :class:`Unauthorized` for a credential revoked meanwhile.
        Without one it awaits its hello (``Connection.welcome``). A one-shot
        caller ``collect``\ s its replies whole instead of having them framed."""
        conn = self.connections.open(framing, liveness, collect)
        if credential is None:
            return conn
        if self.credential(credential.principal_id) is None:
            conn.gone()
            raise Unauthorized("unknown or revoked token")
        if not conn.welcome(credential, capped=capped):
            conn.gone()
            raise RateLimited(f"this credential already has "
                              f"{self.config.max_connections_per_principal} live connections")
        return conn

    def liveness(self, door: str) -> Liveness:
        """The liveness rule of a ``door`` (docs/protocol.md §11), from the
        configuration: ``face`` and ``hand`` (WebSockets: hello, pings, dead
        after silence), ``stream`` (SSE: a comment every heartbeat; never
        inbound), ``once`` (a request: none)."""
        config = self.config
        if door == "face":
            return Liveness(hello_s=config.hello_timeout_s, ping_s=config.heartbeat_s,
                            dead_after_s=config.dead_after_s, blocked_s=config.dead_after_s,
                            news_ping_s=config.heartbeat_s)
        if door == "hand":
            return Liveness(hello_s=config.hello_timeout_s, ping_s=config.heartbeat_s,
                            dead_after_s=config.dead_after_s, blocked_s=config.dead_after_s,
                            evicts=False)
        if door == "stream":
            return Liveness(ping_s=config.heartbeat_s, blocked_s=config.dead_after_s)
        return Liveness()

    def tick_connections(self, now: float) -> int:
        """Visit the connections whose deadline came (time passed in)."""
        return self.connections.tick(now)

    def _maintenance_round(self) -> None:
        """A scheduler timer, every ``credential_poll_s`` of the Mind's
        (monotonic) clock:
        the round itself awaits the store, so it runs as a task, and the next
        one is set when it ends (rounds never overlap)."""
        self.spawn(self._maintain(), name="mind maintenance")

    async def _maintain(self) -> None:
        now = self.now()
        try:
            await self.refresh_credentials()
            self.connections.tick(now)
            await self.unload_idle(now)
            if self.cluster is not None:
                await self.cluster.maintain()
            if now - self._last_prune > 60.0:
                self._last_prune = now
                # What is pruned is decided by the stored (wall) times.
                await self.store.prune_requests(self.wall(), self.config.requests)
        except Exception:  # keep maintaining; the next round may succeed
            log.exception("maintenance round failed")
        finally:
            if not self.draining:
                self.scheduler.call_later(self.config.credential_poll_s, self._maintenance_round)


async def _check_agent(check: Callable[[], Awaitable[str | None]]) -> None:
    problem = await check()
    if problem is not None:
        log.warning("%s", problem)
