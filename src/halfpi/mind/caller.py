"""What the Mind needs from a connection, whatever its transport.

A :class:`Caller` is an authenticated principal with a reply sink: the
WebSocket ``FaceSession`` is one; an SSE stream, an HTTP command (a one-shot
caller whose sink collects its replies) and an AG-UI run are others. The
Mind API (``mind/api.py``) takes a caller, a decoded command and nothing
else, so every transport gets the same registry, cancel rules,
subscriptions and approvals.
"""

from __future__ import annotations

from typing import Any, Protocol

from halfpi.core.events import Outbound
from halfpi.core.outbound import Message
from halfpi.mind.registry import Registry
from halfpi.mind.subscriptions import Subscriptions


class Caller(Protocol):
    """A welcomed connection: who it is, where replies go, what it follows."""

    # The principal, bound at the handshake (I8): stable for the connection.
    @property
    def principal_id(self) -> str | None: ...

    @property
    def label(self) -> str:
        """The credential's label, for people (``cancelled by laptop``)."""
        ...

    @property
    def profile(self) -> str: ...

    @property
    def scopes(self) -> frozenset[str]: ...

    # The connection's detail mode (DESIGN §6), set by ``face.subscribe``.
    detail_mode: str | None

    # What it subscribed to (created for it by ``Mind.subscriptions_for``).
    @property
    def subscriptions(self) -> Subscriptions: ...

    @property
    def closed(self) -> bool: ...

    def send(self, message: Message) -> None:
        """Queue one message on the connection's bounded queue (I7); a
        closed connection drops it."""

    def reply(self, value: Outbound) -> None:
        """A reply to its command (``face.result``, a snapshot, a pong), as
        a struct: framed for a connection, kept typed for a one-shot caller."""

    def reply_stored(self, type_: str, body: dict[str, Any]) -> None:
        """A reply as the request registry stored it."""

    def wake(self) -> None:
        """Replayed messages wait: flush (pulling them) when writes flow."""


def gone(caller: Caller, registry: Registry) -> None:
    """The caller's connection is gone: it follows nothing and waits for no
    result any more. What it started runs on (I1); a replay re-attaches."""
    caller.subscriptions.drop_all()
    registry.detach(caller)
