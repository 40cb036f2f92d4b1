"""Where the model provider's key comes from (docs/agent.md, "The key"): a
key file named by ``--api-key-file`` (or ``api_key_file``) first — the
preferred way, it keeps the key out of the Mind's environment —, then
``$OPENAI_API_KEY``, then ``HOME/openai.key``. A key file anyone but its
owner may read is refused with one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from halfpi.agents.openai import AgentConfigError, read_key
from halfpi.config import Config, ModelSettings

FILE_KEY = "sk-from-the-file-0123456789"
ENV_KEY = "sk-from-the-environment-0123456789"


def key_file(path: Path, key: str = FILE_KEY, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(key + "\n")
    path.chmod(mode)
    return path


def config(tmp_path: Path) -> Config:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return Config(home=home)


def test_a_named_key_file_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    path = key_file(tmp_path / "keys" / "provider.key")
    settings = ModelSettings(model="m", api_key_file=str(path))
    assert read_key(config(tmp_path), settings) == FILE_KEY


def test_the_environment_still_works_without_a_named_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    key_file(tmp_path / "home" / "openai.key")  # the default file: the environment wins
    assert read_key(config(tmp_path), ModelSettings(model="m")) == ENV_KEY


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_named_key_file_others_may_read_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)  # no fallback to it either
    path = key_file(tmp_path / "provider.key", mode=mode)
    with pytest.raises(AgentConfigError) as refused:
        read_key(config(tmp_path), ModelSettings(model="m", api_key_file=str(path)))
    line = str(refused.value)
    assert "\n" not in line and "chmod 600" in line and str(path) in line
    assert FILE_KEY not in line


def test_a_key_file_that_is_not_a_regular_file_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipe (``--api-key-file <(pass show key)``) gives its key once: the
    provider would have it, the redaction of tool output (which reads the
    file again) would not, and the key could leave through a tool. It is
    refused with one line, as a directory is."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, FILE_KEY.encode() + b"\n")
        os.close(write_end)
        for path in (f"/dev/fd/{read_end}", str(tmp_path)):
            with pytest.raises(AgentConfigError) as refused:
                read_key(config(tmp_path), ModelSettings(model="m", api_key_file=path))
            line = str(refused.value)
            assert "\n" not in line and "not a regular file" in line and path in line
            assert FILE_KEY not in line
    finally:
        os.close(read_end)
