"""A transport only moves frames (STYLE; DESIGN §9): decode, authenticate and
authorise, call the Mind API, encode. Nothing under ``halfpi.gateway``
imports the store or the journal, or touches the Mind's store, journal,
request registry, approvals, actors or an actor's internals — those are the
Mind's, behind ``mind/api.py``, so every transport shares them.

Modules are parsed, not imported (like ``tests/core/test_purity.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import halfpi.gateway
from tests.core.test_purity import imported_modules
from tests.support.source import parse

GATEWAY_DIR = Path(halfpi.gateway.__file__).resolve().parent
GATEWAY_MODULES = sorted(GATEWAY_DIR.rglob("*.py"))

FORBIDDEN_IMPORTS = (
    "halfpi.store",
    "halfpi.journal",
    "halfpi.mind.actor",
    "halfpi.mind.registry",
    "halfpi.mind.approvals",
    "halfpi.mind.tools",
)
# The Mind's state and an actor's internals: reached only through the Mind API.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "store",
        "journal",
        "registry",
        "approvals",
        "env",
        "_actors",
        "actor",
        "subscribers",
        "visible_chat_runs",
        "visible_approvals",
        "visible_tool_runs",
        "add_listener",
        "remove_listener",
    }
)


def reaches(source: str, package: str = "halfpi.gateway") -> list[str]:
    """What ``source`` (a module of ``package``) reaches that a transport must not."""
    tree = parse(source)
    found = sorted(
        {
            m
            for m in imported_modules(tree, package)
            if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_IMPORTS)
        }
    )
    found += [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES
    ]
    return found


def test_the_gateway_package_has_its_modules() -> None:
    assert {"session", "native", "hand_session"} <= {p.stem for p in GATEWAY_MODULES}


@pytest.mark.parametrize(
    "path", GATEWAY_MODULES, ids=lambda p: str(p.relative_to(GATEWAY_DIR))
)
def test_a_transport_module_does_not_reach_into_the_mind(path: Path) -> None:
    assert reaches(path.read_text()) == []


# -- the check itself can fail ---------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from halfpi.store.base import WriteTx", [
            "halfpi.store.base", "halfpi.store.base.WriteTx"]),
        ("from halfpi.journal import memory", ["halfpi.journal", "halfpi.journal.memory"]),
        ("from ..mind.actor import ConversationActor", [
            "halfpi.mind.actor", "halfpi.mind.actor.ConversationActor"]),
        ("batch = self.mind.journal.read_after(c, 0, 9)", ["line 1: .journal"]),
        ("await s.mind.store.write(tx)", ["line 1: .store"]),
        ("actor.subscribers[self] = sub", ["line 1: .subscribers"]),
        ("a = await self.mind.actor(cid)", ["line 1: .actor"]),
        ("self.mind.registry.attach(k, self)", ["line 1: .registry"]),
    ],
)
def test_reaching_into_the_mind_is_found(source: str, expected: list[str]) -> None:
    assert reaches(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "from halfpi.mind import api",
        "await api.handle(self.mind, self, type_, payload)",
        "self.subscriptions = mind.subscriptions_for(self)",
        "self.mind.hands.on_result(self, message)",
        "from halfpi.core.events import Error",
    ],
)
def test_the_mind_api_and_the_hand_registry_pass(source: str) -> None:
    assert reaches(source) == []
