"""One node of a cluster of Minds (DESIGN §10, docs/cluster.md "Several nodes").

Several ``halfpi mind`` processes share one PostgreSQL (the truth) and one
Redis (journal, fan-out, leases). Each conversation has at most one owner —
the node holding its lease — and only the owner writes it (I2):

- **Taking a conversation.** The first node that needs it (a command, a
  subscription, or the sweep of chats left open) takes the lease (``SET NX
  PX``, a fencing token above every earlier one, and above the one the
  Store last saw), claims the token in PostgreSQL (a write with only a fence),
  and only then reads the head and opens the journal: from that commit on no
  write of an earlier owner can land. Whatever the earlier owner left open in
  the conversation — a chat, a tool run, an approval, a request without a
  result — is then closed the way a restart closes it (``interrupted``,
  ``lost``, ``cancelled``; I11), and the conversation continues with the
  next ``seq``.
- **Keeping it.** The owner renews its leases every third of ``lease_ms``.
  A renewal refused (the lease expired and maybe was taken), a write the
  Store refuses with ``FencedOut`` or a journal append Redis refuses for its
  token: the node *steps down* for that conversation at once — its actor
  never writes again, its running chat is left to the new owner, and its
  Faces follow the conversation through a replica.
- **Forwarding.** A command for a conversation owned elsewhere is sent to the
  owner over the owner's node channel and run there with the same
  credential (re-authorised by the owner, I8); its answers come back on the
  Face's own connection, unchanged. An owner that does not answer in
  ``forward_timeout_s`` gets the Face ``unavailable`` — a retry with the
  same request_id is safe (the registry is in PostgreSQL, I5).
- **Following.** A Face subscribed on a node that does not own the
  conversation follows a :class:`~halfpi.mind.replica.Replica` fed by the
  owner's fan-out. When the owner's lease is gone (the owner died), a node
  with followers takes the conversation over and moves them onto its actor.
- **News** (conversations created and renamed, approvals pending and
  settled) is passed on to every node's Faces.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from halfpi.cluster.bus import Bus, decoded
from halfpi.cluster.lease import Lease, Leases
from halfpi.core import wire
from halfpi.core.cluster_keys import NEWS_CHANNEL, fanout_channel, node_channel
from halfpi.core.events import Outbound, Snapshot, to_message
from halfpi.core.outbound import Message, message
from halfpi.core.scopes import authorize
from halfpi.errors import (
    ErrorCode,
    HalfpiError,
    InternalError,
    NotOwner,
    Unauthorized,
    Unavailable,
)
from halfpi.journal.redis import RedisJournal, fanout_entries
from halfpi.mind.counters import ClusterCounts
from halfpi.mind.home import CannotStart
from halfpi.mind.replica import Replica

if TYPE_CHECKING:
    from halfpi.mind.caller import Caller
    from halfpi.mind.service import Mind
    from halfpi.mind.subscriptions import Subscriptions

# Runs a decoded Face command for a caller, without forwarding it again
# (``halfpi.mind.api.dispatch``, handed in by the process wiring).
Dispatch = Callable[["Mind", Any, str, Any], Awaitable[None]]

log = logging.getLogger("halfpi.cluster")

# A replica nobody has followed for this long is dropped.
REPLICA_IDLE_S = 2.0

# What ends a forwarded command for its caller: nothing follows these.
FINAL = frozenset({"face.result", "face.error"})

# A forwarded command's late answers (a chat's face.result) still reach its
# connection for this long after the command itself was answered.
FORWARD_KEEP_S = 3600.0


class Envelope(msgspec.Struct, omit_defaults=True):
    """One message between nodes on a node channel.

    ``cmd``: run a Face command (``type``, ``body`` its JSON payload) for
    ``principal_id`` and answer on ``origin``'s channel; ``snap``: the
    snapshot of ``conversation_id``; ``msg``: a message for the forwarding
    connection (``type``, ``body``); ``done``: the command was handled
    (``error_*`` when it raised; ``body`` a snapshot's JSON)."""

    kind: str
    id: str
    origin: str = ""
    principal_id: str = ""
    detail_mode: str | None = None
    type: str = ""
    body: bytes = b""
    conversation_id: str = ""
    limit: int = 0
    error_code: str = ""
    error_message: str = ""
    error_field: str | None = None
    retryable: bool = False


class News(msgspec.Struct):
    origin: str
    type: str
    body: bytes


_encode = msgspec.msgpack.Encoder().encode
_decode_envelope = msgspec.msgpack.Decoder(Envelope).decode
_decode_news = msgspec.msgpack.Decoder(News).decode
_decode_snapshot = msgspec.json.Decoder(Snapshot).decode


def remote_error(envelope: Envelope) -> HalfpiError:
    """The error a forwarded command raised on its owner, raised again here
    with the same stable code (the Face cannot tell where it ran)."""
    error = HalfpiError(envelope.error_message, field=envelope.error_field)
    try:
        error.code = ErrorCode(envelope.error_code)
    except ValueError:
        error.code = ErrorCode.INTERNAL_ERROR
    error.retryable = envelope.retryable
    return error


class Replier(Protocol):
    @property
    def closed(self) -> bool: ...

    def send(self, message: Message) -> None: ...


@dataclass
class _Forward:
    caller: Replier
    done: asyncio.Future[Envelope]
    at: float  # when it was sent, on the Mind's monotonic clock
    answered: bool = False  # its face.result (or face.error) reached the caller


class RemoteCaller:
    """A Face connection on another node, as the owner runs its command."""

    def __init__(self, node: ClusterNode, envelope: Envelope, label: str, profile: str,
                 scopes: frozenset[str]) -> None:
        self._node = node
        self._id = envelope.id
        self._origin = envelope.origin
        self._principal_id = envelope.principal_id
        self._label = label
        self._profile = profile
        self._scopes = scopes
        self.detail_mode = envelope.detail_mode
        self._subscriptions: Subscriptions = node.mind.subscriptions_for(self)

    @property
    def principal_id(self) -> str | None:
        return self._principal_id

    @property
    def label(self) -> str:
        return self._label

    @property
    def profile(self) -> str:
        return self._profile

    @property
    def scopes(self) -> frozenset[str]:
        return self._scopes

    @property
    def subscriptions(self) -> Subscriptions:
        return self._subscriptions

    @property
    def closed(self) -> bool:
        return False

    def send(self, message: Message) -> None:
        self._node.reply(self._origin, Envelope(
            "msg", self._id, type=message.type, body=bytes(message.encoded_body())
        ))

    def reply(self, value: Outbound) -> None:
        self.send(to_message(value))

    def reply_stored(self, type_: str, body: dict[str, Any]) -> None:
        self.send(message(type_, body))

    def wake(self) -> None:
        """Nothing is pulled: a forwarded command never subscribes."""

    def close(self, code: int, reason: str) -> None:
        """Nothing to close: a forwarded command follows no conversation."""


class ClusterNode:
    def __init__(self, mind: Mind, journal: RedisJournal, dispatch: Dispatch) -> None:
        self.mind = mind
        self.dispatch = dispatch
        self.journal = journal
        config = mind.config
        self.node_id = mind.node_id
        self.leases = Leases(journal.client, self.node_id, config.lease_ms)
        self.bus = Bus(journal.client)
        self.held: dict[str, Lease] = {}
        self._taking: dict[str, asyncio.Future[Lease]] = {}  # takes under way
        self.replicas: dict[str, Replica] = {}
        self._making: dict[str, asyncio.Future[Replica]] = {}
        self._forwards: dict[str, _Forward] = {}
        self._renewer: asyncio.Task[None] | None = None
        # When the last renewal round ended having reached Redis (readiness),
        # on the Mind's monotonic clock, as are all the waits of this node:
        # its scheduler's, so a step of the wall clock stalls none of them.
        self.renewed_at = mind.now()
        self._last_sweep = float("-inf")
        # Read by GET /metrics: forwarded calls by outcome ("answered",
        # "unavailable": no node heard it or no answer in time), take-overs
        # of a conversation whose owner's lease was gone, step-downs.
        self.forwards: Counter[str] = Counter()
        self.takeovers = 0
        self.step_downs = 0
        journal.settle_on_open = True
        journal.on_fenced = self._fenced
        journal.on_lost = self._journal_lost

    async def start(self) -> None:
        from redis.exceptions import RedisError  # cluster mode's extra: imported where used

        self.bus.on_resync = self._resync_all
        try:
            await self.bus.start({
                node_channel(self.node_id): self._on_node,
                NEWS_CHANNEL: self._on_news,
            })
        except (RedisError, OSError) as exc:  # one line, no traceback (DESIGN §12)
            raise CannotStart(f"cannot reach Redis: {exc}") from None
        self._renewer = asyncio.create_task(self._renew_loop(), name="lease renewal")

    async def close(self) -> None:
        """A graceful stop: give the leases back (others take over at once)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        for lease in list(self.held.values()):
            with contextlib.suppress(Exception):
                await self.leases.release(lease)
        self.held.clear()
        await self.bus.close()

    # -- ownership -----------------------------------------------------------------

    async def take(self, conversation_id: str) -> Lease:
        """Own the conversation: its lease, with a token above every earlier
        one (the Store's included). Raises :class:`NotOwner` when another
        node holds it. Takes of one conversation at once share one: a
        second never meets the first's lease as another owner's."""
        held = self.held.get(conversation_id)
        if held is not None:
            return held
        taking = self._taking.get(conversation_id)
        if taking is None:
            taking = self._taking[conversation_id] = asyncio.ensure_future(
                self._take(conversation_id)
            )
            taking.add_done_callback(partial(self._taken, conversation_id))
        # Shielded: a caller that gives up does not drop a lease half taken.
        return await asyncio.shield(taking)

    def _taken(self, conversation_id: str, taking: asyncio.Future[Lease]) -> None:
        if self._taking.get(conversation_id) is taking:
            del self._taking[conversation_id]
        if not taking.cancelled():
            taking.exception()  # its callers re-raise it; none left: not an orphan

    async def _take(self, conversation_id: str) -> Lease:
        at_least = await self.mind.store.fence_of(conversation_id)
        lease = await self.leases.acquire(conversation_id, at_least)
        if lease is None:
            holder = await self.leases.holder(conversation_id)
            if holder is None:  # expired between the two calls: try once more
                lease = await self.leases.acquire(conversation_id, at_least)
            elif holder.node_id == self.node_id:
                # A previous run of this node (killed, restarted at once) still
                # holds it: ours again once that lease expires — waited for,
                # never adopted (a paused previous run would share its token).
                remaining = await self.leases.remaining_ms(conversation_id)
                if remaining / 1000.0 > self.mind.config.forward_timeout_s:
                    raise Unavailable(
                        "this node's previous run still holds the conversation for "
                        f"{remaining} ms; retry"
                    )
                await self.mind.scheduler.sleep(remaining / 1000.0 + 0.01)  # until it expires
                lease = await self.leases.acquire(conversation_id, at_least)
                if lease is None:
                    holder = await self.leases.holder(conversation_id)
            if lease is None:
                owner = holder.node_id if holder is not None else "?"
                raise NotOwner(conversation_id, owner)
        self.held[conversation_id] = lease
        self.journal.fence(conversation_id, lease.fence)
        return lease

    async def give_back(self, conversation_id: str) -> None:
        """The conversation was unloaded while idle: its lease is released."""
        lease = self.held.pop(conversation_id, None)
        if lease is not None:
            with contextlib.suppress(Exception):
                await self.leases.release(lease)

    def lost(self, conversation_id: str) -> None:
        """Forget the lease (it expired, or the Store or Redis refused its token)."""
        if self.held.pop(conversation_id, None) is not None:
            self.step_downs += 1

    def counts(self) -> ClusterCounts:
        return ClusterCounts(
            leases_held=len(self.held), replicas=len(self.replicas),
            forwards=dict(self.forwards), takeovers=self.takeovers,
            step_downs=self.step_downs, malformed=self.bus.malformed,
        )

    async def owner_of(self, conversation_id: str) -> str | None:
        holder = await self.leases.holder(conversation_id)
        return None if holder is None else holder.node_id

    def _fenced(self, conversation_id: str) -> None:
        log.warning("journal append for %s refused: another node owns it", conversation_id)
        self.mind.step_down(conversation_id)

    def _journal_lost(self, conversation_id: str) -> None:
        if conversation_id in self.held:
            log.warning("the journal of %s was lost: stepping down to open it again",
                        conversation_id)
            self.mind.step_down(conversation_id)

    async def _renew_loop(self) -> None:
        period = self.mind.config.lease_ms / 3000.0
        while True:
            await self.mind.scheduler.sleep(period)  # the renewal period
            reached = True
            for conversation_id, lease in list(self.held.items()):
                try:
                    kept = await self.leases.renew(lease)
                except Exception as exc:
                    log.warning("could not renew the lease of %s: %s", conversation_id, exc)
                    reached = False
                    continue  # it may still expire: the fence protects the data
                if not kept and self.held.get(conversation_id) is lease:
                    log.warning("lost the lease of %s: stepping down", conversation_id)
                    self.mind.step_down(conversation_id)
            if reached:
                self.renewed_at = self.mind.now()

    async def check_leases(self) -> None:
        """Readiness: the last renewal round reached Redis within ``lease_ms``
        (a node that cannot renew loses what it owns)."""
        behind = self.mind.now() - self.renewed_at
        if behind > self.mind.config.lease_ms / 1000.0:
            raise RuntimeError(f"lease renewals are {behind:.1f} s behind")

    # -- following -----------------------------------------------------------------

    async def replica(self, conversation_id: str) -> Replica:
        """This node's replica of a conversation another node owns (callers
        at the same time share one making)."""
        replica = self.replicas.get(conversation_id)
        if replica is not None and not replica.unloaded:
            return replica
        making = self._making.get(conversation_id)
        if making is None:
            making = asyncio.ensure_future(self._make_replica(conversation_id))
            self._making[conversation_id] = making
            making.add_done_callback(lambda _: self._making.pop(conversation_id, None))
        return await asyncio.shield(making)

    async def _make_replica(self, conversation_id: str) -> Replica:
        channel = fanout_channel(conversation_id)

        def on_entries(payload: bytes) -> None:
            current = self.replicas.get(conversation_id)
            if current is not None:
                current.receive(decoded(fanout_entries, payload))

        await self.bus.listen(channel, on_entries)  # before reading the head
        followed = await self.journal.follow(conversation_id)
        if followed is None:
            raise Unavailable("the conversation's owner has not opened it yet; retry")
        epoch, head = followed
        replica = Replica(
            conversation_id, epoch, head, self.journal, self.mind.store,
            self.remote_snapshot, self.mind.spawn, self.mind.view,
        )
        self.replicas[conversation_id] = replica
        return replica

    async def drop_replica(self, conversation_id: str) -> None:
        replica = self.replicas.pop(conversation_id, None)
        if replica is not None:
            replica.unloaded = True
            await self.bus.unlisten(fanout_channel(conversation_id))

    def _resync_all(self) -> None:
        for replica in list(self.replicas.values()):
            replica.resync()

    async def maintain(self) -> None:
        """A maintenance round: replicas nobody follows are dropped; one whose
        owner's lease is gone is taken over (its followers move to the new
        actor); every ``lease_ms`` the chats left open by a dead node are
        swept (their conversation taken, and so closed)."""
        followed = []
        now = self.mind.now()
        for conversation_id, replica in list(self.replicas.items()):
            if replica.subscribers:
                replica.empty_since = None
                followed.append(conversation_id)
            elif replica.empty_since is None:
                replica.empty_since = now  # (a subscription may be moving through it)
            elif now - replica.empty_since >= REPLICA_IDLE_S:
                await self.drop_replica(conversation_id)
        owners = await self.leases.holders(followed)
        for conversation_id in followed:
            if owners.get(conversation_id) is None:
                await self._take_over(conversation_id)
        if now - self._last_sweep >= self.mind.config.lease_ms / 1000.0:
            self._last_sweep = now
            await self._sweep()
        stale = now - FORWARD_KEEP_S
        for key, pending in list(self._forwards.items()):
            if pending.caller.closed or (pending.done.done() and pending.at < stale):
                del self._forwards[key]

    async def _take_over(self, conversation_id: str) -> None:
        try:
            await self.mind.actor(conversation_id)  # taken here: its followers move onto it
        except Unavailable:  # NotOwner: another node was quicker; keep following it
            return
        self.takeovers += 1
        replica = self.replicas.pop(conversation_id, None)
        if replica is None:
            return
        replica.unloaded = True
        moves = []
        for sub in list(replica.subscribers.values()):
            owner = sub.owner
            if owner is not None:
                moves.append((owner, owner.position(conversation_id)))
        await self.bus.unlisten(fanout_channel(conversation_id))
        for owner, pos in moves:
            owner.move(conversation_id, self.mind.view, pos)

    async def _sweep(self) -> None:
        for row in await self.mind.store.open_chat_runs():
            cid = row.conversation_id
            if cid in self.held or await self.owner_of(cid) is not None:
                continue
            with contextlib.suppress(Unavailable):  # NotOwner among them
                await self.mind.actor(cid)
                self.takeovers += 1

    # -- forwarding ----------------------------------------------------------------

    async def forward(self, owner: str, caller: Caller, type_: str, payload: Any) -> None:
        """Run ``type_`` on the conversation's owner for ``caller``; its
        answers reach ``caller``; an error it raised is raised here."""
        principal = caller.principal_id
        assert principal is not None
        key = secrets.token_hex(8)
        done: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        self._forwards[key] = _Forward(caller, done, self.mind.now())
        envelope = Envelope(
            "cmd", key, origin=self.node_id, principal_id=principal,
            detail_mode=caller.detail_mode, type=type_, body=msgspec.json.encode(payload),
        )
        await self._call(owner, key, envelope, done)

    async def remote_snapshot(self, conversation_id: str, limit: int, mode: str) -> Snapshot:
        owner = await self.owner_of(conversation_id)
        if owner is None or owner == self.node_id:
            raise Unavailable("the conversation has no owner right now; retry")
        key = secrets.token_hex(8)
        done: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        envelope = Envelope(
            "snap", key, origin=self.node_id, conversation_id=conversation_id,
            limit=limit, detail_mode=mode,
        )
        self._forwards[key] = _Forward(_NoCaller(), done, self.mind.now())
        answer = await self._call(owner, key, envelope, done)
        self._forwards.pop(key, None)
        return _decode_snapshot(answer.body)

    async def _call(
        self, owner: str, key: str, envelope: Envelope, done: asyncio.Future[Envelope]
    ) -> Envelope:
        try:
            heard = await self.bus.publish(node_channel(owner), _encode(envelope))
        except Exception as exc:
            raise self._unreachable(key, f"could not reach node {owner}: {exc}") from None
        if heard == 0:
            raise self._unreachable(
                key, f"node {owner}, the conversation's owner, is not answering; retry")
        if not await self.mind.scheduler.wait_first((done,), self.mind.config.forward_timeout_s):
            raise self._unreachable(
                key, f"node {owner}, the conversation's owner, did not answer; retry")
        answer = done.result()
        self.forwards["answered"] += 1
        if answer.error_code:
            raise remote_error(answer)
        return answer

    def _unreachable(self, key: str, message: str) -> Unavailable:
        """A forward that got no answer: forgotten, counted, and the error to raise."""
        self._forwards.pop(key, None)
        self.forwards["unavailable"] += 1
        return Unavailable(message)

    def reply(self, origin: str, envelope: Envelope) -> None:
        self.bus.post(node_channel(origin), _encode(envelope))

    def _on_node(self, payload: bytes) -> None:
        envelope = decoded(_decode_envelope, payload)
        kind = envelope.kind
        if kind == "msg":
            pending = self._forwards.get(envelope.id)
            if pending is None:
                return
            if not pending.caller.closed:
                pending.caller.send(Message(envelope.type, envelope.body))
            if envelope.type in FINAL:
                pending.answered = True
                if pending.done.done():  # a chat's result, after the command
                    del self._forwards[envelope.id]
        elif kind == "done":
            pending = self._forwards.get(envelope.id)
            if pending is not None and not pending.done.done():
                pending.done.set_result(envelope)
                if pending.answered or envelope.error_code:
                    del self._forwards[envelope.id]
        elif kind in ("cmd", "snap"):
            self.mind.spawn(self._serve(envelope), "forwarded command")

    async def _serve(self, envelope: Envelope) -> None:
        answer = Envelope("done", envelope.id)
        try:
            if envelope.kind == "snap":
                actor = self.mind.owned(envelope.conversation_id)
                if actor is None:
                    raise Unavailable("this node no longer owns the conversation; retry")
                snap = await actor.snapshot(envelope.limit, envelope.detail_mode or "summary")
                answer.body = msgspec.json.encode(snap)
            else:
                await self._run_forwarded(envelope)
        except HalfpiError as exc:
            answer.error_code = exc.code.value
            answer.error_message = exc.message
            answer.error_field = exc.field
            answer.retryable = exc.retryable
        except Exception:
            log.exception("a forwarded %s failed", envelope.type)
            error = InternalError("the command failed on the conversation's owner")
            answer.error_code = error.code.value
            answer.error_message = error.message
        self.reply(envelope.origin, answer)

    async def _run_forwarded(self, envelope: Envelope) -> None:
        credential = self.mind.credential(envelope.principal_id)
        if credential is None:
            await self.mind.refresh_credentials()
            credential = self.mind.credential(envelope.principal_id)
        if credential is None:
            raise Unauthorized("the credential was revoked")
        authorize(credential.scopes, envelope.type)  # I8, on the owner too
        frame = b'{"type":' + msgspec.json.encode(envelope.type) + b',"payload":'
        type_, payload = wire.decode_command(frame + envelope.body + b"}")
        caller = RemoteCaller(
            self, envelope, credential.label, credential.profile, credential.scopes
        )
        await self.dispatch(self.mind, caller, type_, payload)

    # -- news ------------------------------------------------------------------------

    def announce(self, message: Message) -> None:
        self.bus.post(
            NEWS_CHANNEL, _encode(News(self.node_id, message.type, bytes(message.encoded_body())))
        )

    def _on_news(self, payload: bytes) -> None:
        news = decoded(_decode_news, payload)
        if news.origin != self.node_id:
            self.mind.announce_message(Message(news.type, news.body))


class _NoCaller:
    """Where a snapshot's answer goes: nowhere but its future."""

    closed = False

    def send(self, message: Message) -> None:
        """A snapshot call has no messages, only its answer."""

