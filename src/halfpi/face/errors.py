"""The SDK's one exception tree.

Tree::

    FaceError
    ├── CommandError            the Mind refused a command (carries ``code``)
    │   └── RequestConflict     the request_id was used for another payload
    ├── OutcomeUnknown          sent, connection lost, not replay-safe: the
    │                           caller must decide (never re-sent silently)
    ├── AuthError               the token was refused (4001) or revoked (4003)
    └── ClientClosed            the client was closed while waiting
"""

from __future__ import annotations

from halfpi.core.events import Error, present


class FaceError(Exception):
    """Root of everything the SDK raises on purpose."""


class CommandError(FaceError):
    """The Mind's ``face.error`` (``error``), with its fields at hand."""

    def __init__(self, error: Error) -> None:
        self.error = error
        self.code: str = error.code
        self.retryable: bool = error.retryable
        self.field: str | None = present(error.field)
        self.request_id: str | None = present(error.request_id)
        super().__init__(f"{self.code}: {error.message}")


class RequestConflict(CommandError):
    pass


class OutcomeUnknown(FaceError):
    def __init__(self, request_id: str, type_: str, hint: str = "") -> None:
        self.request_id = request_id
        self.type = type_
        super().__init__(
            f"{type_} {request_id}: sent before the connection was lost and not replay-safe;"
            f" its outcome is unknown{': ' + hint if hint else ''}"
        )


class AuthError(FaceError):
    def __init__(self, code: int, reason: str) -> None:
        self.close_code = code
        super().__init__(f"refused by the Mind ({code}): {reason}")


class ClientClosed(FaceError):
    pass


def command_error(error: Error) -> CommandError:
    if error.code == "request_conflict":
        return RequestConflict(error)
    return CommandError(error)
