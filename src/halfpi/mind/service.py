"""The Mind: actors, the request registry, credentials and recovery, wired together.

Transports (gateway) hand decoded commands to the Mind API (``mind/api.py``)
with a caller (``mind/caller.py``); the Mind never knows which transport a
session came in on, and imports none (nor the Hand: the embedded local Hand
is built by the process wiring and handed in as a factory).
"""

from __future__ import annotations

import asyncio
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
from halfpi.core.scopes import SESSIONS_READ
from halfpi.errors import (
    CloseCode,
    RateLimited,
    Unauthorized,
)
from halfpi.journal.base import Journal
from halfpi.mind.actor import ActorEnv, ConversationActor
from halfpi.mind.actors import Actors, Ownership
from halfpi.mind.approvals import Approvals
from halfpi.mind.auth import CredentialCache
from halfpi.mind.chat import ChatDriver
from halfpi.mind.connection import Connection, Framing, Liveness, Replies
from halfpi.mind.connections import NO_NEWS, Connections
from halfpi.mind.credentials import Credentials
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


# How long shutting down waits for the local Hand to end its runs and tasks
# (its own bound, hand/node.py WORK_END_S, and a margin).
LOCAL_HAND_END_S = 10.0


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
        # Stream tickets and the key of SSE resume tokens (docs/protocol.md §17).
        self.tickets = StreamTickets(config.home, monotonic, clock)
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
        # Who may connect (I8): the credentials, their re-reads and the
        # handshake throttle (mind/credentials.py).
        self.credentials = Credentials(
            lambda: self.store, config, monotonic, self.scheduler.sleep, self.env.metrics,
            self.refresh_credentials,
        )
        self._local_hand_factory = local_hand
        self.local_hand: LocalHand | None = None
        self._local_hand_task: asyncio.Task[bool] | None = None
        # Every live connection, whatever its door (mind/connections.py).
        self.connections = Connections(self)
        # The conversations' actors: loading, unloading, stepping down.
        self.actors = Actors(self)
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
            await self.credentials.create_local_face(self.wall())
            await self.refresh_credentials()
        label = self.config.local_hand_label
        if self.config.local_hand and not self.auth.has_kind_label("hand", label):
            await self.credentials.create_local_hand(self.wall())
            await self.refresh_credentials()
        await self.recover()
        self.scheduler.start()
        await self.tasks.start()
        self.scheduler.call_later(self.config.credential_poll_s, self._maintenance_round)
        check = getattr(self.agent, "check", None)
        if check is not None:  # a model provider: is its server there? (one line if not)
            self.spawn(_check_agent(check), "agent check")

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
            actor = self.actors.owned(conversation_id)
            if actor is not None:
                actor.append(data)

    def _publish_in(self, conversations: set[str], data: EventData) -> None:
        """``data`` in each of ``conversations`` that is loaded here."""
        for conversation_id in sorted(conversations):
            actor = self.actors.owned(conversation_id)
            if actor is not None:
                actor.append(data)

    async def recover(self, loaded: ConversationActor | None = None) -> None:
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
        for actor in self.actors:
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

    # -- actors (I2): mind/actors.py ----------------------------------------------

    async def actor(self, conversation_id: str) -> ConversationActor:
        """The one actor of a conversation (``Actors.actor``)."""
        return await self.actors.actor(conversation_id)

    async def view(self, conversation_id: str) -> ConversationView:
        """What a subscription or a read follows (``Actors.view``)."""
        return await self.actors.view(conversation_id)

    def owned(self, conversation_id: str) -> ConversationActor | None:
        return self.actors.owned(conversation_id)

    def step_down(self, conversation_id: str) -> None:
        self.actors.step_down(conversation_id)

    def is_loaded(self, conversation_id: str) -> bool:
        return self.actors.owned(conversation_id) is not None

    def loaded(self) -> int:
        """How many conversations have an actor in memory now."""
        return len(self.actors)

    async def unload_idle(self, now: float) -> int:
        return await self.actors.unload_idle(now)

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

    # -- credentials (I8): mind/credentials.py ------------------------------------

    async def refresh_credentials(self) -> None:
        """Read the credentials again (when their version moved); the
        connections of every revoked one are closed, whatever their door."""
        revoked = await self.credentials.refresh()
        if revoked:
            self.connections.revoke(revoked)

    async def authenticate(
        self, token: str, kind: str, address: str, *, label: str | None = None
    ) -> Credential | None:
        """A handshake's token checked (``Credentials.authenticate``)."""
        return await self.credentials.authenticate(token, kind, address, label=label)

    def credential(self, principal_id: str) -> Credential | None:
        return self.credentials.cache.get(principal_id)

    @property
    def auth(self) -> CredentialCache:
        """The credentials as last read (``Credentials.cache``)."""
        return self.credentials.cache

    # -- maintenance -------------------------------------------------------------

    def connect(
        self, credential: Credential | None, framing: Framing, liveness: Liveness,
        *, capped: bool = True, collect: Replies | None = None,
    ) -> Connection:
        r"""A new connection through ``framing``, kept alive by ``liveness``.
        With a ``credential`` (a door that authenticates per request) it is
        welcomed at once, counted against the principal's cap unless not
        ``capped`` (a one-shot request): :class:`RateLimited` when the cap
        is full, :class:`Unauthorized` for a credential revoked meanwhile.
        Without one it awaits its hello (``Connection.welcome``). A one-shot
        caller ``collect``\ s its replies, typed, instead of having them framed."""
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
