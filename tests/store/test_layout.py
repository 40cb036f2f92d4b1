"""The store package keeps each module's private names to itself (STYLE:
"A module's ``_private`` names stay in it"): a module imports only public
names from another, and reaches no ``_name`` through an imported module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import halfpi.store
from tests.support.source import parse

STORE_DIR = Path(halfpi.store.__file__).resolve().parent
MODULES = sorted(STORE_DIR.glob("*.py"))


def private_uses(source: str) -> list[str]:
    """``_names`` that ``source`` takes from other halfpi modules."""
    tree = parse(source)
    found: list[str] = []
    modules: set[str] = set()  # local names bound to imported modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("halfpi"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}.{alias.name}")
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("halfpi"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_check_sees_private_imports_and_attributes() -> None:
    source = (
        "from halfpi.store.sqlite_sql import _from_row, apply_tx\n"
        "from halfpi.store import sqlite_sql as sql\n"
        "sql._TOOL_RUN_FIELDS\nsql.apply_tx\nself._queue\n"
    )
    assert private_uses(source) == [
        "halfpi.store.sqlite_sql._from_row",
        "sql._TOOL_RUN_FIELDS",
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_store_module_uses_no_private_name_of_another(path: Path) -> None:
    assert private_uses(path.read_text()) == []
