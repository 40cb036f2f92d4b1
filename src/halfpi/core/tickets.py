"""Stream tickets (DESIGN §9, docs/protocol.md §17.4): the rule, with no I/O.

A browser's ``EventSource`` cannot send an ``Authorization`` header, so a
page asks for a ticket with its bearer token and opens the stream with
``?ticket=``. A ticket is used once, lives ``ttl_s`` (60 s), and is bound
to the principal, the conversations and the detail mode it was issued for.
Only its SHA-256 is kept (a ticket that leaks from memory is no ticket);
each principal holds at most ``per_principal`` unused ones (the oldest
goes), and expired ones are forgotten as new ones come. Time is passed in.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass


def hash_ticket(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Bound:
    """What a ticket was issued for."""

    principal_id: str
    conversations: tuple[str, ...]
    detail_mode: str
    expires_at: float


class TicketBook:
    def __init__(self, ttl_s: float = 60.0, per_principal: int = 64) -> None:
        self.ttl_s = ttl_s
        self.per_principal = per_principal
        self.by_hash: dict[str, Bound] = {}
        self._order: deque[str] = deque()  # hashes, oldest first (for expiry)
        self._of: dict[str, deque[str]] = {}  # principal -> its hashes, oldest first

    def __len__(self) -> int:
        return len(self.by_hash)

    def issue(
        self,
        ticket: str,
        principal_id: str,
        conversations: tuple[str, ...],
        detail_mode: str,
        now: float,
    ) -> None:
        """Record ``ticket`` (random, made by the caller) for ``principal_id``."""
        self._expire(now)
        digest = hash_ticket(ticket)
        self.by_hash[digest] = Bound(principal_id, conversations, detail_mode, now + self.ttl_s)
        self._order.append(digest)
        mine = self._of.setdefault(principal_id, deque())
        mine.append(digest)
        while len(mine) > self.per_principal:
            self.by_hash.pop(mine.popleft(), None)

    def redeem(self, ticket: str, now: float) -> Bound | None:
        """What ``ticket`` was issued for, once: None if unknown, used or expired."""
        self._expire(now)
        bound = self.by_hash.pop(hash_ticket(ticket), None)
        if bound is None or now >= bound.expires_at:
            return None
        return bound

    def _expire(self, now: float) -> None:
        order = self._order
        while order:
            bound = self.by_hash.get(order[0])
            if bound is not None and bound.expires_at > now:
                return
            digest = order.popleft()
            self.by_hash.pop(digest, None)
            if bound is not None:
                mine = self._of.get(bound.principal_id)
                if mine is not None:
                    if digest in mine:
                        mine.remove(digest)
                    if not mine:
                        del self._of[bound.principal_id]
