"""The outstanding-command table (DESIGN I6): what was sent and not yet answered.

Plain state, no I/O. A :class:`Command` is either the caller's (a chat, a
rename, a read…) or the client's own (a subscribe, a list read, the read
that reconciles a command): ``role`` says which. The rules a new connection
applies to what is left from before are :meth:`Outstanding.settle`:

- a caller's command never put on the wire is sent now;
- one on the wire whose type the Mind declared replay-safe
  (``face.welcome.replay_safe``) is re-sent with the same ``request_id``;
- any other one on the wire is **never re-sent**: its outcome is learnt by
  reading state (:func:`reconciled`), and where that cannot tell, it fails
  with :class:`~halfpi.face.errors.OutcomeUnknown`;
- the client's own commands belonged to the old connection and are dropped
  (the protocol issues what the new one needs).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from halfpi.core import wire
from halfpi.core.events import Accepted, Snapshot
from halfpi.face.commands import Body, type_of
from halfpi.face.errors import OutcomeUnknown
from halfpi.face.results import Result

# What the client's own commands are for ("" is a caller's command).
SUBSCRIBE = "subscribe"
READ_CONVERSATIONS = "conversations"
READ_APPROVALS = "approvals"
RECONCILE = "reconcile"

@dataclass(eq=False, slots=True)
class Command:
    body: Body  # what is sent: the Mind's own struct (core/wire.py)
    role: str = ""
    target: Command | None = None  # for a reconciling read: what it reconciles
    sent_gen: int | None = None  # the connection it was last put on the wire of
    accepted: Accepted | None = None  # the first face.accepted

    @property
    def type(self) -> str:
        return type_of(self.body)

    @property
    def request_id(self) -> str:
        return self.body.request_id or ""

    @property
    def own(self) -> bool:
        """The client's own command, not the caller's (no one awaits it)."""
        return self.role != ""


@dataclass(slots=True)
class Settlement:
    """What a new connection does with the commands left from the old one."""

    resend: list[Command] = field(default_factory=list)
    reconcile: list[Command] = field(default_factory=list)
    dropped: list[Command] = field(default_factory=list)


class Outstanding:
    def __init__(self) -> None:
        self._by_id: dict[str, Command] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Command]:
        return iter(list(self._by_id.values()))

    def add(self, command: Command) -> Command:
        """Register ``command``; a command already here under its
        ``request_id`` is kept and returned instead (one outcome per id)."""
        return self._by_id.setdefault(command.request_id, command)

    def get(self, request_id: str) -> Command | None:
        return self._by_id.get(request_id)

    def pop(self, request_id: str) -> Command | None:
        return self._by_id.pop(request_id, None)

    def clear(self) -> list[Command]:
        commands, self._by_id = list(self._by_id.values()), {}
        return commands

    def settle(self, replay_safe: Collection[str]) -> Settlement:
        """Apply I6 to everything left when a new connection starts."""
        plan = Settlement()
        for command in list(self._by_id.values()):
            if command.own:
                self._by_id.pop(command.request_id)
                plan.dropped.append(command)
            elif command.sent_gen is None or command.type in replay_safe:
                plan.resend.append(command)
            else:
                self._by_id.pop(command.request_id)
                plan.reconcile.append(command)
        return plan


UNKNOWN_HINT = "read the conversation to learn what happened"


def reconcile_read(command: Command, request_id: str) -> Command | None:
    """The read that can tell what became of ``command``, if there is one."""
    if not isinstance(command.body, wire.Chat):
        return None
    read = wire.ConversationSnapshot(
        request_id=request_id, conversation_id=command.body.conversation_id, messages_limit=500
    )
    return Command(read, RECONCILE, target=command)


def reconciled(command: Command, snapshot: Snapshot | None) -> Result | OutcomeUnknown:
    """What the conversation's ``snapshot`` says of ``command`` (None: it
    could not be read): a chat whose reply is there resolves with it
    (``reconciled``); otherwise the outcome is unknown, and the error says
    what the Mind shows — never a resend."""
    request_id = command.request_id
    hint = UNKNOWN_HINT
    if snapshot is not None:
        mine = [m for m in snapshot.messages if m.request_id == request_id]
        reply = next((m for m in mine if m.role == "assistant"), None)
        if reply is not None:
            status = reply.status or "succeeded"
            return Result(request_id, status, reply.content, reconciled=True)
        hint = (
            "the Mind admitted it and it has no reply yet: follow the conversation"
            if mine
            else "the Mind shows no admission of it yet; it may still be in flight"
        )
    return OutcomeUnknown(request_id, command.type, hint)
