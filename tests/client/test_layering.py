"""The client side's layering (STYLE: no wrong-way imports, Sans-I/O sessions).

The Hand does not import the Face SDK and the Face SDK does not import the
Hand: what both use lives in :mod:`halfpi.client`, which imports neither
(nor the Mind's side). The SDK's protocol logic — the session, the
outstanding table, the subscription tracker, the live lists, the reducer,
the redial plan — does no I/O and reads no clock, so it is tested by feeding
frames in and reading frames out. And the protocol numbers the SDK and the
Hand say in their hello come from the constants the Mind checks them
against, never from a literal.

Modules are parsed, not imported; every import is seen, lazy ones too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import halfpi
from tests.support.source import parse

SRC = Path(halfpi.__file__).resolve().parent


def modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def imported(path: Path) -> Iterator[str]:
    """Every module name ``path`` imports (relative imports resolved)."""
    relative = path.relative_to(SRC).with_suffix("")
    package = ["halfpi", *relative.parts[:-1]]
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def offending(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        {m for m in imported(path) for f in forbidden if m == f or m.startswith(f + ".")}
    )


def ids(path: Path) -> str:
    return str(path.relative_to(SRC))


@pytest.mark.parametrize("path", modules("hand"), ids=ids)
def test_the_hand_does_not_import_the_face_sdk(path: Path) -> None:
    assert offending(path, ("halfpi.face",)) == []


@pytest.mark.parametrize("path", modules("face"), ids=ids)
def test_the_face_sdk_does_not_import_the_hand(path: Path) -> None:
    assert offending(path, ("halfpi.hand", "halfpi.mind", "halfpi.gateway")) == []


def test_the_shared_client_package_exists() -> None:
    names = {p.stem for p in modules("client")}
    assert {"transport", "redial", "reconnect"} <= names


@pytest.mark.parametrize("path", modules("client"), ids=ids)
def test_the_shared_client_package_imports_neither_side(path: Path) -> None:
    forbidden = ("halfpi.face", "halfpi.hand", "halfpi.mind", "halfpi.gateway", "halfpi.store")
    assert offending(path, forbidden) == []


SANS_IO = ["face/protocol.py", "face/outstanding.py", "face/subscriptions.py",
           "face/lists.py", "face/view.py", "face/results.py", "face/errors.py", "face/events.py",
           "face/commands.py", "face/incoming.py", "client/redial.py", "client/errors.py"]
IO = ("asyncio", "socket", "selectors", "ssl", "threading", "time", "websockets",
      "halfpi.client.transport", "halfpi.client.reconnect")


@pytest.mark.parametrize("name", SANS_IO)
def test_the_sdk_protocol_logic_is_sans_io(name: str) -> None:
    assert offending(SRC / name, IO) == []


def literal_protocol_numbers(path: Path) -> list[int]:
    """Integer literals given as a ``protocol`` value: ``{"protocol": 3}``,
    ``protocol=3``."""
    found: list[int] = []
    for node in ast.walk(parse(path.read_text())):
        pairs: list[tuple[ast.expr | None, ast.expr]] = []
        if isinstance(node, ast.Dict):
            pairs += list(zip(node.keys, node.values, strict=True))
        elif isinstance(node, ast.Call):
            pairs += [(ast.Constant(k.arg), k.value) for k in node.keywords if k.arg]
        for key, value in pairs:
            if (
                isinstance(key, ast.Constant)
                and key.value == "protocol"
                and isinstance(value, ast.Constant)
                and isinstance(value.value, int)
            ):
                found.append(value.value)
    return found


@pytest.mark.parametrize("path", modules("face") + modules("hand") + modules("client"), ids=ids)
def test_hellos_take_the_protocol_version_from_the_shared_constant(path: Path) -> None:
    assert literal_protocol_numbers(path) == []


def test_a_literal_protocol_number_is_found(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('hello = {"token": t, "protocol": 3}\nf(protocol=2)\n')
    assert sorted(literal_protocol_numbers(source)) == [2, 3]
