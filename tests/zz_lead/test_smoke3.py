import asyncio
from pathlib import Path
from tests.support.cluster import running_cluster

async def test_pause(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "cluster", ("a", "b"), local_hand=False) as cluster:
        fa = await cluster.face("a")
        fb = await cluster.face("b")
        cid = await fa.create_conversation()
        await fa.subscribe(cid, snapshot=True)
        await fb.subscribe(cid, snapshot=True)
        print("HOLDER0", await cluster.lease_holder(cid))
        await fb.command("face.chat", "q1", conversation_id=cid, content="/pace 30 " + " ".join(f"w{i}" for i in range(100)))
        await fb.expect(lambda f: f["type"] == "face.chat.delta" and f["payload"]["seq"] > 8)
        cluster["a"].pause()
        end = await fb.expect(lambda f: f["type"] == "face.event" and f["payload"]["type"] == "chat.interrupted", timeout=20)
        print("END", end["payload"]["seq"])
        print("HOLDER1", await cluster.lease_holder(cid))
        cluster["a"].resume()
        r = await fb.chat_to_end(cid, "/pace 10 hello again", "q2")
        print("R2", r["payload"]["status"])
        await asyncio.sleep(2)
        print(await cluster.events(cid))
        print(await cluster.sql("select conversation_id, fence from conversation_fences"))
        print(cluster.logs()[-4000:])
        assert 0
