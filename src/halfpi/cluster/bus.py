"""One node's pub/sub link to the others over Redis (cluster mode, DESIGN §10).

A node hears, on one pub/sub connection: its own channel (commands forwarded
to it and the answers to those it forwarded), the news channel (session-level
news every node passes on to its Faces), and the fan-out channel of each
conversation it follows for a Face of its own (the owner publishes every
batch it appends there, in the same Lua step as the append).

Pub/sub is fire and forget: a message published while a node is not
listening is lost to it. So nothing depends on it being complete — a
follower checks seq continuity and re-reads the stream (``on_resync`` after
a lost connection), a forwarded command that gets no answer times out and
is retried with the same request_id (I5) — and posts are queued and sent in
order by one task (answers to one command arrive in the order they were
sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from halfpi.core.throttle import worth_logging

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("halfpi.cluster")

T = TypeVar("T")

Handler = Callable[[bytes], None]


class Malformed(Exception):
    """A message on a channel that is not what a node sends there (raised by
    a handler's decoding; the bus drops it and counts it)."""


def decoded(decode: Callable[[bytes], T], payload: bytes) -> T:
    """``decode(payload)``, or :class:`Malformed` saying why it is not one."""
    try:
        return decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise Malformed(str(exc)) from None

RECONNECT_INITIAL_S = 0.05
RECONNECT_CAP_S = 1.0


class Bus:
    def __init__(self, client: Redis) -> None:
        self.client = client
        self._handlers: dict[str, Handler] = {}
        self._confirm: dict[str, asyncio.Future[None]] = {}
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._outbox: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        # Called after the link was lost and made again: what was published
        # meanwhile is lost to this node (followers re-read the streams).
        self.on_resync: Callable[[], None] | None = None
        self.malformed = 0  # messages dropped as not a node's

    async def start(self, channels: dict[str, Handler]) -> None:
        """Start listening, on ``channels`` at least (the node's own)."""
        self._pubsub = self.client.pubsub()
        self._handlers.update(channels)
        await self._pubsub.subscribe(*channels)
        self._reader = asyncio.create_task(self._read_loop(), name="cluster bus reader")
        self._writer = asyncio.create_task(self._write_loop(), name="cluster bus writer")

    async def close(self) -> None:
        for task in (self._reader, self._writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()

    async def listen(self, channel: str, handler: Handler) -> None:
        """Hear ``channel`` from now on: returns once Redis confirmed the
        subscription (what is published after that reaches ``handler``)."""
        self._handlers[channel] = handler
        waiter = self._confirm.get(channel)
        if waiter is None or waiter.done():
            waiter = asyncio.get_running_loop().create_future()
            self._confirm[channel] = waiter
        await self._pubsub.subscribe(channel)
        await asyncio.shield(waiter)

    async def unlisten(self, channel: str) -> None:
        if self._handlers.pop(channel, None) is None:
            return
        self._confirm.pop(channel, None)
        with contextlib.suppress(Exception):
            await self._pubsub.unsubscribe(channel)

    def post(self, channel: str, data: bytes) -> None:
        """Publish ``data`` on ``channel`` soon, after everything posted before."""
        self._outbox.append((channel, data))
        self._wake.set()

    async def publish(self, channel: str, data: bytes) -> int:
        """Publish now; how many nodes heard it (0: nobody listens there)."""
        return int(await self.client.publish(channel, data))

    # -- the loops ----------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox:
                batch, self._outbox = self._outbox, []
                pipe = self.client.pipeline(transaction=False)
                for channel, data in batch:
                    pipe.publish(channel, data)
                try:
                    await pipe.execute()
                except Exception as exc:  # lost: receivers time out or re-read
                    log.warning("could not publish %d bus messages: %s", len(batch), exc)

    async def _read_loop(self) -> None:
        delay = RECONNECT_INITIAL_S
        while True:
            try:
                async for message in self._pubsub.listen():
                    delay = RECONNECT_INITIAL_S
                    self._dispatch(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster bus link lost (%s); listening again", exc)
            await asyncio.sleep(delay)  # a pause between attempts to reach Redis again
            delay = min(delay * 2, RECONNECT_CAP_S)
            await self._relisten()

    async def _relisten(self) -> None:
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()
        self._pubsub = self.client.pubsub()
        try:
            if self._handlers:
                await self._pubsub.subscribe(*self._handlers)
        except Exception as exc:
            log.warning("cluster bus could not listen again yet: %s", exc)
            return
        if self.on_resync is not None:
            self.on_resync()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        raw = message.get("channel")
        channel = raw.decode() if isinstance(raw, bytes) else str(raw)
        if kind == "subscribe":
            waiter = self._confirm.get(channel)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if kind != "message":
            return
        handler = self._handlers.get(channel)
        if handler is None:
            return
        try:
            handler(message["data"])
        except Malformed as exc:
            # Not a message of a node (Redis is shared: anything may be
            # published there): dropped. Nothing depends on one message —
            # a follower re-reads the stream, a forward times out.
            self.malformed += 1
            if worth_logging(self.malformed):
                log.warning("dropped a malformed cluster message on %s (%d so far): %s",
                            channel, self.malformed, exc)
        except Exception:  # one bad message must not stop the link
            log.exception("cluster bus handler for %s failed", channel)
