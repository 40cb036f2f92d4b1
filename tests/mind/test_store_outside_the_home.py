"""A Store kept outside the Mind's home (``--store sqlite:///PATH``) is as
unreachable by tools as the home itself (DESIGN §8): the local Hand refuses
its files, and every Hand is told to protect them in ``hand.welcome``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.cli import halfpi_cli
from tests.support.client import FaceClient
from tests.support.frames import events_of
from tests.support.hand import hello_payload
from tests.support.mind import hand_ready, local_mind


async def test_the_local_hand_never_reads_a_database_kept_outside_the_home(
    tmp_path: Path,
) -> None:
    db = tmp_path / "data" / "minds.db"
    async with local_mind(tmp_path / "home", store_url=f"sqlite://{db}",
                          hand_roots=(str(tmp_path),),
                          hand_approval=(("read_file", "never"),)) as lmind:
        assert not (tmp_path / "home" / "halfpi.db").exists()
        assert db.exists()
        await hand_ready(lmind)
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation("store")
        await face.subscribe(cid, detail_mode="transparent")
        for target in (db, db.with_name("minds.db-wal")):
            await face.chat_to_end(cid, "/tool read_file " + json.dumps({"path": str(target)}))
        completed = events_of(face.seen, "chat.tool_completed")
        assert [c["payload"]["data"]["error_category"] for c in completed] == [
            "forbidden_path",
            "forbidden_path",
        ], completed
        await face.close()


async def test_a_hands_welcome_names_the_database_kept_outside_the_home(tmp_path: Path) -> None:
    db = tmp_path / "data" / "minds.db"
    async with local_mind(tmp_path / "home", store_url=f"sqlite://{db}",
                          local_hand=False) as lmind:
        home = str(lmind.config.home)
        run = await halfpi_cli("hand", "add", "raw", "--home", home, "--store", f"sqlite://{db}")
        assert run.returncode == 0, run.stderr
        await lmind.mind.refresh_credentials()
        hand = await FaceClient.connect(f"ws://127.0.0.1:{lmind.server.port}/v1/hand",
                                        hello=False)
        await hand.send("hand.hello", hello_payload(run.stdout.strip(), "raw",
                                                    os.urandom(8).hex()))
        welcome = await hand.expect(lambda f: f["type"] == "hand.welcome")
        protected = welcome["payload"]["protect"]
        assert str(lmind.config.home.resolve()) in protected
        assert str(db.resolve()) in protected
        assert str(db.with_name("minds.db-wal").resolve()) in protected
        await hand.close()
