"""Wire types of the Face protocol (DESIGN §4) as frozen, strict msgspec structs.

Every frame is ``{"type": T, "payload": {...}}``. :func:`decode_command`
turns raw bytes into a typed command or raises :class:`InvalidRequest`
naming the offending field; nothing else escapes it. Unknown fields,
unknown types, wrong types and trailing data are all refused.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from halfpi.errors import InvalidRequest

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
RequestIdField = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Name = Annotated[str, msgspec.Meta(max_length=200)]
DetailMode = Literal["transparent", "summary"]
PageLimit = Annotated[int, msgspec.Meta(ge=1, le=500)]


class Strict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Base of every wire struct: unknown fields are an error, values are frozen."""


class ClientInfo(Strict, frozen=True):
    name: Annotated[str, msgspec.Meta(max_length=100)]
    version: Annotated[str, msgspec.Meta(max_length=50)]


class Hello(Strict, frozen=True):
    token: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    client: ClientInfo
    protocol: int


class Command(Strict, frozen=True):
    request_id: RequestIdField


class ConversationCreate(Command, frozen=True):
    name: Name | None = None


class ConversationRename(Command, frozen=True):
    conversation_id: Id
    # At least one visible character (``core/titles.clean_name`` keeps it):
    # said here so that the OpenAPI document says it too.
    name: Annotated[
        str, msgspec.Meta(min_length=1, max_length=200, pattern=r"[^\s\x00-\x1f\x7f-\x9f]")
    ]


class ConversationList(Command, frozen=True):
    limit: Annotated[int, msgspec.Meta(ge=1, le=200)] = 50
    before: Id | None = None


class ConversationSnapshot(Command, frozen=True):
    conversation_id: Id
    detail_mode: DetailMode | None = None
    messages_limit: PageLimit | None = None


class ConversationMessages(Command, frozen=True):
    conversation_id: Id
    limit: PageLimit
    before_seq: Annotated[int, msgspec.Meta(ge=1)] | None = None


class Subscribe(Command, frozen=True):
    conversation_ids: Annotated[list[Id], msgspec.Meta(min_length=1, max_length=100)]
    since: dict[Id, Annotated[str, msgspec.Meta(max_length=64)]] | None = None
    transient_types: list[Annotated[str, msgspec.Meta(max_length=64)]] | None = None
    detail_mode: DetailMode | None = None
    snapshot: bool = False


class Unsubscribe(Command, frozen=True):
    conversation_ids: Annotated[list[Id], msgspec.Meta(min_length=1, max_length=100)]


class Chat(Command, frozen=True):
    conversation_id: Id
    content: str


class ChatCancel(Command, frozen=True):
    conversation_id: Id
    target_request_id: RequestIdField


class ApprovalResolve(Command, frozen=True):
    approval_id: Id
    decision: Literal["allow_once", "deny_once"]
    reason: Annotated[str, msgspec.Meta(max_length=1000)] | None = None


class ApprovalList(Command, frozen=True):
    pass


class RunCancel(Command, frozen=True):
    run_id: Id


class TaskCancel(Command, frozen=True):
    task_id: Id


class TaskList(Command, frozen=True):
    limit: Annotated[int, msgspec.Meta(ge=1, le=200)] = 50
    hand: Id | None = None


class TaskGet(Command, frozen=True):
    task_id: Id


class TaskLog(Command, frozen=True):
    task_id: Id
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=1_048_576)] = 65_536


class HandList(Command, frozen=True):
    pass


class Ping(Strict, frozen=True):
    request_id: RequestIdField | None = None


COMMANDS: dict[str, type[Strict]] = {
    "face.hello": Hello,
    "face.conversation.create": ConversationCreate,
    "face.conversation.rename": ConversationRename,
    "face.conversation.list": ConversationList,
    "face.conversation.snapshot": ConversationSnapshot,
    "face.conversation.messages": ConversationMessages,
    "face.subscribe": Subscribe,
    "face.unsubscribe": Unsubscribe,
    "face.chat": Chat,
    "face.chat.cancel": ChatCancel,
    "face.approval.resolve": ApprovalResolve,
    "face.approval.list": ApprovalList,
    "face.run.cancel": RunCancel,
    "face.task.cancel": TaskCancel,
    "face.task.list": TaskList,
    "face.task.get": TaskGet,
    "face.task.log": TaskLog,
    "face.hand.list": HandList,
    "face.ping": Ping,
}

# Mutations go through the request registry (DESIGN §5) and are replay-safe:
# the SDK may re-send them with the same request_id (I6).
MUTATIONS = frozenset(
    {
        "face.conversation.create",
        "face.conversation.rename",
        "face.chat",
        "face.chat.cancel",
        "face.approval.resolve",
        "face.run.cancel",
        "face.task.cancel",
    }
)
READS = frozenset(set(COMMANDS) - MUTATIONS - {"face.hello", "face.ping"})
REPLAY_SAFE = tuple(sorted(MUTATIONS | READS))


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    payload: msgspec.Raw


_envelope_decoder = msgspec.json.Decoder(_Envelope)
_payload_decoders = {name: msgspec.json.Decoder(cls) for name, cls in COMMANDS.items()}

_AT = re.compile(r" - at (?:`key` in )?`\$\.?(?P<path>[^`]*)`$")
_NAMED = re.compile(r"field `(?P<name>[^`]+)`")


def _field_of(message: str, prefix: str = "") -> str | None:
    """Turn msgspec's error text into a dotted field path (``client.name``)."""
    path = ""
    at = _AT.search(message)
    if at:
        path = at.group("path")
        message = message[: at.start()]
    named = _NAMED.search(message)
    if named:
        path = f"{path}.{named.group('name')}" if path else named.group("name")
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    return path or None


def decode_command(data: bytes | str) -> tuple[str, Any]:
    """Decode one frame into ``(type, payload struct)`` or raise ``InvalidRequest``."""
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(str(exc), field=_field_of(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"not a JSON object frame: {exc}") from None
    except (RecursionError, UnicodeError):
        # The envelope is flat; depth (or a bad string) can only be in the payload.
        raise InvalidRequest(
            "not a decodable JSON frame (too deeply nested or not UTF-8)", field="payload"
        ) from None
    decoder = _payload_decoders.get(envelope.type)
    if decoder is None:
        raise InvalidRequest(f"unknown type {envelope.type[:64]!r}", field="type")
    try:
        return envelope.type, decoder.decode(envelope.payload)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(str(exc), field=_field_of(str(exc)) or "payload") from None
    except (msgspec.DecodeError, RecursionError, UnicodeError) as exc:
        raise InvalidRequest(
            f"undecodable payload: {type(exc).__name__}", field="payload"
        ) from None


def request_id_of(data: bytes | str) -> str | None:
    """Best-effort request_id from a frame that failed validation, for the error reply."""
    try:
        raw = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return None
    if isinstance(raw, dict):
        payload = raw.get("payload")
        if isinstance(payload, dict):
            rid = payload.get("request_id")
            if isinstance(rid, str) and 0 < len(rid) <= 128:
                return rid
    return None
