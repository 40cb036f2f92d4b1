"""STYLE: a module's ``_private`` names stay in it.

Every module under ``src/halfpi`` is parsed (not imported). A module may not
import a ``_name`` from another halfpi module, nor read ``x._name`` of
anything but itself (``self``, ``cls``, ``super()``): when another module
needs something, its owner gives it a public name. Dunders are public.

The standard library's documented functions that carry an underscore
(``os._exit``: leave a forked child at once) are public by their docs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import halfpi
from tests.support.source import parse

SRC = Path(halfpi.__file__).resolve().parent
MODULES = sorted(SRC.rglob("*.py"))
OWN = {"self", "cls"}
DOCUMENTED = {"os._exit"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_own(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in OWN
    # super()._x: the object's own (inherited) name.
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
    )


def private_uses(source: str) -> list[str]:
    """Every use in ``source`` of another module's private name."""
    found: list[str] = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or (node.module or "").split(".")[0] == "halfpi"
            if ours:
                module = "." * node.level + (node.module or "")
                found += [
                    f"line {node.lineno}: from {module} import {alias.name}"
                    for alias in node.names
                    if _private(alias.name)
                ]
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.split(".")[0] == "halfpi"
                and any(_private(part) for part in alias.name.split("."))
            ]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and not _is_own(node.value):
            text = ast.unparse(node)
            if text not in DOCUMENTED:
                found.append(f"line {node.lineno}: {text}")
    return found


def test_the_check_covers_the_packages() -> None:
    packages = {p.relative_to(SRC).parts[0] for p in MODULES}
    assert {"core", "mind", "gateway", "face", "hand", "agents", "journal", "store"} <= packages


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_uses_another_modules_private_names(path: Path) -> None:
    assert private_uses(path.read_text()) == []


# -- the check itself can fail ---------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("actor._event('x', {}, 0)", ["line 1: actor._event"]),
        ("message, _ = host.actor._commit(tx)", ["line 1: host.actor._commit"]),
        ("if lock._waiters: pass", ["line 1: lock._waiters"]),
        ("from halfpi.store.sqlite_sql import _from_row", [
            "line 1: from halfpi.store.sqlite_sql import _from_row"]),
        ("from .sqlite_sql import _RUN_COLUMNS, ok", [
            "line 1: from .sqlite_sql import _RUN_COLUMNS"]),
        ("import halfpi.core._hidden", ["line 1: import halfpi.core._hidden"]),
        ("def f(s):\n    return s._drop_subscription('c')\n", ["line 2: s._drop_subscription"]),
    ],
)
def test_private_uses_are_found(source: str, expected: list[str]) -> None:
    assert private_uses(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "self._event('x')",
        "cls._cache.clear()",
        "super()._reset()",
        "x.__class__.__name__",
        "from halfpi.core.events import Accepted",
        "from typing import _SpecialForm",  # not a halfpi module
        "from ._helpers import public",  # a private module's public name is a module matter
        "_local = 1\nprint(_local)",
    ],
)
def test_own_and_public_names_pass(source: str) -> None:
    assert private_uses(source) == []
