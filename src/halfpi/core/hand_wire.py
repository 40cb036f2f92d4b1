"""Wire types of the Hand protocol (``/v1/hand``), strict like the Face ones.

Hand → Mind: ``hand.hello``, ``hand.started``, ``hand.progress``,
``hand.result``, ``hand.ping``. Mind → Hand: ``hand.welcome``, ``hand.run``,
``hand.cancel``, ``hand.pong``. Every run message carries the connection
``generation`` the Mind gave when it started (or adopted) the run; a message
stamped with an older generation is refused (DESIGN §8).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from halfpi.core.wire import Id, Strict
from halfpi.errors import InvalidRequest

HAND_PROTOCOL = 1

Short = Annotated[str, msgspec.Meta(max_length=200)]


class HandTool(Strict, frozen=True):
    name: Short
    needs_approval: bool | None = None


class HandRunRef(Strict, frozen=True):
    run_id: Id
    generation: int


class HandInfo(Strict, frozen=True):
    hostname: Short
    os: Short
    arch: Short
    version: Short


class HandHello(Strict, frozen=True):
    token: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    hand_id: Id
    instance_id: Id
    info: HandInfo
    tools: list[HandTool]
    protocol: int
    runs: list[HandRunRef] = []


class HandStarted(Strict, frozen=True):
    run_id: Id
    generation: int


class HandProgress(Strict, frozen=True):
    run_id: Id
    generation: int
    kind: Literal["stdout", "stderr"]
    data: Annotated[str, msgspec.Meta(max_length=16384)]
    gap: bool = False


class HandResult(Strict, frozen=True):
    run_id: Id
    generation: int
    status: Literal["succeeded", "failed", "cancelled", "timed_out"]
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_bytes: int = 0
    digest: str = ""
    truncated: bool = False
    error_category: str | None = None
    error: str | None = None
    size: int | None = None
    # exec_command given denied paths: whether the kernel enforced them.
    confined: bool | None = None


class HandPing(Strict, frozen=True):
    pass


HAND_MESSAGES: dict[str, type[Strict]] = {
    "hand.hello": HandHello,
    "hand.started": HandStarted,
    "hand.progress": HandProgress,
    "hand.result": HandResult,
    "hand.ping": HandPing,
}


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    payload: msgspec.Raw


_envelope = msgspec.json.Decoder(_Envelope)
_decoders = {name: msgspec.json.Decoder(cls) for name, cls in HAND_MESSAGES.items()}


def decode_hand_message(data: bytes | str) -> tuple[str, Any]:
    try:
        envelope = _envelope.decode(data)
        decoder = _decoders.get(envelope.type)
        if decoder is None:
            raise InvalidRequest(f"unknown type {envelope.type[:64]!r}", field="type")
        return envelope.type, decoder.decode(envelope.payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeError) as exc:
        raise InvalidRequest(f"bad hand message: {exc}") from None


def encode_hand_message(type_: str, payload: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"type": type_, "payload": payload})
