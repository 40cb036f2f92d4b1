"""Tokens are never logged (not by the Mind, the SDK, the Hand, or the WebSocket
library underneath), even with every logger at DEBUG."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from halfpi.face.client import FaceClient
from tests.support.mind import local_mind


async def test_tokens_never_reach_the_logs(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with local_mind(tmp_path / "home") as lm:
        async with FaceClient(lm.url, lm.token) as client:
            conversation = await client.create_conversation("logs")
            assert (await client.ask(conversation, "hello")).ok
        hand_token = lm.config.hand_token_path.read_text().strip()
        face_token = lm.token
    text = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records)
    assert caplog.records, "nothing was captured: the check would be empty"
    for token in (face_token, hand_token):
        secret = token.split("_", 1)[1]
        for fragment in (secret[:12], secret[-12:]):
            assert fragment not in text
