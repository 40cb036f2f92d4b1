"""Conversation leases on Redis (DESIGN §10): one owner node per conversation.

A lease is the key ``halfpi:lease:{C}`` holding ``NODE|FENCE`` with a
time-to-live (``SET NX PX``). Taking it is one Lua script, so atomic:
the key is set only if absent, and the conversation's fencing token
``halfpi:fence:{C}`` is incremented (``INCR``) in the same step — every
take-over gets a larger token than any before it. The token only grows even
if Redis lost its data: the taker passes the highest token it knows (the
one stored with the conversation in the Store) as ``at_least``, and the new
token is above it. The Store refuses a write carrying a token below the
conversation's (the fencing check is the Store's, in the same transaction).

Renewal and release are compare-and-set on the whole value: a node whose
lease expired and was taken by another cannot renew it or delete it — it
learns it lost ownership (``renew`` returns False) and steps down.
Expiry is Redis's own (``PX``): no clock of this process decides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from halfpi.core.cluster_keys import fence_key, lease_key

if TYPE_CHECKING:
    from redis.asyncio import Redis

_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return nil end
local fence = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if fence <= floor then
  fence = floor + 1
  redis.call('SET', KEYS[2], fence)
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. fence, 'PX', ARGV[2])
return fence
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Lease:
    """Ownership of one conversation by one node, with its fencing token."""

    conversation_id: str
    node_id: str
    fence: int

    @property
    def value(self) -> str:
        return f"{self.node_id}|{self.fence}"


class Leases:
    """One node's leases. ``ttl_ms``: how long a lease lives unrenewed (a
    node renews well within it, e.g. every third of it)."""

    def __init__(self, client: Redis, node_id: str, ttl_ms: int = 10_000) -> None:
        if "|" in node_id or not node_id:
            raise ValueError("a node id is a non-empty name without '|'")
        self.client = client
        self.node_id = node_id
        self.ttl_ms = ttl_ms

    async def acquire(self, conversation_id: str, at_least: int = 0) -> Lease | None:
        """Take the lease if nobody holds it (never held, released or
        expired); None while another node (or this one) holds it."""
        fence = await self.client.eval(
            _ACQUIRE,
            2,
            lease_key(conversation_id),
            fence_key(conversation_id),
            self.node_id,
            self.ttl_ms,
            at_least,
        )
        return None if fence is None else Lease(conversation_id, self.node_id, int(fence))

    async def renew(self, lease: Lease) -> bool:
        """Extend the lease by ``ttl_ms``; False: it is no longer this node's
        (expired, maybe taken over) — the node must stop writing."""
        done = await self.client.eval(
            _RENEW, 1, lease_key(lease.conversation_id), lease.value, self.ttl_ms
        )
        return bool(done)

    async def release(self, lease: Lease) -> bool:
        """Give the lease up (only if still held by it)."""
        done = await self.client.eval(_RELEASE, 1, lease_key(lease.conversation_id), lease.value)
        return bool(done)

    async def remaining_ms(self, conversation_id: str) -> int:
        """How long the conversation's lease still lives (0: none)."""
        return max(0, int(await self.client.pttl(lease_key(conversation_id))))

    async def holders(self, conversation_ids: list[str]) -> dict[str, str | None]:
        """Who owns each conversation now (one round trip): node id or None."""
        if not conversation_ids:
            return {}
        raws = await self.client.mget([lease_key(c) for c in conversation_ids])
        owners: dict[str, str | None] = {}
        for conversation_id, raw in zip(conversation_ids, raws, strict=True):
            text = raw.decode() if isinstance(raw, bytes) else raw
            owners[conversation_id] = None if text is None else str(text).rpartition("|")[0]
        return owners

    async def holder(self, conversation_id: str) -> Lease | None:
        """Who holds the conversation now (where to forward its commands)."""
        raw = await self.client.get(lease_key(conversation_id))
        if raw is None:
            return None
        node, _, fence = (raw.decode() if isinstance(raw, bytes) else str(raw)).rpartition("|")
        return Lease(conversation_id, node, int(fence))
