"""STYLE rule 1: nothing under ``halfpi.core`` does I/O or reads the clock.

Every module of the package is parsed (not imported) and its imports are
checked, including relative ones and ``importlib``/``__import__`` calls with
a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import halfpi.core
from tests.support.source import parse

FORBIDDEN = (
    "asyncio",
    "sqlite3",
    "socket",
    "selectors",
    "threading",
    "time",
    "halfpi.store",
    "halfpi.journal",
    "halfpi.mind",
    "halfpi.gateway",
)

CORE_DIR = Path(halfpi.core.__file__).resolve().parent
CORE_MODULES = sorted(CORE_DIR.rglob("*.py"))


def _is_forbidden(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in FORBIDDEN)


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imported_modules(tree: ast.AST, package: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if (
                name in {"import_module", "__import__"}
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                found.append(first.value)
    return found


def forbidden_imports(source: str, package: str = "halfpi.core") -> list[str]:
    """The forbidden modules ``source`` (a module of ``package``) imports."""
    return sorted({m for m in imported_modules(parse(source), package) if _is_forbidden(m)})


def test_the_core_package_has_modules() -> None:
    names = {p.stem for p in CORE_MODULES}
    assert {"cursor", "replay", "requests", "outbound", "states", "backoff", "wire"} <= names


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: str(p.relative_to(CORE_DIR)))
def test_core_module_is_sans_io(path: Path) -> None:
    relative = path.relative_to(CORE_DIR).with_suffix("")
    package = ".".join(["halfpi", "core", *relative.parts[:-1]])
    assert forbidden_imports(path.read_text(), package) == []


# -- the check itself can fail ---------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import asyncio", ["asyncio"]),
        ("import asyncio.events", ["asyncio.events"]),
        ("import sqlite3 as db", ["sqlite3"]),
        ("import os, socket", ["socket"]),
        ("from selectors import DefaultSelector", ["selectors", "selectors.DefaultSelector"]),
        ("import threading", ["threading"]),
        ("from time import monotonic", ["time", "time.monotonic"]),
        ("import time", ["time"]),
        (
            "from halfpi.store.sqlite import SQLiteStore",
            ["halfpi.store.sqlite", "halfpi.store.sqlite.SQLiteStore"],
        ),
        ("from halfpi import journal", ["halfpi.journal"]),
        ("from halfpi.mind import actor", ["halfpi.mind", "halfpi.mind.actor"]),
        ("import halfpi.gateway.session", ["halfpi.gateway.session"]),
        ("from ..store import base", ["halfpi.store", "halfpi.store.base"]),
        ("from .. import mind", ["halfpi.mind"]),
        ("def f():\n    import asyncio\n", ["asyncio"]),
        ("if TYPE_CHECKING:\n    from asyncio import Future\n", ["asyncio", "asyncio.Future"]),
        ("import importlib\nimportlib.import_module('sqlite3')", ["sqlite3"]),
        ("__import__('time')", ["time"]),
    ],
)
def test_forbidden_imports_are_found(source: str, expected: list[str]) -> None:
    assert forbidden_imports(source) == sorted(expected)


@pytest.mark.parametrize(
    "source",
    [
        "import timeit",
        "import random, os, hashlib",
        "import socketserver_like",
        "from halfpi.errors import InvalidRequest",
        "from halfpi.config import QueueLimits",
        "from halfpi.core.cursor import Cursor",
        "from . import cursor",
        "from .outbound import Message",
        "import halfpi.storefront",
        "x = 'import asyncio'",
    ],
)
def test_allowed_imports_pass(source: str) -> None:
    assert forbidden_imports(source) == []


def test_a_synthetic_impure_core_module_fails_the_check() -> None:
    impure = '"""Looks harmless."""\nfrom __future__ import annotations\n\nimport time\n'
    assert forbidden_imports(impure) == ["time"]
    with pytest.raises(AssertionError):
        assert forbidden_imports(impure) == []
