"""Streamed tool output is cut between UTF-8 characters, never inside one (DESIGN §6)."""

from __future__ import annotations

import json
import sys

from tests.support.client import FaceClient, approve_next
from tests.support.frames import event
from tests.support.mind import LocalMind, hand_ready

EURO_PROGRAM = "import sys; sys.stdout.buffer.write(('\\u20ac' * 6000).encode())"


async def test_progress_does_not_corrupt_multibyte_output(lmind: LocalMind) -> None:
    await hand_ready(lmind)
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    args = {"argv": [sys.executable, "-c", EURO_PROGRAM]}
    chat_id = await face.command(
        "face.chat", conversation_id=cid, content="/tool exec_command " + json.dumps(args)
    )
    await approve_next(face, chat_id)
    done = await face.expect(event("chat.tool_completed", request_id=chat_id), timeout=20)
    assert done["payload"]["data"]["result"]["stdout"] == "\u20ac" * 6000  # the result is right
    streamed = "".join(
        f["payload"]["data"] for f in face.seen if f["type"] == "face.chat.tool.progress"
    )
    assert "\ufffd" not in streamed
    assert streamed == "\u20ac" * 6000
    await face.reply(chat_id)
    await face.close()
