"""How a connection to the Mind ends, in one exception (pure: no I/O).

Every transport maps its library's exceptions to :class:`ConnectionLost` at
the boundary, with the close code when one came; :meth:`~ConnectionLost.describe`
says why in words a status line or a log can show, and
:attr:`~ConnectionLost.refused` tells the two codes after which a client
must stop trying (DESIGN §4: 4001 unauthorized, 4003 revoked).
"""

from __future__ import annotations

# The Mind refused the credential (4001) or revoked it (4003): retrying
# cannot help, so a client stops (docs/protocol.md §12).
AUTH_CLOSE_CODES = frozenset({4001, 4003})


class ConnectionLost(Exception):
    """A connection failed or ended; ``code`` is the close code, if one came."""

    def __init__(self, code: int | None = None, reason: str = "") -> None:
        super().__init__(f"connection lost ({code}): {reason}")
        self.code = code
        self.reason = reason

    @property
    def refused(self) -> bool:
        """The Mind refused or revoked the credential: do not try again."""
        return self.code in AUTH_CLOSE_CODES

    def describe(self) -> str:
        """Why, in words a person can act on (what a status line shows)."""
        known = CLOSE_MEANINGS.get(self.code) if self.code is not None else None
        if known is not None:
            return known
        if self.code is None:
            return self.reason or "the connection dropped"
        return f"closed with code {self.code}" + (f": {self.reason}" if self.reason else "")


CLOSE_MEANINGS = {
    1000: "the connection was closed",
    1001: "the Mind closed the connection (no traffic, or going away)",
    1006: "the connection dropped",
    1011: "the Mind hit an internal error",
    1012: "the Mind is restarting",
    4008: "too slow to keep up: the Mind closed the connection",
    4009: "the Mind saw a protocol violation",
    4010: "no hello in time",
}
