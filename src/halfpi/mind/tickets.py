"""Stream tickets and the key of resume tokens (DESIGN §9, docs/protocol.md §17).

The Mind keeps, for every transport that streams over HTTP:

- the **tickets** (``core/tickets.py``: one use, 60 s, bound, kept hashed),
  on the Mind's monotonic clock. They live in memory: a Mind that restarts forgets
  them (a page asks for a new one; a stream already open reconnects with
  its grant).
- the **key** that seals resume tokens and the grants inside them
  (``core/sse.py``). It is kept in the home (``stream.key``, 0600, made on
  first use), so tokens and grants outlive a restart, even a ``kill -9``:
  a browser reconnecting to the restarted Mind is let in and told plainly
  what it missed (a reset), instead of being refused. A grant's expiry is
  wall time, then: it is sealed into a token that outlives the process.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from halfpi.core.scopes import default_detail_mode
from halfpi.core.sse import Grant
from halfpi.core.tickets import Bound, TicketBook
from halfpi.errors import Forbidden
from halfpi.private import private_dir
from halfpi.store.base import Credential

KEY_FILE = "stream.key"
KEY_BYTES = 32
TICKET_TTL_S = 60.0
# A grant lets a stream reconnect without a ticket this long after its
# last renewal: a stream renews it with its pings while it is open
# (docs/protocol.md §17.4).
GRANT_TTL_S = 15 * 60.0
TICKET_PREFIX = "hps_"


class StreamTickets:
    def __init__(
        self, home: Path, clock: Callable[[], float], wall: Callable[[], float] = time.time
    ) -> None:
        self.path = home / KEY_FILE
        self.clock = clock  # monotonic: a ticket's 60 s
        self.wall = wall  # a grant's expiry, sealed into tokens
        self.book = TicketBook(ttl_s=TICKET_TTL_S)
        self.grant_ttl_s = GRANT_TTL_S
        self._key: bytes | None = None

    @property
    def key(self) -> bytes:
        """The token key: read from the home, made there the first time."""
        if self._key is None:
            self._key = _load_or_make(self.path)
        return self._key

    def issue_for(
        self, credential: Credential, conversations: tuple[str, ...], requested: str | None
    ) -> tuple[str, str]:
        """A ticket for ``credential`` to stream ``conversations``: the detail
        mode it asks for (DESIGN §6: observers never get transparent, I9) or
        its profile's default, frozen into the ticket. Returns
        ``(ticket, detail_mode)``."""
        if requested == "transparent" and credential.profile != "operator":
            raise Forbidden("observers cannot request transparent detail", field="detail_mode")
        mode = requested or default_detail_mode(credential.profile)
        return self.issue(credential.principal_id, conversations, mode), mode

    def issue(self, principal_id: str, conversations: tuple[str, ...], detail_mode: str) -> str:
        """A new one-time ticket (returned once, never kept in clear)."""
        ticket = TICKET_PREFIX + secrets.token_urlsafe(24)
        self.book.issue(ticket, principal_id, conversations, detail_mode, self.clock())
        return ticket

    def redeem(self, ticket: str) -> Bound | None:
        return self.book.redeem(ticket, self.clock())

    def grant(self, principal_id: str, detail_mode: str) -> Grant:
        """A grant from now for ``GRANT_TTL_S`` (whole seconds)."""
        return Grant(principal_id, int(self.wall() + self.grant_ttl_s), detail_mode)

    def grant_valid(self, grant: Grant) -> bool:
        return self.wall() < grant.expires_at


def _load_or_make(path: Path) -> bytes:
    try:
        key = bytes.fromhex(path.read_text().strip())
        if len(key) >= 16:
            return key
    except (FileNotFoundError, ValueError):
        pass
    key = secrets.token_bytes(KEY_BYTES)
    private_dir(path.parent)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key.hex() + "\n")
    os.replace(tmp, path)  # two Minds never share a home (its lock): no race
    return key
