"""The Mind API: one entry point for every transport (DESIGN §9).

A transport does only this: decode a frame (``core/wire.py``),
authenticate the connection and authorise the command (I8), call
:func:`handle` with the caller and the decoded command, and encode what the
caller's sink receives. Everything a command means — the request registry,
cancel targeting, subscriptions and replay, approvals, store writes — is
behind this call, so WebSocket, SSE, HTTP commands and AG-UI share it.

Errors are raised as :class:`halfpi.errors.HalfpiError` (each with a stable
code); the transport maps them to its own reply (``face.error``, an HTTP
status).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from halfpi.config import PROTOCOL_VERSION
from halfpi.core import wire
from halfpi.core.cursor import encode_cursor
from halfpi.core.events import Accepted, Limits, Pong, Result, Snapshot, Welcome
from halfpi.core.scopes import authorize
from halfpi.errors import NotOwner, Unavailable
from halfpi.logs import bind, unbind
from halfpi.mind import cancels, commands
from halfpi.mind.caller import Caller, gone

if TYPE_CHECKING:
    from halfpi.mind.auth import Credential
    from halfpi.mind.connection import Connection
    from halfpi.mind.service import Mind

Handler = Callable[["Mind", Caller, Any], Awaitable[None]]

HANDLERS: dict[str, Handler] = {
    "face.ping": commands.ping,
    "face.conversation.create": commands.conversation_create,
    "face.conversation.rename": commands.conversation_rename,
    "face.conversation.list": commands.conversation_list,
    "face.conversation.snapshot": commands.conversation_snapshot,
    "face.conversation.messages": commands.conversation_messages,
    "face.subscribe": commands.subscribe,
    "face.unsubscribe": commands.unsubscribe,
    "face.chat": commands.chat,
    "face.chat.cancel": cancels.chat_cancel,
    "face.approval.resolve": commands.approval_resolve,
    "face.approval.list": commands.approval_list,
    "face.run.cancel": cancels.run_cancel,
    "face.task.cancel": cancels.task_cancel,
    "face.task.list": commands.task_list,
    "face.task.get": commands.task_get,
    "face.task.log": commands.task_log,
    "face.hand.list": commands.hand_list,
}


FEATURES = (
    "resume",
    "snapshot",
    "coalesced_deltas",
    "evicted_cursors",
    "conversation_changes",  # face.conversation.changed, face.conversation.rename
    "approval_summaries",  # face.approval.pending/settled, face.approval.list
)


def welcome(mind: Mind, credential: Credential) -> Welcome:
    """Who the credential is to this Mind and how the Mind speaks to it
    (``face.welcome`` on a WebSocket, ``GET /v1/welcome`` over HTTP)."""
    config = mind.config
    return Welcome(
        principal_id=credential.principal_id,
        label=credential.label,
        profile=credential.profile,
        scopes=sorted(credential.scopes),
        protocol=PROTOCOL_VERSION,
        node_id=mind.node_id,
        heartbeat_s=config.heartbeat_s,
        limits=Limits(
            max_frame_bytes=config.max_frame_bytes,
            max_chat_bytes=config.max_chat_bytes,
            reliable_queue_messages=config.queue.reliable_messages,
            reliable_queue_bytes=config.queue.reliable_bytes,
            transient_queue_messages=config.queue.transient_messages,
            transient_queue_bytes=config.queue.transient_bytes,
        ),
        replay_safe=list(wire.REPLAY_SAFE),
        features=list(FEATURES),
    )


# Commands that act on one conversation's state: in cluster mode they run on
# the conversation's owner (forwarded there when it is another node).
FORWARDED = frozenset(
    {
        "face.conversation.rename",
        "face.chat",
        "face.chat.cancel",
        "face.approval.resolve",
        "face.run.cancel",
    }
)

__all__ = ["authorize", "call", "dispatch", "handle", "welcome"]


async def handle(mind: Mind, caller: Caller, type_: str, payload: Any) -> None:
    """Run one command of ``caller`` (authenticated, and authorised for
    ``type_``); its replies go to the caller's sink. In cluster mode a
    command for a conversation another node owns runs there."""
    if mind.draining and type_ in wire.MUTATIONS:
        raise Unavailable("the Mind is shutting down; retry elsewhere or later")
    # The command's ids in every log line it (and a chat it starts) writes.
    bound = bind(conversation_id=getattr(payload, "conversation_id", None),
                 request_id=getattr(payload, "request_id", None))
    try:
        await _handle(mind, caller, type_, payload)
    finally:
        unbind(bound)


async def _handle(mind: Mind, caller: Caller, type_: str, payload: Any) -> None:
    cluster = mind.cluster
    if cluster is not None and type_ in FORWARDED:
        conversation_id = await conversation_of(mind, type_, payload)
        if conversation_id is not None:
            owner = await cluster.owner_of(conversation_id)
            if owner is not None and owner != mind.node_id:
                await cluster.forward(owner, caller, type_, payload)
                return
            try:
                await HANDLERS[type_](mind, caller, payload)
            except NotOwner as exc:  # taken by another node meanwhile
                await cluster.forward(exc.owner, caller, type_, payload)
            return
    await HANDLERS[type_](mind, caller, payload)


async def conversation_of(mind: Mind, type_: str, payload: Any) -> str | None:
    """The conversation a Face command acts on (None: it acts on none, or on
    something this node cannot place: it runs here)."""
    conversation_id = getattr(payload, "conversation_id", None)
    if isinstance(conversation_id, str):
        return conversation_id
    if type_ == "face.approval.resolve":
        row = await mind.store.get_approval(payload.approval_id)
        return None if row is None else row.conversation_id
    if type_ == "face.run.cancel":
        run = await mind.store.get_tool_run(payload.run_id)
        return None if run is None else run.conversation_id
    return None


async def dispatch(mind: Mind, caller: Caller, type_: str, payload: Any) -> None:
    """Run a command here, never forwarding it (a command forwarded to this
    node, which owns its conversation)."""
    await HANDLERS[type_](mind, caller, payload)


async def start_cursor(mind: Mind, conversation_id: str) -> str:
    """The cursor before a conversation's first event, in its epoch now:
    where a reader that asks for the whole log subscribes from (the Durable
    Streams offset ``-1``). ``conversation_not_found`` for an unknown id."""
    return encode_cursor((await mind.view(conversation_id)).epoch, 0)


async def call(
    mind: Mind, conn: Connection, type_: str, payload: Any
) -> Accepted | Result | Snapshot | Pong:
    """Run one command for a one-shot connection (made with ``collect``):
    its final reply as a typed value — or its ``face.accepted`` when it
    still runs —, a refusal raised as the project's exception."""
    assert conn.collect is not None, "a one-shot connection collects its replies"
    await handle(mind, conn, type_, payload)
    return conn.collect.outcome(type_)


def disconnected(mind: Mind, caller: Caller) -> None:
    """The caller's connection is gone (``caller.gone``): it follows nothing
    and waits for no result any more. What it started runs on (I1)."""
    gone(caller, mind.registry)
