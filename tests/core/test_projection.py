"""Tool visibility (DESIGN §6): projection, masking at any depth, digests, downgrades."""

from __future__ import annotations

import json

import pytest

from halfpi.core.projection import (
    MASK,
    MAX_PROJECTED_BYTES,
    PREVIEW_CHARS,
    canonical_digest,
    is_secret_key,
    project_args,
    truncate_output,
)


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "token",
        "api_key",
        "application_key",
        "private_key",
        "secret",
        "TOKEN",
        "access_token",
        "apiKey",
        "client-secret",
        "DB_PASSWORD",
        "githubToken",
    ],
)
def test_secret_keys_are_recognised(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["command", "path", "tokenizer", "secretary", "passwords_file"])
def test_ordinary_keys_are_not_secret(key: str) -> None:
    assert not is_secret_key(key)


def test_secrets_are_masked_at_any_depth() -> None:
    args = {
        "command": "deploy",
        "token": "t-1",
        "config": {"token": "t-2", "nested": {"api_key": "k-1"}},
        "items": [{"password": "p-1", "name": "x"}, {"ok": True}],
    }
    projected = project_args(args).args
    assert projected["command"] == "deploy"
    assert projected["token"] == MASK
    assert projected["config"] == {"token": MASK, "nested": {"api_key": MASK}}
    assert projected["items"] == [{"password": MASK, "name": "x"}, {"ok": True}]
    text = json.dumps(projected)
    for secret in ("t-1", "t-2", "k-1", "p-1"):
        assert secret not in text


def test_field_rules_show_mask_hide_preview() -> None:
    long = "y" * (PREVIEW_CHARS * 2)
    args = {"a": "shown", "b": "masked", "c": "hidden", "d": long}
    projected = project_args(args, {"b": "mask", "c": "hide", "d": "preview"}).args
    assert projected["a"] == "shown"
    assert projected["b"] == MASK
    assert "c" not in projected
    assert (
        projected["d"].startswith("y" * PREVIEW_CHARS) and len(projected["d"]) == PREVIEW_CHARS + 1
    )


def test_central_masking_wins_over_a_show_rule() -> None:
    assert project_args({"password": "p"}, {"password": "show"}).args == {"password": MASK}


def test_scanners_warn_with_the_path_never_the_value() -> None:
    key = "AKIA" + "ABCDEFGHIJKLMNOP"
    projection = project_args({"env": {"creds": f"x {key} y"}, "note": "plain"})
    assert projection.warnings == ("env.creds: aws_access_key",)
    assert key not in " ".join(projection.warnings)
    assert projection.args["env"]["creds"] == f"x {key} y"  # scanners only warn


def test_digest_covers_the_full_arguments_in_any_key_order() -> None:
    a = project_args({"x": 1, "password": "p1"})
    b = project_args({"password": "p1", "x": 1})
    c = project_args({"x": 1, "password": "p2"})
    assert a.digest == b.digest == canonical_digest({"x": 1, "password": "p1"})
    assert a.digest != c.digest  # the masked field still counts
    assert a.args == c.args


def test_projection_is_bounded() -> None:
    projection = project_args({"blob": "z" * (MAX_PROJECTED_BYTES * 2)})
    assert projection.truncated
    assert len(json.dumps(projection.args)) <= MAX_PROJECTED_BYTES


def test_output_truncation_reports_it() -> None:
    text, cut = truncate_output(b"a" * 10, 4)
    assert (text, cut) == ("aaaa", True)
    assert truncate_output("é".encode(), 1) == ("\ufffd", True)
    assert truncate_output(b"ok", 10) == ("ok", False)
