"""The tool policy (DESIGN §8): which tool calls run, which ask a human, which never run.

Pure rules over paths that are *already resolved* (``realpath``, symlinks
followed): resolving them needs the Hand's filesystem and is done by
``halfpi.hand.policy``; asking a human is the Mind's job. This module only
decides.

- Per tool an approval **rule**: ``always`` (ask every time), ``outside_roots``
  (ask only when a path the call names lies outside the Hand's roots),
  ``never`` (run without asking).
- Per Hand a set of **roots** (default: the Hand's working directory).
- **Protected paths** are refused whatever the rule and whatever a human
  decided: halfpi's homes (the Mind's, the Hand's), every file named like a
  halfpi credential or database anywhere, the Hand's own ``/proc`` entries,
  and any process's environment, memory and command line under ``/proc``.

A verdict is ``allow`` | ``ask`` | ``deny`` with a reason a person can read.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


class Rule(enum.StrEnum):
    ALWAYS = "always"
    OUTSIDE_ROOTS = "outside_roots"
    NEVER = "never"


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


# The ``error_category`` of a tool call refused by the policy.
FORBIDDEN_PATH = "forbidden_path"
# The Hand refused a run that needed an approval it was not given.
APPROVAL_REQUIRED = "approval_required"

DEFAULT_RULES: Mapping[str, Rule] = MappingProxyType(
    {"exec_command": Rule.ALWAYS, "read_file": Rule.OUTSIDE_ROOTS}
)
# A tool nobody wrote a rule for asks: the safe default.
UNKNOWN_TOOL_RULE = Rule.ALWAYS

# Files halfpi writes that hold credentials or everything the Mind knows.
# Refused under any directory: another Mind's home may be on the same machine.
CREDENTIAL_NAMES = frozenset(
    {
        "face.token",
        "hand.token",
        "stream.key",  # seals SSE resume tokens and their grants (docs/protocol.md §17)
        "halfpi.db",
        "halfpi.db-wal",
        "halfpi.db-shm",
        "halfpi.db-journal",
    }
)
# Under /proc/<pid> (or /proc/<pid>/task/<tid>): what may hold any process's
# secrets (a token or an API key in its environment or on its command line).
PROC_SECRETS = frozenset({"environ", "mem", "cmdline"})


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str
    category: str | None = None  # why a ``deny`` denies (an ``error_category``)

    def permits(self, *, approved: bool) -> bool:
        """Whether a run may go ahead, given whether a human approved it."""
        if self.verdict is Verdict.ALLOW:
            return True
        return self.verdict is Verdict.ASK and approved

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"verdict": self.verdict.value, "reason": self.reason}
        if self.category is not None:
            wire["category"] = self.category
        return wire


def parse_rule(text: str) -> Rule:
    try:
        return Rule(text.strip())
    except ValueError:
        choices = ", ".join(r.value for r in Rule)
        raise ValueError(f"unknown approval rule {text.strip()!r} (use {choices})") from None


def parse_approval(spec: str) -> tuple[str, Rule]:
    """``TOOL=RULE`` (as given to ``--approval``) → ``(tool, rule)``."""
    tool, sep, rule = spec.partition("=")
    if not sep or not tool.strip() or not rule.strip():
        raise ValueError(f"expected TOOL=RULE, got {spec!r}")
    return tool.strip(), parse_rule(rule)


def is_within(path: str, root: str) -> bool:
    """Whether absolute, normalised ``path`` is ``root`` or below it (by
    path component: ``/a/bc`` is not within ``/a/b``)."""
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/") or root == ""


def with_floor(decision: Decision, tool: str, *, required: bool) -> Decision:
    """The Mind's floor: where its operator requires approval for ``tool``,
    an ``allow`` becomes ``ask``. A floor never lowers a verdict."""
    if required and decision.verdict is Verdict.ALLOW:
        return Decision(Verdict.ASK, f"this Mind requires approval for {tool}")
    return decision


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """One Hand's policy: its roots, its rules, what no tool may reach."""

    roots: tuple[str, ...]
    rules: tuple[tuple[str, Rule], ...] = ()
    protected: tuple[str, ...] = ()
    pid: int | None = None  # the Hand's own process id (/proc/<pid>)

    @classmethod
    def build(
        cls,
        roots: Iterable[str],
        rules: Mapping[str, Rule] | None = None,
        protected: Iterable[str] = (),
        pid: int | None = None,
    ) -> ToolPolicy:
        merged = {**DEFAULT_RULES, **(rules or {})}
        return cls(
            tuple(dict.fromkeys(roots)),
            tuple(sorted(merged.items())),
            tuple(dict.fromkeys(protected)),
            pid,
        )

    def rule(self, tool: str) -> Rule:
        return dict(self.rules).get(tool, UNKNOWN_TOOL_RULE)

    def protection(self, path: str) -> str | None:
        """Why ``path`` is protected, or None."""
        for place in self.protected:
            if is_within(path, place):
                return f"{path} is protected (inside {place})"
        name = path.rpartition("/")[2]
        if name in CREDENTIAL_NAMES:
            return f"{path} is protected (a halfpi credential or database file)"
        if path == "/proc" or not path.startswith("/proc/"):
            return None
        parts = path.split("/")  # ["", "proc", <entry>, ...]
        entry = parts[2]
        if entry in ("self", "thread-self") or (self.pid is not None and entry == str(self.pid)):
            return f"{path} is protected (the Hand's own process)"
        if entry.isdigit() and parts[-1] in PROC_SECRETS:
            return f"{path} is protected (a process's environment, memory or command line)"
        return None

    def judge(
        self, tool: str, paths: Sequence[str] = (), mentions: Sequence[str] = ()
    ) -> Decision:
        """The verdict for a call of ``tool`` that works on ``paths`` (checked
        against protection and the roots) and mentions ``mentions`` (checked
        against protection only: an argument word is not surely a path)."""
        for path in (*paths, *mentions):
            reason = self.protection(path)
            if reason is not None:
                return Decision(Verdict.DENY, reason, FORBIDDEN_PATH)
        rule = self.rule(tool)
        if rule is Rule.NEVER:
            return Decision(Verdict.ALLOW, f"{tool} needs no approval on this Hand")
        if rule is Rule.ALWAYS:
            return Decision(Verdict.ASK, f"{tool} always needs approval on this Hand")
        for path in paths:
            if not any(is_within(path, root) for root in self.roots):
                return Decision(Verdict.ASK, f"{path} is outside this Hand's roots")
        return Decision(Verdict.ALLOW, "inside this Hand's roots")

    def advertised(self) -> dict[str, Any]:
        """What the Hand tells the Mind (``hand.hello``), and Faces see."""
        return {"roots": list(self.roots), "rules": {t: r.value for t, r in self.rules}}
