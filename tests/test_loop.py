"""The event loop a Mind runs on (``halfpi.loop``): asyncio's own by
default, uvloop only when ``HALFPI_LOOP`` asks for it."""

from __future__ import annotations

import asyncio
import sys

import pytest

from halfpi import loop


async def loop_class() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_the_default_loop_is_asyncios_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HALFPI_LOOP", raising=False)
    assert loop.chosen() == "asyncio"
    assert loop.run(loop_class()).startswith("asyncio")


def test_HALFPI_LOOP_uvloop_runs_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.setenv("HALFPI_LOOP", "uvloop")
    assert loop.run(loop_class()).startswith("uvloop")


def test_asking_for_a_missing_uvloop_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALFPI_LOOP", "uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    with pytest.raises(RuntimeError, match=r"pip install 'halfpi\[uvloop\]'"):
        loop.run(loop_class())


def test_an_unknown_loop_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALFPI_LOOP", "trio")
    with pytest.raises(ValueError, match="HALFPI_LOOP is one of asyncio, uvloop"):
        loop.chosen()
