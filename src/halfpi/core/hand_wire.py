"""Wire types of the Hand protocol (``/v1/hand``), strict like the Face ones,
and the limits the Mind enforces on what a Hand says (DESIGN §6, §8).

Hand → Mind: ``hand.hello``, ``hand.checked``, ``hand.started``,
``hand.progress``, ``hand.result``, ``hand.ping`` and the background
tasks' ``hand.task.receipt``, ``.refused``, ``.update``, ``.log_page``.
Mind → Hand: ``hand.welcome``, ``hand.check``, ``hand.run``,
``hand.cancel``, ``hand.ack``, ``hand.pong`` and ``hand.task.deliver``,
``.cancel``, ``.log``. Both directions are structs (DESIGN §9: typed both
ways, like h11's events shared by client and server): the Mind decodes
with :func:`decode_hand_message` and encodes with :func:`encode_to_hand`,
the Hand decodes with :func:`decode_from_mind` and encodes with
:func:`encode_to_mind`. Every run message carries the connection ``generation`` the Mind
gave when it started (or adopted) the run; a message stamped with an older
generation is refused (DESIGN §8).

The Mind does not trust a Hand's numbers: :class:`ProgressBudget` and
:func:`result_violation` say what a frame broke, if anything, and the Mind
then treats the Hand as faulty. The output digest is defined here once
(:func:`output_digest`) so that the Hand computes and the Mind verifies the
same thing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec

from halfpi.core.wire import Id, Strict
from halfpi.errors import InvalidRequest

HAND_PROTOCOL = 2

# DESIGN §6/§8 bounds, in UTF-8 bytes of the text that travels.
CHUNK_BYTES = 4096
PROGRESS_BYTES = 1024 * 1024
PROGRESS_EVENTS = 256
DISPLAY_BYTES = 1024 * 1024  # per stream of a result
ERROR_CHARS = 4096
REASON_CHARS = 1024

Short = Annotated[str, msgspec.Meta(max_length=200)]
PathText = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
RuleName = Literal["always", "outside_roots", "never"]
VerdictName = Literal["allow", "ask", "deny"]
Stream = Literal["stdout", "stderr"]


class HandTool(Strict, frozen=True):
    name: Short


class HandPolicyInfo(Strict, frozen=True):
    """What a Hand tells about its tool policy: shown to Faces, never trusted
    to lower the Mind's own floor."""

    roots: Annotated[list[PathText], msgspec.Meta(max_length=64)]
    rules: Annotated[dict[Short, RuleName], msgspec.Meta(max_length=64)]


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
    # Optional only so that a Hand of another protocol version still decodes
    # and is told which version this Mind speaks.
    policy: HandPolicyInfo | None = None


class HandChecked(Strict, frozen=True, omit_defaults=True):
    """The Hand's verdict on a tool call, before the Mind asks anyone
    (``category`` only with a category: left out, not null)."""

    check_id: Id
    verdict: VerdictName
    reason: Annotated[str, msgspec.Meta(max_length=REASON_CHARS)]
    category: Short | None = None


class HandStarted(Strict, frozen=True):
    run_id: Id
    generation: int


class HandProgress(Strict, frozen=True):
    run_id: Id
    generation: int
    kind: Stream
    data: str  # bounded by the frame size; its limit is checked by the Mind
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
    # exec_command given denied paths: whether the kernel enforced them, and how
    # (mount: a private mount namespace and Landlock; landlock: Landlock alone).
    confined: bool | None = None
    confinement: Literal["mount", "landlock", "none"] | None = None


class HandPing(Strict, frozen=True):
    pass


# -- background tasks (DESIGN §8, docs/hands.md) -------------------------------------

TaskState = Literal["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"]


class HandTaskReceipt(Strict, frozen=True):
    """The Hand has the task of a delivery (the original receipt again for a
    redelivery: ``deduplicated``)."""

    delivery_id: Short
    task_id: Short
    state: TaskState
    deduplicated: bool
    received_at: float


class HandTaskRefused(Strict, frozen=True, omit_defaults=True):
    """A delivery (``delivery_conflict``, ``unavailable``) or a task order
    (``task_not_found``) the Hand refused; it names the one it refused (the
    other id is left out, not null)."""

    code: Short
    message: Annotated[str, msgspec.Meta(max_length=REASON_CHARS)]
    delivery_id: Short | None = None
    task_id: Short | None = None


class HandTaskUpdate(Strict, frozen=True):
    """A task as it stands on the Hand (its authority), at every change and
    after every (re)connect."""

    task_id: Short
    delivery_id: Short
    tool: Short
    state: TaskState
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: Annotated[str, msgspec.Meta(max_length=ERROR_CHARS)] | None = None
    log_bytes: int = 0
    log_truncated: bool = False


class HandTaskLogPage(Strict, frozen=True):
    """A page of a task's log (64 KiB at most, base64)."""

    task_id: Short
    offset: int
    next_offset: int
    data_b64: Annotated[str, msgspec.Meta(max_length=96 * 1024)]
    truncated: bool
    state: TaskState


HAND_MESSAGES: dict[str, type[Strict]] = {
    "hand.hello": HandHello,
    "hand.checked": HandChecked,
    "hand.started": HandStarted,
    "hand.progress": HandProgress,
    "hand.result": HandResult,
    "hand.ping": HandPing,
    "hand.task.receipt": HandTaskReceipt,
    "hand.task.refused": HandTaskRefused,
    "hand.task.update": HandTaskUpdate,
    "hand.task.log_page": HandTaskLogPage,
}

HandMessage = (
    HandHello | HandChecked | HandStarted | HandProgress | HandResult | HandPing
    | HandTaskReceipt | HandTaskRefused | HandTaskUpdate | HandTaskLogPage
)


# -- Mind → Hand (docs/hands.md, "The Hand protocol") ----------------------------------

ToolArgs = dict[str, Any]  # a tool's arguments: a JSON object, its keys the tool's own


class HandWelcome(Strict, frozen=True):
    """The answer to ``hand.hello``: the connection's generation, the runs
    adopted into it and those to abandon, the paths the Hand protects like
    its own (the Mind's home, DESIGN §8) and what else the Mind speaks of
    (``tasks``)."""

    hand_id: Id
    generation: int
    adopted: list[Id] = []
    abandon: list[Id] = []
    protect: list[PathText] = []
    features: list[Short] = []


class HandCheck(Strict, frozen=True):
    """Asks the Hand's verdict on a tool call, before a human is asked."""

    check_id: Id
    tool: Short
    args: ToolArgs = {}


class HandRun(Strict, frozen=True):
    """Starts a run; ``approved``: a human allowed it (the Hand judges again)."""

    run_id: Id
    generation: int
    tool: Short
    args: ToolArgs = {}
    timeout_s: float | None = None
    approved: bool = False


class HandCancel(Strict, frozen=True):
    run_id: Id


class HandAck(Strict, frozen=True):
    """The Mind has these results durably: the Hand may forget them."""

    run_ids: list[Id]


class HandPong(Strict, frozen=True):
    pass


class HandTaskDeliver(Strict, frozen=True):
    """A background task's delivery (``timeout_s`` left out when it has none)."""

    delivery_id: Short
    tool: Short
    args: ToolArgs = {}
    approved: bool = False
    timeout_s: float | msgspec.UnsetType | None = msgspec.UNSET

    @property
    def timeout(self) -> float | None:
        return None if isinstance(self.timeout_s, msgspec.UnsetType) else self.timeout_s


class HandTaskCancel(Strict, frozen=True):
    task_id: Short


class HandTaskLog(Strict, frozen=True):
    """Asks a page of a task's log (``limit``: the Hand's page size when absent)."""

    task_id: Short
    offset: int = 0
    limit: int | None = None


MIND_MESSAGES: dict[str, type[Strict]] = {
    "hand.welcome": HandWelcome,
    "hand.check": HandCheck,
    "hand.run": HandRun,
    "hand.cancel": HandCancel,
    "hand.ack": HandAck,
    "hand.pong": HandPong,
    "hand.task.deliver": HandTaskDeliver,
    "hand.task.cancel": HandTaskCancel,
    "hand.task.log": HandTaskLog,
}

MindMessage = (
    HandWelcome | HandCheck | HandRun | HandCancel | HandAck | HandPong
    | HandTaskDeliver | HandTaskCancel | HandTaskLog
)


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    payload: msgspec.Raw


class _Frame(msgspec.Struct):
    type: str
    payload: Strict


_envelope = msgspec.json.Decoder(_Envelope)
_decoders = {name: msgspec.json.Decoder(cls) for name, cls in HAND_MESSAGES.items()}
_mind_decoders = {name: msgspec.json.Decoder(cls) for name, cls in MIND_MESSAGES.items()}
_names = {cls: name for table in (HAND_MESSAGES, MIND_MESSAGES) for name, cls in table.items()}
_encoder = msgspec.json.Encoder()


def _decode(data: bytes | str, decoders: dict[str, msgspec.json.Decoder[Any]], bad: str) -> Any:
    try:
        envelope = _envelope.decode(data)
        decoder = decoders.get(envelope.type)
        if decoder is None:
            raise InvalidRequest(f"unknown type {envelope.type[:64]!r}", field="type")
        return envelope.type, decoder.decode(envelope.payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeError) as exc:
        raise InvalidRequest(f"{bad}: {exc}") from None


def decode_hand_message(data: bytes | str) -> tuple[str, Any]:
    """What a Hand said (the Mind's side); :class:`InvalidRequest` if malformed."""
    return _decode(data, _decoders, "bad hand message")  # type: ignore[no-any-return]


def decode_from_mind(data: bytes | str) -> MindMessage:
    """What the Mind said (the Hand's side); :class:`InvalidRequest` if malformed."""
    _, message = _decode(data, _mind_decoders, "bad message from the Mind")
    return message  # type: ignore[no-any-return]


def encode_to_hand(message: MindMessage) -> bytes:
    """A frame the Mind sends: ``{"type", "payload"}``, the type the struct's own."""
    return _encoder.encode(_Frame(_names[type(message)], message))


def encode_to_mind(message: HandMessage) -> bytes:
    """A frame a Hand sends."""
    return _encoder.encode(_Frame(_names[type(message)], message))


# -- output digest ----------------------------------------------------------------


def combine_digests(stdout_sha256: bytes, stderr_sha256: bytes, *, stderr_empty: bool) -> str:
    """The digest of a tool's output, from the sha256 of each stream.

    Without stderr it is the plain sha256 of stdout (``sha256sum FILE``
    matches what ``read_file`` reports); with stderr it is the sha256 of the
    two raw stream digests, stdout's first. Each stream is hashed as it is
    read, so a Hand needs no buffering, and the value does not depend on how
    the two streams interleaved in time (which the Mind cannot know)."""
    if stderr_empty:
        return "sha256:" + stdout_sha256.hex()
    return "sha256:" + hashlib.sha256(stdout_sha256 + stderr_sha256).hexdigest()


def output_digest(stdout: bytes, stderr: bytes) -> str:
    return combine_digests(
        hashlib.sha256(stdout).digest(), hashlib.sha256(stderr).digest(), stderr_empty=not stderr
    )


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


# -- limits the Mind enforces ------------------------------------------------------


class ProgressBudget:
    """One run's progress allowance: chunks of at most 4 KiB, at most 1 MiB
    and 256 events in all (DESIGN §8). A Hand drops what is beyond them;
    one that sends it anyway is faulty."""

    def __init__(self) -> None:
        self.events = 0
        self.bytes = 0

    def take(self, data: str) -> str | None:
        """Count a chunk; what it broke, if anything (then it is not counted)."""
        size = len(data.encode("utf-8", errors="surrogatepass"))
        if size > CHUNK_BYTES:
            return f"a progress chunk of {size} bytes (limit {CHUNK_BYTES})"
        if self.events + 1 > PROGRESS_EVENTS:
            return f"more than {PROGRESS_EVENTS} progress events in one run"
        if self.bytes + size > PROGRESS_BYTES:
            return f"more than {PROGRESS_BYTES} bytes of progress in one run"
        self.events += 1
        self.bytes += size
        return None


Progress = Callable[[str, str, bool], None]  # (kind, text, gap): a run's progress sink


class BoundedProgress:
    """The Hand's side of the same allowance: a piece (at most 4 KiB,
    cut by the caller) is passed on while the run's 256 events and 1 MiB
    last; beyond them it is dropped, and the next piece passed on (if
    any) says ``gap``."""

    def __init__(self, sink: Progress) -> None:
        self.sink = sink
        self.events = 0
        self.bytes = 0
        self.gap = False

    def send(self, kind: str, text: str) -> bool:
        """Pass ``text`` on; False when the allowance is spent (dropped)."""
        size = len(text.encode())
        if self.events >= PROGRESS_EVENTS or self.bytes + size > PROGRESS_BYTES:
            self.gap = True
            return False
        self.events += 1
        self.bytes += size
        gap, self.gap = self.gap, False
        self.sink(kind, text, gap)
        return True


def result_violation(result: HandResult) -> str | None:
    """What a ``hand.result`` broke or lied about, if anything.

    Each stream's text is at most 1 MiB. Where the Mind holds the whole
    output (not ``truncated``) and the text is what the tool wrote (no
    U+FFFD: bytes that were not UTF-8 arrive replaced, and the original
    cannot be recomputed), ``output_bytes`` and ``digest`` must be exactly
    those of ``stdout`` then ``stderr``; when truncated, ``output_bytes``
    must at least cover what was sent."""
    out = result.stdout.encode("utf-8", errors="surrogatepass")
    err = result.stderr.encode("utf-8", errors="surrogatepass")
    for name, data in (("stdout", out), ("stderr", err)):
        if len(data) > DISPLAY_BYTES:
            return f"a result {name} of {len(data)} bytes (limit {DISPLAY_BYTES})"
    if result.error is not None and len(result.error) > ERROR_CHARS:
        return f"a result error of {len(result.error)} characters (limit {ERROR_CHARS})"
    if result.output_bytes < 0:
        return f"output_bytes {result.output_bytes}"
    shown = len(out) + len(err)
    exact = not result.truncated and "\ufffd" not in result.stdout + result.stderr
    if exact and result.output_bytes != shown:
        return f"output_bytes {result.output_bytes} for an output of {shown} bytes"
    if not exact and "\ufffd" not in result.stdout + result.stderr and result.output_bytes < shown:
        return f"output_bytes {result.output_bytes} for a truncated output of {shown} bytes"
    if result.digest == "" and result.output_bytes == 0:
        return None  # no output, nothing to digest (a tool that could not start)
    if not _DIGEST.fullmatch(result.digest):
        return f"a malformed digest {result.digest[:80]!r}"
    if exact and result.digest != output_digest(out, err):
        return "a digest that does not match the output"
    return None
