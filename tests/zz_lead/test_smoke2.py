import asyncio
from pathlib import Path
from tests.support.cluster import running_cluster

async def test_takeover(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "cluster", ("a", "b"), local_hand=False) as cluster:
        fa = await cluster.face("a")
        fb = await cluster.face("b")
        cid = await fa.create_conversation()
        await fa.subscribe(cid, snapshot=True)
        await fb.subscribe(cid, snapshot=True)
        await fa.command("face.chat", "q1", conversation_id=cid, content="/pace 50 " + " ".join(f"w{i}" for i in range(100)))
        await fb.expect(lambda f: f["type"] == "face.chat.delta" and f["payload"]["seq"] > 8)
        cluster["a"].kill()
        end = await fb.expect(lambda f: f["type"] == "face.event" and f["payload"]["type"].startswith("chat.") and f["payload"]["type"] not in ("chat.message", "chat.started"), timeout=20)
        print("END", end)
        r = await fb.chat_to_end(cid, "/pace 10 hello again", "q2")
        print("R2", r)
        ev = await fb.expect(lambda f: f["type"] == "face.event" and f["payload"]["type"] == "chat.completed", timeout=10)
        print(await cluster.events(cid))
        print([ (f["type"], f["payload"].get("seq"), f["payload"].get("type")) for f in fb.seen if f["type"] != "face.chat.delta"])
        print(cluster.logs()[-3000:])
        assert 0
