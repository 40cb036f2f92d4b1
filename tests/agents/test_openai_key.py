"""Where the model provider's key comes from (docs/agent.md, "The key"): a
key file named by ``--api-key-file`` (or ``api_key_file``) first — the
preferred way, it keeps the key out of the Mind's environment —, then
``$OPENAI_API_KEY``, then ``HOME/openai.key``. A key file anyone but its
owner may read is refused with one line."""

from __future__ import annotations

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
