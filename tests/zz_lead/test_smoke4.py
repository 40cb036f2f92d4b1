import asyncio
from pathlib import Path
from tests.support.cluster import running_cluster

async def test_redis_restart(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "cluster", ("a", "b"), local_hand=False) as cluster:
        fa = await cluster.face("a")
        fb = await cluster.face("b")
        cid = await fa.create_conversation()
        await fa.subscribe(cid, snapshot=True)
        await fb.subscribe(cid, snapshot=True)
        r = await fb.chat_to_end(cid, "/pace 10 one two three", "q1")
        await cluster.restart_redis()
        r = await fb.chat_to_end(cid, "/pace 10 four five six", "q2", timeout=30) if "timeout" in fb.chat_to_end.__code__.co_varnames else await fb.chat_to_end(cid, "/pace 10 four five six", "q2")
        print("R2", r)
        await asyncio.sleep(2)
        print([(f["type"], f["payload"].get("seq"), f["payload"].get("type"), f["payload"].get("reason"), f["payload"].get("cursor"), f["payload"].get("heads")) for f in fb.seen if f["type"] != "face.chat.delta"])
        print(await cluster.events(cid))
        print(cluster.logs()[-4000:])
        assert 0
