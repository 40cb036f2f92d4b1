"""Cursors: the opaque ``"<epoch>.<seq>"`` strings a Face sends back (DESIGN §3)."""

from __future__ import annotations

from dataclasses import dataclass

from halfpi.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Cursor:
    epoch: str
    seq: int

    def encode(self) -> str:
        return f"{self.epoch}.{self.seq}"


def encode_cursor(epoch: str, seq: int) -> str:
    return f"{epoch}.{seq}"


def parse_cursor(text: str, *, field: str = "since") -> Cursor:
    """Parse a cursor; a malformed one is an ``invalid_request`` naming ``field``."""
    epoch, dot, seq_text = text.rpartition(".")
    if not dot or not epoch or not (seq_text.isascii() and seq_text.isdigit()) or len(text) > 64:
        raise InvalidRequest(f"malformed cursor {text[:64]!r}", field=field)
    return Cursor(epoch, int(seq_text))
