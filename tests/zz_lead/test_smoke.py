import asyncio
from pathlib import Path
from tests.support.cluster import running_cluster

async def test_smoke(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "cluster", ("a", "b"), local_hand=False) as cluster:
        fa = await cluster.face("a")
        fb = await cluster.face("b")
        cid = await fa.create_conversation()
        await fa.subscribe(cid, snapshot=True)
        await fb.subscribe(cid, snapshot=True)
        r = await fb.chat_to_end(cid, "/pace 10 hello there world", "q1")
        print("RESULT", r)
        await asyncio.sleep(0.5)
        for fr in fb.seen:
            print("B", fr["type"], {k: v for k, v in fr["payload"].items() if k in ("seq", "text", "type", "replay")})
        for fr in fa.seen:
            print("A", fr["type"], {k: v for k, v in fr["payload"].items() if k in ("seq", "text", "type")})
        print(await cluster.events(cid))
        print(await cluster.lease_holder(cid))
        print(cluster.logs())
        assert 0
