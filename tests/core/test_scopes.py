"""Scopes, profiles and the scope each command needs (I8, I9)."""

from __future__ import annotations

import pytest

from halfpi.core import scopes
from halfpi.core.scopes import (
    ALL_FACE_SCOPES,
    APPROVE,
    COMMAND_SCOPE,
    PROFILES,
    default_detail_mode,
    scopes_for,
)
from halfpi.core.wire import COMMANDS, MUTATIONS

READ_SCOPES = {scopes.SESSIONS_READ, scopes.TASKS_READ, scopes.HANDS_READ}


def test_operator_lacks_approve_by_default() -> None:
    operator = scopes_for("operator")
    assert APPROVE not in operator
    assert operator == ALL_FACE_SCOPES - {APPROVE}


def test_operator_with_approve_has_every_scope() -> None:
    assert scopes_for("operator", approve=True) == ALL_FACE_SCOPES


def test_operator_can_get_approve_as_an_extra_scope() -> None:
    assert APPROVE in scopes_for("operator", [APPROVE])


def test_observer_is_read_only() -> None:
    observer = scopes_for("observer")
    assert observer == READ_SCOPES
    for type_ in MUTATIONS:
        assert COMMAND_SCOPE[type_] not in observer, type_


def test_observer_can_be_granted_more_explicitly() -> None:
    assert scopes_for("observer", approve=True) == READ_SCOPES | {APPROVE}
    assert scopes_for("observer", [scopes.CHAT]) == READ_SCOPES | {scopes.CHAT}


def test_unknown_profile_raises() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        scopes_for("admin")


def test_unknown_scope_raises() -> None:
    with pytest.raises(ValueError, match="unknown scopes"):
        scopes_for("operator", ["face:root"])


def test_scopes_are_frozen_sets() -> None:
    assert isinstance(scopes_for("operator"), frozenset)
    assert all(isinstance(p, frozenset) for p in PROFILES.values())
    assert set(PROFILES) == {"operator", "observer"}


def test_every_command_except_hello_has_a_scope_entry() -> None:
    assert set(COMMAND_SCOPE) == set(COMMANDS) - {"face.hello"}


def test_every_named_scope_exists() -> None:
    named = {s for s in COMMAND_SCOPE.values() if s is not None}
    assert named <= ALL_FACE_SCOPES
    assert COMMAND_SCOPE["face.ping"] is None


def test_approval_needs_the_approve_scope() -> None:
    assert COMMAND_SCOPE["face.approval.resolve"] == APPROVE


def test_operator_can_run_every_command_but_approve() -> None:
    operator = scopes_for("operator")
    for type_, scope in COMMAND_SCOPE.items():
        if scope is not None:
            assert (scope in operator) == (type_ != "face.approval.resolve"), type_


def test_detail_mode_defaults() -> None:
    assert default_detail_mode("operator") == "transparent"
    assert default_detail_mode("observer") == "summary"
