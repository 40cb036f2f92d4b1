"""A missing optional package is one line naming its extra, wherever the
import fails (halfpi/extras.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from halfpi import cli
from halfpi.extras import EXTRA, MissingExtra, missing, need


class _Refuse:
    """A finder that refuses textual, as a machine without it would."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "textual":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_need_names_the_extra_of_a_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n.partition(".")[0] == "textual"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Refuse(), *sys.meta_path])
    with pytest.raises(MissingExtra) as caught:
        need("textual", "the terminal face")
    assert str(caught.value) == "the terminal face needs textual: pip install 'halfpi[face]'"


def test_every_optional_package_has_an_extra_in_pyproject() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for package, extra in EXTRA.items():
        assert any(req.startswith(package) for req in extras[extra]), (package, extra)
        assert not any(req.startswith(package) for req in project["dependencies"]), package


@pytest.mark.parametrize(("module", "extra"), [("redis.asyncio", "cluster"), ("openai", "openai"),
                                               ("asyncpg", "postgresql")])
def test_an_unguarded_import_of_an_extra_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    module: str, extra: str,
) -> None:
    def command(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    monkeypatch.setattr(cli, "cmd_mind", command)  # the import fails inside the command
    assert cli.main(["mind", "--home", str(tmp_path), "--port", "0"]) == 1
    package = module.partition(".")[0]
    assert capsys.readouterr().err == (
        f"halfpi: this command needs {package}: pip install 'halfpi[{extra}]'\n")


def test_a_missing_module_that_is_no_extra_is_a_bug_not_a_hint() -> None:
    assert missing(ModuleNotFoundError("No module named 'nope'", name="nope")) is None


def test_the_terminal_face_without_textual_names_the_extra_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    """`pip install halfpi` then `halfpi face` on a new home (no token yet,
    no terminal here): the line that names the extra comes first, before
    the token's or the terminal's — else the person fixes one, then meets
    the other."""
    for name in [n for n in sys.modules if n.partition(".")[0] == "textual"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Refuse(), *sys.meta_path])
    monkeypatch.delenv("HALFPI_TOKEN", raising=False)
    assert cli.main(["face", "--home", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        "halfpi: the terminal face needs textual: pip install 'halfpi[face]'\n")


class _RefuseAll:
    """A finder that refuses the given packages."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.mark.parametrize(("args", "line"), [
    (["--agent", "openai"],  # no model named either
     "halfpi: the model provider (--agent openai) needs openai: pip install 'halfpi[openai]'"),
    (["--store", "postgresql://u@127.0.0.1:1/db", "--redis", "redis://127.0.0.1:1"],  # no --node-id
     "halfpi: the PostgreSQL store (--store postgresql://…) needs asyncpg: "
     "pip install 'halfpi[postgresql]'"),
])
def test_a_mind_without_its_extra_names_the_extra_before_other_mistakes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    args: list[str], line: str,
) -> None:
    """The extra first: no other fix makes the feature run."""
    for name in [n for n in sys.modules if n.partition(".")[0] in ("openai", "asyncpg", "redis")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_RefuseAll("openai", "asyncpg", "redis"),
                                           *sys.meta_path])
    assert cli.main(["mind", "--home", str(tmp_path), "--port", "0", *args]) == 1
    assert capsys.readouterr().err == line + "\n"
