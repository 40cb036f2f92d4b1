"""Scopes, profiles and which scope each command needs (I8).

The gateway re-checks the scope of every command against the credential as
it is *now* (not as it was at handshake), so a change or revocation takes
effect on the next frame.
"""

from __future__ import annotations

from collections.abc import Iterable

from halfpi.errors import Forbidden

CHAT = "face:chat"
SESSIONS_READ = "face:sessions:read"
SESSIONS_WRITE = "face:sessions:write"
APPROVE = "face:approve"
RUNS_WRITE = "face:runs:write"
TASKS_READ = "face:tasks:read"
HANDS_READ = "face:hands:read"

ALL_FACE_SCOPES = frozenset(
    {CHAT, SESSIONS_READ, SESSIONS_WRITE, APPROVE, RUNS_WRITE, TASKS_READ, HANDS_READ}
)

PROFILES = {
    # An operator acts; approving tools is opt-in (``--approve``).
    "operator": frozenset(ALL_FACE_SCOPES - {APPROVE}),
    # An observer watches: reads only, and only in summary detail (I9).
    "observer": frozenset({SESSIONS_READ, TASKS_READ, HANDS_READ}),
}

COMMAND_SCOPE: dict[str, str | None] = {
    "face.conversation.create": SESSIONS_WRITE,
    "face.conversation.rename": SESSIONS_WRITE,
    "face.conversation.list": SESSIONS_READ,
    "face.conversation.snapshot": SESSIONS_READ,
    "face.conversation.messages": SESSIONS_READ,
    "face.subscribe": SESSIONS_READ,
    "face.unsubscribe": SESSIONS_READ,
    "face.chat": CHAT,
    "face.chat.cancel": CHAT,
    "face.approval.resolve": APPROVE,
    "face.approval.list": SESSIONS_READ,
    "face.run.cancel": RUNS_WRITE,
    "face.task.cancel": RUNS_WRITE,
    "face.task.list": TASKS_READ,
    "face.task.get": TASKS_READ,
    "face.task.log": TASKS_READ,
    "face.hand.list": HANDS_READ,
    "face.ping": None,
}


def scopes_for(profile: str, extra: Iterable[str] = (), *, approve: bool = False) -> frozenset[str]:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    chosen = set(PROFILES[profile]) | set(extra)
    if approve:
        chosen.add(APPROVE)
    unknown = chosen - ALL_FACE_SCOPES
    if unknown:
        raise ValueError(f"unknown scopes: {sorted(unknown)}")
    return frozenset(chosen)


def default_detail_mode(profile: str) -> str:
    return "transparent" if profile == "operator" else "summary"


def authorize(scopes: frozenset[str], type_: str) -> None:
    """I8: the scope ``type_`` needs, checked against the credential's
    scopes as they are now (every transport calls this for every command,
    and an owner node again for a command forwarded to it)."""
    scope = COMMAND_SCOPE.get(type_)
    if scope is not None and scope not in scopes:
        raise Forbidden(f"{type_} needs scope {scope}")
