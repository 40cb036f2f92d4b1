"""Everything halfpi writes under its home is its owner's only (0700/0600),
created that way whatever the umask: the database, tokens, the Hand's record
of running commands."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tests.support.client import FaceClient
from tests.support.mind import hand_ready, local_mind


def exposed(home: Path) -> list[str]:
    found = []
    for path in [home, *home.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_IMODE(mode) & 0o077:
            found.append(f"{path.relative_to(home.parent)} {stat.filemode(mode)}")
    return found


async def test_the_home_is_private_after_the_local_hand_ran_a_command(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = os.umask(0)  # the most permissive: nothing may depend on it
    try:
        async with local_mind(home, approval_required=(),
                              hand_approval=(("exec_command", "never"),)) as lmind:
            await hand_ready(lmind)
            face = await FaceClient.connect(lmind.url, lmind.token)
            cid = await face.create_conversation()
            await face.subscribe(cid)
            command = json.dumps({"command": f"echo $$ > {tmp_path / 'ran'}; sleep 0.2"})
            result = await face.chat_to_end(cid, "/tool exec_command " + command)
            assert "exec_command succeeded" in result["payload"]["content"], result
            await face.close()
            during = exposed(home)
    finally:
        os.umask(old)
    assert (tmp_path / "ran").exists()
    assert (home / "hands" / "local.runs.json").exists(), sorted(home.rglob("*"))
    assert during == [] and exposed(home) == []
