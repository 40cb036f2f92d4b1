"""One exception tree for halfpi, and the stable codes a Face branches on.

Every error a Face can see is a :class:`HalfpiError` carrying an
:class:`ErrorCode`; driver exceptions (sqlite3, psycopg, websockets) are
mapped to one of these at the boundary and never reach a Face as-is.

Tree::

    HalfpiError                       code            retryable
    ├── InvalidRequest                invalid_request no
    ├── Unauthorized                  unauthorized    no
    ├── Forbidden                     forbidden       no
    ├── NotFound                      *_not_found     no
    ├── RequestConflict               request_conflict no
    ├── RequestInProgress             request_in_progress yes
    ├── Busy                          busy            yes
    ├── RateLimited                   rate_limited    yes
    ├── TooLarge                      too_large       no
    ├── Unavailable                   unavailable     yes
    ├── ApprovalExpired               approval_expired no
    ├── HomeInUse                     unavailable     no (another Mind holds the home)
    ├── LabelInUse                    invalid_request no (a live credential has that label)
    └── InternalError                 internal_error  yes
        └── StoreError                (a backend failed; mapped to internal_error)
            ├── TerminalExists        no: a run already has its outcome (I10)
            └── FencedOut             no: a newer owner holds the conversation (cluster)
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """DESIGN §4 error codes. Clients branch on these only."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    CONVERSATION_NOT_FOUND = "conversation_not_found"
    REQUEST_CONFLICT = "request_conflict"
    REQUEST_IN_PROGRESS = "request_in_progress"
    APPROVAL_NOT_FOUND = "approval_not_found"
    APPROVAL_EXPIRED = "approval_expired"
    RUN_NOT_FOUND = "run_not_found"
    TASK_NOT_FOUND = "task_not_found"
    DELIVERY_CONFLICT = "delivery_conflict"
    HAND_NOT_FOUND = "hand_not_found"
    BUSY = "busy"
    RATE_LIMITED = "rate_limited"
    TOO_LARGE = "too_large"
    UNAVAILABLE = "unavailable"
    INTERNAL_ERROR = "internal_error"


class CloseCode(enum.IntEnum):
    """DESIGN §4 WebSocket close codes."""

    NORMAL = 1000
    GOING_AWAY = 1001
    MESSAGE_TOO_BIG = 1009  # over the hard frame limit (4 times max_frame_bytes)
    INTERNAL_ERROR = 1011
    RESTARTING = 1012
    UNAUTHORIZED = 4001
    REVOKED = 4003
    SLOW_CONSUMER = 4008
    PROTOCOL_VIOLATION = 4009
    HELLO_TIMEOUT = 4010
    # Too many connections for this credential, or too many failed
    # handshakes from this address: retry later (docs/protocol.md §12).
    RATE_LIMITED = 4029


class HalfpiError(Exception):
    """Root of every error halfpi raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR
    retryable: bool = False

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(message or self.code.value)
        self.message = message or self.code.value
        self.field = field


class InvalidRequest(HalfpiError):
    code = ErrorCode.INVALID_REQUEST


class Unauthorized(HalfpiError):
    code = ErrorCode.UNAUTHORIZED


class Forbidden(HalfpiError):
    code = ErrorCode.FORBIDDEN


class NotFound(HalfpiError):
    """A named target does not exist (or is not visible to the caller)."""

    def __init__(self, code: ErrorCode, message: str = "", *, field: str | None = None) -> None:
        self.code = code
        super().__init__(message, field=field)


class RequestConflict(HalfpiError):
    code = ErrorCode.REQUEST_CONFLICT


class DeliveryConflict(HalfpiError):
    """A background task's delivery id came again with another payload (DESIGN §8)."""

    code = ErrorCode.DELIVERY_CONFLICT


class RequestInProgress(HalfpiError):
    code = ErrorCode.REQUEST_IN_PROGRESS
    retryable = True


class Busy(HalfpiError):
    code = ErrorCode.BUSY
    retryable = True


class RateLimited(HalfpiError):
    code = ErrorCode.RATE_LIMITED
    retryable = True


class TooLarge(HalfpiError):
    code = ErrorCode.TOO_LARGE


class Unavailable(HalfpiError):
    code = ErrorCode.UNAVAILABLE
    retryable = True


class NotOwner(Unavailable):
    """Cluster mode: another node owns the conversation (``owner``); the
    command is forwarded there (a Face that sees it may retry)."""

    def __init__(self, conversation_id: str, owner: str) -> None:
        super().__init__(f"conversation {conversation_id} is owned by node {owner}; retry")
        self.conversation_id = conversation_id
        self.owner = owner


class ApprovalExpired(HalfpiError):
    code = ErrorCode.APPROVAL_EXPIRED


class HomeInUse(HalfpiError):
    """Another Mind holds this home's lock (DESIGN §12): one line, exit."""

    code = ErrorCode.UNAVAILABLE


class LabelInUse(HalfpiError):
    """A live credential of that kind already has that label: a label names
    one live credential at a time (it is free again once revoked; I8)."""

    code = ErrorCode.INVALID_REQUEST


class InternalError(HalfpiError):
    code = ErrorCode.INTERNAL_ERROR
    retryable = True


class StoreError(InternalError):
    """A Store backend failed. The Face sees ``internal_error``."""


class TerminalExists(StoreError):
    """The Store refused a second terminal outcome for one run (a chat, tool
    call, approval or tool run): the first one stands (I10, DESIGN §12).
    Not retryable: the caller converges on the outcome that stands."""

    retryable = False


class FencedOut(StoreError):
    """The Store refused a write whose fencing token is older than the one it
    holds for the conversation: another node took ownership over (DESIGN §10).
    Not retryable: this node must step down for that conversation."""

    retryable = False


class IllegalTransition(InternalError):
    """A state machine was asked for a transition its table does not allow."""


class Refused(HalfpiError):
    """A refusal that came as a ``face.error`` (a command forwarded to
    another node, say), raised again with its own code."""

    def __init__(self, code: ErrorCode, message: str, *, field: str | None = None,
                 retryable: bool = False) -> None:
        self.code = code
        self.retryable = retryable
        super().__init__(message, field=field)
