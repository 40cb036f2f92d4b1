"""Background tasks through the HTTP door: the same Mind API as the
WebSocket (``face.task.*`` as HTTP commands), on the embedded local Hand."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.support.http_door import Door, http_door, key
from tests.support.mind import hand_ready


async def tasks_of(door: Door) -> list[dict[str, Any]]:
    answer = await door.command("face.task.list", {})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["data"]["tasks"])


async def test_a_task_is_started_listed_read_and_cancelled_through_the_http_door(
    tmp_path: Path,
) -> None:
    async with http_door(tmp_path, hand_approval=(("exec_command", "never"),)) as (lmind, door):
        await hand_ready(lmind)
        cid = await door.create_conversation()
        args = {"argv": ["echo", "from a task"]}
        content = f"/task exec_command {json.dumps(args)}"
        chat = await door.command("face.chat", {"conversation_id": cid, "content": content},
                                  idempotency_key=key("chat"), wait=10)
        assert chat.status_code == 200, chat.text
        assert chat.json()["content"].startswith("task k_")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not [t for t in await tasks_of(door) if t["state"] == "succeeded"]:
            assert loop.time() < deadline, await tasks_of(door)
            await asyncio.sleep(0.05)
        (task,) = await tasks_of(door)
        assert (task["hand"], task["tool"], task["exit_code"], task["args"]) == (
            "local", "exec_command", 0, args)
        log = await door.command("face.task.log", {"task_id": task["task_id"]})
        assert log.status_code == 200, log.text
        assert log.json()["data"]["data"] == "from a task\n"
        cancel = await door.command("face.task.cancel", {"task_id": task["task_id"]},
                                    idempotency_key=key("cancel"), wait=10)
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["data"] == {"outcome": "already_finished",
                                         "task_id": task["task_id"],
                                         "target_status": "succeeded"}
        missing = await door.command("face.task.get", {"task_id": "k_none"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "task_not_found"
