"""The tool policy's pure rules (DESIGN §8): rules, roots, protected paths, verdicts.

Paths here are already resolved strings: resolving them (realpath, symlinks)
is the Hand's job and is tested in ``tests/hand/test_policy.py``.
"""

from __future__ import annotations

import pytest

from halfpi.core.policy import (
    DEFAULT_RULES,
    FORBIDDEN_PATH,
    Decision,
    Rule,
    ToolPolicy,
    Verdict,
    is_within,
    parse_approval,
    parse_rule,
    with_floor,
)

HOME = "/home/u/.halfpi"
PID = 4242


def policy(**rules: Rule) -> ToolPolicy:
    return ToolPolicy.build(roots=["/work/project"], rules=rules, protected=[HOME], pid=PID)


def test_defaults_are_exec_always_and_read_outside_roots() -> None:
    assert DEFAULT_RULES["exec_command"] is Rule.ALWAYS
    assert DEFAULT_RULES["read_file"] is Rule.OUTSIDE_ROOTS
    p = policy()
    assert p.rule("exec_command") is Rule.ALWAYS
    assert p.rule("read_file") is Rule.OUTSIDE_ROOTS


def test_read_file_inside_roots_runs_without_approval() -> None:
    decision = policy().judge("read_file", ["/work/project/src/a.py"])
    assert decision.verdict is Verdict.ALLOW


def test_read_file_outside_roots_asks_and_says_why() -> None:
    decision = policy().judge("read_file", ["/etc/passwd"])
    assert decision.verdict is Verdict.ASK
    assert "/etc/passwd" in decision.reason and "outside" in decision.reason


def test_a_root_contains_by_path_component_not_by_prefix() -> None:
    assert is_within("/work/project", "/work/project")
    assert is_within("/work/project/a", "/work/project/")
    assert not is_within("/work/projectx/a", "/work/project")
    assert not is_within("/work", "/work/project")
    assert is_within("/anything/at/all", "/")
    assert policy().judge("read_file", ["/work/project-secrets/x"]).verdict is Verdict.ASK


def test_exec_command_always_asks_by_default() -> None:
    decision = policy().judge("exec_command", ["/work/project"])
    assert decision.verdict is Verdict.ASK


def test_never_rule_runs_without_asking() -> None:
    decision = policy(exec_command=Rule.NEVER).judge("exec_command", ["/tmp"])
    assert decision.verdict is Verdict.ALLOW


def test_always_rule_asks_even_inside_roots() -> None:
    decision = policy(read_file=Rule.ALWAYS).judge("read_file", ["/work/project/a"])
    assert decision.verdict is Verdict.ASK


def test_unknown_tools_always_ask() -> None:
    assert policy().rule("format_disk") is Rule.ALWAYS
    assert policy().judge("format_disk").verdict is Verdict.ASK


@pytest.mark.parametrize("rule", list(Rule))
@pytest.mark.parametrize(
    "path",
    [
        HOME,
        f"{HOME}/face.token",
        f"{HOME}/halfpi.db",
        f"{HOME}/hands/local.runs.json",
        # halfpi's credential files are refused wherever they are (another
        # Mind's home on the same machine, a copy in the project).
        "/work/project/face.token",
        "/srv/other-mind/hand.token",
        "/srv/other-mind/stream.key",  # seals SSE reconnect grants
        "/srv/other-mind/halfpi.db-wal",
        # The Hand's own process: its environment holds its token.
        "/proc/self/environ",
        "/proc/thread-self/environ",
        f"/proc/{PID}/environ",
        f"/proc/{PID}/task/{PID}/mem",
        f"/proc/{PID}/cmdline",
        # Any process's environment, memory or command line.
        "/proc/1/environ",
        "/proc/77/task/78/environ",
        "/proc/77/mem",
    ],
)
def test_protected_paths_are_denied_whatever_the_rule(rule: Rule, path: str) -> None:
    decision = policy(read_file=rule).judge("read_file", [path])
    assert decision.verdict is Verdict.DENY, decision
    assert decision.category == FORBIDDEN_PATH
    assert not decision.permits(approved=True)


def test_the_roots_do_not_unprotect_what_they_contain() -> None:
    p = ToolPolicy.build(roots=["/home/u"], rules={"read_file": Rule.NEVER}, protected=[HOME])
    assert p.judge("read_file", ["/home/u/notes.txt"]).verdict is Verdict.ALLOW
    assert p.judge("read_file", [f"{HOME}/face.token"]).verdict is Verdict.DENY


def test_other_proc_files_are_not_protected() -> None:
    p = policy(read_file=Rule.NEVER)
    assert p.judge("read_file", ["/proc/cpuinfo"]).verdict is Verdict.ALLOW
    assert p.judge("read_file", ["/proc/77/status"]).verdict is Verdict.ALLOW
    assert p.judge("read_file", ["/work/project/environ"]).verdict is Verdict.ALLOW


def test_a_mention_is_checked_for_protection_only() -> None:
    """exec_command's argument words: a protected one denies, an outside one
    does not make the call ask (a word is not necessarily a path)."""
    p = policy(exec_command=Rule.OUTSIDE_ROOTS)
    assert p.judge("exec_command", ["/work/project"], ["/usr/bin/ls"]).verdict is Verdict.ALLOW
    denied = p.judge("exec_command", ["/work/project"], [f"{HOME}/face.token"])
    assert denied.verdict is Verdict.DENY


def test_decision_permits_allow_always_ask_only_when_approved() -> None:
    assert Decision(Verdict.ALLOW, "").permits(approved=False)
    assert not Decision(Verdict.ASK, "").permits(approved=False)
    assert Decision(Verdict.ASK, "").permits(approved=True)
    assert not Decision(Verdict.DENY, "", FORBIDDEN_PATH).permits(approved=True)


def test_mind_floor_turns_allow_into_ask_and_never_lowers_anything() -> None:
    allow = Decision(Verdict.ALLOW, "inside the roots")
    assert with_floor(allow, "read_file", required=True).verdict is Verdict.ASK
    assert with_floor(allow, "read_file", required=False) == allow
    ask = Decision(Verdict.ASK, "outside")
    assert with_floor(ask, "read_file", required=True) == ask
    deny = Decision(Verdict.DENY, "protected", FORBIDDEN_PATH)
    assert with_floor(deny, "read_file", required=True) == deny


def test_parse_rule_and_approval_spec() -> None:
    assert parse_rule("outside_roots") is Rule.OUTSIDE_ROOTS
    assert parse_approval("read_file=always") == ("read_file", Rule.ALWAYS)
    assert parse_approval(" exec_command = never ") == ("exec_command", Rule.NEVER)
    for bad in ("read_file", "=always", "read_file=sometimes", "read_file=", ""):
        with pytest.raises(ValueError, match=r"TOOL=RULE|rule"):
            parse_approval(bad)


def test_advertised_policy_is_plain_data() -> None:
    p = policy(read_file=Rule.ALWAYS)
    assert p.advertised() == {
        "roots": ["/work/project"],
        "rules": {"exec_command": "always", "read_file": "always"},
    }
