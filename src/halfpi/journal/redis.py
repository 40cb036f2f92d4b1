"""The Redis journal (cluster mode, DESIGN §10): one stream per conversation.

Keys, per conversation ``C`` (prefix ``halfpi:``):

- ``halfpi:j:{C}`` — a stream; each entry's id is ``<seq>-0`` (so a read
  from a seq is one ``XRANGE``) and its one field ``e`` the
  :class:`JournalEntry` as msgpack — the same bytes every Face is sent.
  Appended with ``XADD … MAXLEN ~ events`` (Redis trims whole nodes, so a
  stream holds at least ``events`` entries).
- ``halfpi:m:{C}`` — a hash: ``epoch`` (the epoch this stream is continuous
  for), ``floor`` (no entry at or below it is promised), ``settled``
  (see :class:`~halfpi.journal.base.Window`).

**Continuity.** :meth:`RedisJournal.open` returns the stored epoch only when
the marker hash still names it: any node that opens the conversation after
another one held it continues the same stream. A marker that is gone means
Redis lost its data (a restart without persistence, a flush, an eviction):
the journal names a new epoch, the Mind stores it, and every cursor of the
old epoch gets ``epoch_changed`` — an honest reset, never a silent gap.

**Loss while open.** Reads check the marker in the same round trip
(``MULTI``); a marker that vanished, or entries whose seqs are not
continuous (a gap: the stream was trimmed or rewritten under the reader),
make :meth:`read_after` answer None (``cursor_expired`` for that Face) and
mark the conversation lost: its next :meth:`open` names a new epoch, and
:attr:`RedisJournal.lost` lets the Mind see it at once.

Appends are queued and written by one task per journal in pipelines (many
``XADD`` per round trip, in seq order); the future an append returns
resolves once its entry (and every earlier one) is in Redis.

**Several nodes** (docs/cluster.md, "Several nodes"). The owner of a
conversation names its lease's fencing token (:meth:`RedisJournal.fence`);
from then on its appends are one Lua script per conversation and batch that
checks the token against ``halfpi:fence:{C}`` (raised by every take-over),
adds the entries and publishes them on ``halfpi:f:{C}`` — atomically, so a
stale owner (paused past its lease) can neither extend the stream nor reach
another node's Faces; its append is refused (``on_fenced``) and it steps
down. Other nodes :meth:`follow` a conversation: they learn its epoch and
head from Redis and get its entries from the fan-out channel, re-reading the
stream when a seq is missing. A new owner *settles* the window when it opens
the conversation (:attr:`RedisJournal.settle_on_open`): what the previous
owner journaled but never committed (its transient deltas) is dropped,
and every cursor of the epoch resumes from the Store up to the head (exact
for committed events) — the same rule as a window dropped while idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from halfpi.config import JournalLimits
from halfpi.core.cluster_keys import fanout_channel, fence_key, marker_key, stream_key
from halfpi.core.ids import new_epoch
from halfpi.journal.base import JournalEntry, Window

if TYPE_CHECKING:  # redis is imported lazily: the embedded default does not need it
    from redis.asyncio import Redis

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(JournalEntry).decode
_decode_many = msgspec.msgpack.Decoder(list[JournalEntry]).decode

# Connections to Redis per node (the pub/sub link holds one), and how long a
# command waits for a free one before it fails.
POOL_CONNECTIONS = 64
POOL_WAIT_S = 20.0


class JournalLostError(Exception):
    """Redis no longer holds what the journal wrote (its data was lost)."""


def msgpack_array(items: list[bytes]) -> bytes:
    """A msgpack array of already-encoded items (no item encoded twice)."""
    n = len(items)
    if n < 16:
        head = bytes((0x90 | n,))
    elif n < 0x10000:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    return head + b"".join(items)


# A fan-out message with no entries: the conversation's journal was settled
# by a new owner (or opened in a new epoch); a follower resyncs.
SETTLED = msgpack_array([])


def fanout_entries(payload: bytes) -> list[JournalEntry]:
    """The entries of one fan-out message, in seq order (none: ``SETTLED``)."""
    return _decode_many(payload)


# One owner's batch for one conversation: refused unless the caller's token is
# the conversation's fencing token now; else every entry added (each id
# ``<seq>-0``), then the whole batch published on the fan-out channel.
_FENCED_APPEND = """
local held = redis.call('GET', KEYS[2])
if held ~= ARGV[1] then
  return redis.error_reply('HPFENCED the conversation has a newer owner')
end
for i = 4, #ARGV, 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], ARGV[i], 'e', ARGV[i + 1])
end
redis.call('PUBLISH', KEYS[3], ARGV[3])
return (#ARGV - 3) / 2
"""


# Sent by its SHA1 (EVALSHA): a pipeline holding a registered script would
# ask Redis ``SCRIPT EXISTS`` first, one more round trip on every batch.
# Redis answers NOSCRIPT when it does not hold it (the first append since
# it started, or after SCRIPT FLUSH): it is loaded then and those sent again.
_FENCED_APPEND_SHA = hashlib.sha1(_FENCED_APPEND.encode()).hexdigest()


class FencedAppendError(JournalLostError):
    """A stale owner's append, refused: another node owns the conversation."""


def _seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


class RedisJournal:
    def __init__(self, client: Redis, limits: JournalLimits | None = None) -> None:
        self.client = client
        self.limits = limits or JournalLimits()
        self._epochs: dict[str, str] = {}
        self._heads: dict[str, int] = {}
        self._queue: list[tuple[str, JournalEntry, asyncio.Future[None]]] = []
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        # Conversations whose stream was found lost or gapped since opened.
        self.lost: set[str] = set()
        # Cluster mode: the fencing token each owned conversation's appends
        # carry (``fence``), and who hears of a refused one (the node steps
        # down for that conversation).
        self._fences: dict[str, int] = {}
        self.on_fenced: Callable[[str], None] | None = None
        # Who hears that an owned conversation's stream was lost (Redis lost
        # its data, or the stream was rewritten under it): in cluster mode the
        # node steps down and opens it again (a new epoch, an honest reset).
        self.on_lost: Callable[[str], None] | None = None
        self.settle_on_open = False
        # Read by GET /metrics: the encoded entries sent to Redis (a refused
        # write's included), in bytes.
        self.written_bytes = 0

    @classmethod
    def from_url(cls, url: str, limits: JournalLimits | None = None) -> RedisJournal:
        from redis.asyncio import BlockingConnectionPool, Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        # A dropped connection (Redis restarted) is retried on a new one: what
        # the journal then finds is judged by the marker, not by the error.
        # A bounded pool that makes a caller wait for a free connection (not
        # fail): a burst of Faces subscribing at once queues, never errs.
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=POOL_CONNECTIONS,
            timeout=POOL_WAIT_S,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.01), 3),
            retry_on_error=[RedisConnectionError],
        )
        return cls(Redis.from_pool(pool), limits)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        await self.client.aclose()

    # -- the Journal Protocol ------------------------------------------------------

    async def open(self, conversation_id: str, epoch: str | None, head: int) -> str:
        marker = marker_key(conversation_id)
        held = await self.client.hgetall(marker)
        self.lost.discard(conversation_id)
        if epoch is not None and held.get(b"epoch") == epoch.encode() and self.settle_on_open:
            # A new owner: settle at the Store's head (past every seq the
            # previous owner may have shown); committed events below it are
            # replayed from the Store, exactly.
            pipe = self.client.pipeline(transaction=True)
            pipe.xtrim(stream_key(conversation_id), maxlen=0)
            pipe.hset(marker, mapping={"floor": head, "settled": head})
            # Followers on other nodes may have missed what the previous owner
            # stored last (killed between its commit and its publish): they
            # resync now, not at the next event (which may never come).
            pipe.publish(fanout_channel(conversation_id), SETTLED)
            await pipe.execute()
            self._epochs[conversation_id] = epoch
            self._heads[conversation_id] = head
            return epoch
        if epoch is not None and held.get(b"epoch") == epoch.encode():
            self._epochs[conversation_id] = epoch
            last = await self._last_seq(conversation_id)
            self._heads[conversation_id] = max(head, last if last is not None else head)
            return epoch
        # No continuity (never journaled, or Redis lost it): a new epoch, a
        # fresh stream starting empty at ``head``.
        fresh = new_epoch()
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(stream_key(conversation_id))
        pipe.hset(marker, mapping={"epoch": fresh, "floor": head, "settled": head})
        pipe.publish(fanout_channel(conversation_id), SETTLED)  # followers reset now
        await pipe.execute()
        self._epochs[conversation_id] = fresh
        self._heads[conversation_id] = head
        return fresh

    def append(self, conversation_id: str, entry: JournalEntry) -> asyncio.Future[None] | None:
        self._heads[conversation_id] = entry.seq
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((conversation_id, entry, future))
        if self._writer is None or self._writer.done():
            self._wake = asyncio.Event()
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        assert self._wake is not None
        self._wake.set()
        return future

    async def _known_epoch(self, conversation_id: str) -> str | None:
        """The epoch this journal reads the conversation in: the one it opened
        or followed; else (a reader after this node stopped following it)
        the marker's now."""
        epoch = self._epochs.get(conversation_id)
        if epoch is None:
            followed = await self.follow(conversation_id)
            epoch = None if followed is None else followed[0]
        return epoch

    async def window(self, conversation_id: str) -> Window:
        epoch = await self._known_epoch(conversation_id)
        if epoch is None:  # Redis holds nothing of it: nothing is promised
            head = self._heads.get(conversation_id, 0)
            return Window("", head, head, 0)
        pipe = self.client.pipeline(transaction=True)
        pipe.hmget(marker_key(conversation_id), ["epoch", "floor", "settled"])
        pipe.xrange(stream_key(conversation_id), "-", "+", count=1)
        pipe.xrevrange(stream_key(conversation_id), "+", "-", count=1)
        (held_epoch, floor_b, settled_b), first, last = await pipe.execute()
        head = self._heads.get(conversation_id, 0)
        if held_epoch != epoch.encode():
            self._mark_lost(conversation_id)
            return Window(epoch, head, head, 0)  # nothing is promised any more
        floor = int(floor_b)
        if first:
            floor = max(floor, _seq_of(first[0][0]) - 1)
        if last:
            head = max(head, _seq_of(last[0][0]))
        elif floor < head:
            floor = head  # everything trimmed
        return Window(epoch, floor, head, int(settled_b))

    async def read_after(
        self, conversation_id: str, seq: int, limit: int
    ) -> list[JournalEntry] | None:
        epoch = await self._known_epoch(conversation_id)
        if epoch is None:
            return None
        pipe = self.client.pipeline(transaction=True)
        pipe.hmget(marker_key(conversation_id), ["epoch", "floor"])
        pipe.xrange(stream_key(conversation_id), "-", "+", count=1)
        pipe.xrange(stream_key(conversation_id), f"{seq + 1}-0", "+", count=limit)
        (held_epoch, floor_b), first, rows = await pipe.execute()
        if held_epoch != epoch.encode():
            self._mark_lost(conversation_id)
            return None
        floor = int(floor_b)
        if first:
            floor = max(floor, _seq_of(first[0][0]) - 1)
        if seq < floor:
            return None
        entries = [_decode(fields[b"e"]) for _, fields in rows]
        expected = seq + 1
        for e in entries:
            if e.seq != expected:  # a gap: never serve it as continuous
                self._mark_lost(conversation_id)
                return None
            expected += 1
        return entries

    async def release(self, conversation_id: str) -> None:
        head = self._heads.pop(conversation_id, None)
        self._epochs.pop(conversation_id, None)
        self._fences.pop(conversation_id, None)
        if head is None:
            return
        await self._drain(conversation_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(stream_key(conversation_id))
        pipe.hset(marker_key(conversation_id), mapping={"floor": head, "settled": head})
        await pipe.execute()

    def _mark_lost(self, conversation_id: str) -> None:
        self.lost.add(conversation_id)
        if conversation_id in self._fences and self.on_lost is not None:
            self.on_lost(conversation_id)

    # -- several nodes -------------------------------------------------------------

    def fence(self, conversation_id: str, token: int) -> None:
        """This node owns the conversation under ``token``: its appends are
        fenced and fanned out from now on."""
        self._fences[conversation_id] = token

    async def follow(self, conversation_id: str) -> tuple[str, int] | None:
        """Follow a conversation another node owns: its epoch and head now,
        as Redis holds them (None: Redis holds nothing of it). Subscribe to
        its fan-out channel first, so nothing appended after this read is
        missed."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hmget(marker_key(conversation_id), ["epoch", "floor"])
        pipe.xrevrange(stream_key(conversation_id), "+", "-", count=1)
        (epoch_b, floor_b), last = await pipe.execute()
        if epoch_b is None:
            return None
        epoch = epoch_b.decode()
        head = _seq_of(last[0][0]) if last else int(floor_b or 0)
        self._epochs[conversation_id] = epoch
        self._heads[conversation_id] = max(head, self._heads.get(conversation_id, 0))
        return epoch, head

    def followed(self, conversation_id: str, seq: int) -> None:
        """A follower saw ``seq`` on the fan-out: the head is at least that."""
        if seq > self._heads.get(conversation_id, 0):
            self._heads[conversation_id] = seq

    # -- writing ---------------------------------------------------------------------

    async def _drain(self, conversation_id: str) -> None:
        pending = [f for c, _, f in self._queue if c == conversation_id]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _last_seq(self, conversation_id: str) -> int | None:
        last = await self.client.xrevrange(stream_key(conversation_id), "+", "-", count=1)
        return _seq_of(last[0][0]) if last else None  # type: ignore[arg-type]

    async def _write_loop(self) -> None:
        assert self._wake is not None
        wake = self._wake
        while True:
            await wake.wait()
            wake.clear()
            while self._queue:
                batch, self._queue = self._queue, []
                await self._write(batch)

    async def _write(self, batch: list[tuple[str, JournalEntry, asyncio.Future[None]]]) -> None:
        if self._fences:
            await self._write_fenced(batch)
            return
        pipe = self.client.pipeline(transaction=False)
        for conversation_id, entry, _ in batch:
            self._xadd(pipe, conversation_id, entry)
        try:
            results: list[Any] = await pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection: every entry of the batch failed
            error = JournalLostError(f"redis journal write failed: {exc}")
            for conversation_id, _, future in batch:
                self._mark_lost(conversation_id)
                if not future.done():
                    future.set_exception(error)
            return
        for (conversation_id, _, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                # e.g. an id not above the stream's top: the stream is not ours
                self._mark_lost(conversation_id)
                future.set_exception(JournalLostError(f"redis journal write refused: {result}"))
            else:
                future.set_result(None)

    async def _unless_noscript(self, results: list[Any], scripts: dict[int, list[Any]]) -> None:
        """Redis did not hold the fenced script (NOSCRIPT: nothing of those
        appends ran): load it, send them again, put their answers in
        ``results``. Each is one conversation's whole batch, so its entries
        stay in seq order."""
        from redis.exceptions import NoScriptError

        again = [i for i in scripts if isinstance(results[i], NoScriptError)]
        if not again:
            return
        await self.client.script_load(_FENCED_APPEND)
        pipe = self.client.pipeline(transaction=False)
        for i in again:
            pipe.evalsha(*scripts[i])
        for i, result in zip(again, await pipe.execute(raise_on_error=False), strict=True):
            results[i] = result

    def _xadd(self, pipe: Any, conversation_id: str, entry: JournalEntry) -> None:
        body = _encode(entry)
        self.written_bytes += len(body)
        pipe.xadd(
            stream_key(conversation_id),
            {"e": body},
            id=f"{entry.seq}-0",
            maxlen=self.limits.events,
            approximate=True,
        )

    async def _write_fenced(
        self, batch: list[tuple[str, JournalEntry, asyncio.Future[None]]]
    ) -> None:
        """One fenced script per conversation of the batch (its entries in seq
        order), all in one pipeline; unfenced ones as plain ``XADD``."""
        groups: dict[str, list[tuple[JournalEntry, asyncio.Future[None]]]] = {}
        for conversation_id, entry, future in batch:
            groups.setdefault(conversation_id, []).append((entry, future))
        pipe = self.client.pipeline(transaction=False)
        maxlen = self.limits.events
        order: list[tuple[str, list[asyncio.Future[None]], int | None]] = []
        scripts: dict[int, list[Any]] = {}  # index in ``order`` -> EVALSHA's arguments
        for conversation_id, items in groups.items():
            token = self._fences.get(conversation_id)
            futures = [f for _, f in items]
            if token is None:
                for entry, future in items:  # not owned here: plain appends
                    self._xadd(pipe, conversation_id, entry)
                    order.append((conversation_id, [future], None))
                continue
            encoded = [_encode(entry) for entry, _ in items]  # each entry once
            self.written_bytes += sum(len(body) for body in encoded)
            args: list[Any] = [
                _FENCED_APPEND_SHA,
                3,
                stream_key(conversation_id),
                fence_key(conversation_id),
                fanout_channel(conversation_id),
                token,
                maxlen,
                msgpack_array(encoded),
            ]
            for (entry, _), body in zip(items, encoded, strict=True):
                args.append(f"{entry.seq}-0")
                args.append(body)
            scripts[len(order)] = args
            pipe.evalsha(*args)
            order.append((conversation_id, futures, token))
        try:
            results: list[Any] = await pipe.execute(raise_on_error=False)
            await self._unless_noscript(results, scripts)
        except Exception as exc:  # the connection: every entry of the batch failed
            error = JournalLostError(f"redis journal write failed: {exc}")
            for conversation_id, futures, _ in order:
                self._mark_lost(conversation_id)
                for future in futures:
                    if not future.done():
                        future.set_exception(error)
            return
        for (conversation_id, futures, token), result in zip(order, results, strict=True):
            failure: JournalLostError | None = None
            if isinstance(result, Exception):
                if token is not None and "HPFENCED" in str(result):
                    failure = FencedAppendError(f"append refused: {result}")
                    # (an owner that took the conversation again since holds a newer token)
                    if self._fences.get(conversation_id) == token:
                        del self._fences[conversation_id]
                        if self.on_fenced is not None:
                            self.on_fenced(conversation_id)
                else:
                    self._mark_lost(conversation_id)
                    failure = JournalLostError(f"redis journal write refused: {result}")
            for future in futures:
                if future.done():
                    continue
                if failure is None:
                    future.set_result(None)
                else:
                    future.set_exception(failure)
