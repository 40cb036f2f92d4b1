"""``halfpi mind --agent openai`` as a user meets it: real processes, a fake
model server on 127.0.0.1. A provider that cannot start is one line; one
that cannot be reached is one warning line at start-up and a clear chat
failure; the API key is never logged, stored or sent to a Face."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.test_cli import EXIT_FAILURE, EXIT_USAGE, halfpi, one_line_error
from tests.support.client import FaceClient
from tests.support.fake_openai import MODEL, FakeModel, Reply, text
from tests.support.mind import MindProcess
from tests.support.wait import until

pytestmark = pytest.mark.e2e

KEY = "sk-proj-never-anywhere-0123456789abcdef"


@pytest.fixture
async def model() -> AsyncIterator[FakeModel]:
    async with FakeModel() as fake:
        yield fake


def home_with(tmp_path: Path, settings: str = "") -> Path:
    home = tmp_path / "home"
    home.mkdir()
    if settings:
        (home / "agent.toml").write_text(settings)
    return home


@pytest.mark.parametrize(
    ("args", "settings", "code", "words"),
    [
        (("--agent", "openai"), "", EXIT_USAGE, ("needs a model", "--model")),
        (("--agent", "openai", "--model", "gpt-x"), "", EXIT_FAILURE,
         ("no API key", "OPENAI_API_KEY", "openai.key")),
        (("--model", "gpt-x"), "", EXIT_USAGE, ("--agent openai",)),
        (("--agent", "openai", "--base-url", "localhost:8080"), "", EXIT_USAGE,
         ("--base-url", "http")),
        ((), 'agent = "openai"\n[openai]\nmodel = "m"\nstep_limt = 3\n', EXIT_FAILURE,
         ("agent.toml", "step_limt")),
        ((), 'agent = "openai"\n[openai]\nmodel = "m"\nstep_limit = 0\n', EXIT_FAILURE,
         ("agent.toml", "step_limit", ">= 1")),
        ((), 'agent = "robot"\n', EXIT_FAILURE, ("agent.toml", "robot")),
        ((), "agent = [\n", EXIT_FAILURE, ("agent.toml", "TOML")),
    ],
    ids=["no_model", "no_key", "model_without_agent", "base_url_not_a_url", "unknown_setting",
         "bad_value", "unknown_agent", "not_toml"],
)
def test_a_provider_that_cannot_start_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], settings: str,
    code: int, words: tuple[str, ...],
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    home = home_with(tmp_path, settings)
    done = halfpi("mind", "--port", "0", "--home", str(home), *args)
    one_line_error(done, code, *words)
    assert not (home / "mind.json").exists()


def test_a_key_file_others_can_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    home = home_with(tmp_path)
    key_file = home / "openai.key"
    key_file.write_text(KEY)
    key_file.chmod(0o644)
    done = halfpi("mind", "--port", "0", "--home", str(home), "--agent", "openai",
                  "--model", "gpt-x")
    line = one_line_error(done, EXIT_FAILURE, "openai.key", "chmod 600")
    assert KEY not in line


async def test_an_unreachable_model_server_is_a_warning_at_start_and_a_clear_chat_failure(
    tmp_path: Path, model: FakeModel
) -> None:
    port = model.port
    await model.stop()  # nothing listens there any more
    home = home_with(tmp_path, "[openai]\nretries = 1\n")
    mind = MindProcess(home, extra_args=("--agent", "openai", "--model", MODEL, "--base-url",
                                         f"http://127.0.0.1:{port}/v1"))
    mind.start()
    try:
        await until(lambda: "could not be reached" in mind.log())
        warnings = [line for line in mind.log().splitlines() if "could not be reached" in line]
        assert len(warnings) == 1 and "Traceback" not in mind.log()
        face = await FaceClient.connect(mind.url, mind.token)
        cid = await face.create_conversation()
        result = await face.chat_to_end(cid, "anyone there?", "q1")
        assert result["payload"]["status"] == "failed"
        assert result["payload"]["error_code"] == "provider_error"
        assert "could not be reached" in result["payload"]["data"]["reason"]
        await face.close()
    finally:
        mind.kill()


async def test_the_key_is_sent_to_the_model_only_never_logged_stored_or_shown(
    tmp_path: Path, model: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    model.script(Reply(status=401, message=f"Incorrect API key provided: {KEY}",
                       code="invalid_api_key"))
    home = home_with(tmp_path)
    mind = MindProcess(home, extra_args=("--agent", "openai", "--model", MODEL, "--base-url",
                                         model.base_url, "--log-level", "debug"))
    mind.start()
    try:
        face = await FaceClient.connect(mind.url, mind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid)
        refused = await face.chat_to_end(cid, "hello", "q1")
        assert refused["payload"]["error_code"] == "provider_unauthorized"
        assert model.requests[0].headers["authorization"] == f"Bearer {KEY}"
        snap = await face.reply(await face.command("face.conversation.snapshot",
                                                   conversation_id=cid))
        assert snap["payload"]["messages"][-1]["error_code"] == "provider_unauthorized"
        assert all(KEY not in json.dumps(frame) for frame in face.seen)
        await face.close()
    finally:
        mind.kill()
    assert KEY not in mind.log()
    for path in home.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("where", ["relative", "absolute"])
async def test_the_key_comes_from_api_key_file_relative_or_absolute_over_the_environment(
    tmp_path: Path, model: FakeModel, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """``--api-key-file PATH``, the preferred way: a relative PATH is taken
    from where ``halfpi mind`` runs (the test's directory, its parent of the
    home), an absolute one as it is; it wins over ``$OPENAI_API_KEY``."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one-0123456789")
    model.script(Reply(text("hi")))
    home = home_with(tmp_path)
    key_file = tmp_path / "keys" / "provider.key"
    key_file.parent.mkdir()
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    path = "keys/provider.key" if where == "relative" else str(key_file)
    mind = MindProcess(home, extra_args=("--agent", "openai", "--model", MODEL, "--base-url",
                                         model.base_url, "--api-key-file", path))
    mind.start()
    try:
        face = await FaceClient.connect(mind.url, mind.token)
        cid = await face.create_conversation()
        answered = await face.chat_to_end(cid, "hello", "q1")
        assert answered["payload"]["status"] == "succeeded", answered
        assert model.requests[0].headers["authorization"] == f"Bearer {KEY}"
        assert KEY not in mind.log()
        await face.close()
    finally:
        mind.kill()


@pytest.mark.parametrize(
    ("mode", "args", "code", "words"),
    [
        (0o644, ("--agent", "openai", "--model", "gpt-x"), EXIT_FAILURE,
         ("provider.key", "readable by others", "chmod 600")),
        (0o600, ("--agent", "openai", "--model", "gpt-x", "--api-key-file", "missing.key"),
         EXIT_FAILURE, ("missing.key", "does not exist")),
        (0o600, (), EXIT_USAGE, ("--api-key-file", "--agent openai")),
    ],
    ids=["others_can_read", "missing", "without_agent_openai"],
)
def test_a_bad_api_key_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int, args: tuple[str, ...],
    code: int, words: tuple[str, ...],
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-a-fallback-0123456789")
    home = home_with(tmp_path)
    key_file = tmp_path / "provider.key"
    key_file.write_text(KEY)
    key_file.chmod(mode)
    if "--api-key-file" not in args:
        args = (*args, "--api-key-file", str(key_file))
    done = halfpi("mind", "--port", "0", "--home", str(home), *args)
    line = one_line_error(done, code, *words)
    assert KEY not in line
    assert not (home / "mind.json").exists()
