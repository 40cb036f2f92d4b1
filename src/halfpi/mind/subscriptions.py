"""A connection's subscription to one conversation.

A subscription is either *replaying* — the connection pulls events from the
journal after ``pos`` as fast as its transport drains (so catching up on
10,000 events never floods the bounded queue) — or *live*, when the actor
pushes each event as it is published. The switch happens in one synchronous
step when the pull finds nothing newer, so there is no gap and no overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from halfpi.core.outbound import Message

if TYPE_CHECKING:
    from halfpi.mind.actor import ConversationActor


class Receiver(Protocol):
    def send(self, message: Message) -> None: ...


class Subscription:
    __slots__ = ("actor", "detail_mode", "live", "pos", "session", "transient_types")

    def __init__(
        self,
        session: Receiver,
        actor: ConversationActor,
        *,
        pos: int,
        transient_types: frozenset[str] | None,
        detail_mode: str,
    ) -> None:
        self.session = session
        self.actor = actor
        self.pos = pos
        self.live = False
        self.transient_types = transient_types
        self.detail_mode = detail_mode

    @property
    def conversation_id(self) -> str:
        return self.actor.id

    def wants(self, message: Message) -> bool:
        """Transient messages pass only if the Face asked for their type."""
        return self.transient_types is None or message.type in self.transient_types
