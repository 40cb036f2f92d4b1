from tests.support.client import FaceClient
from tests.support.mind import LocalMind


async def test_chat_round_trip(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    result = await face.chat_to_end(cid, "hello big world")
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == "hello big world"
    deltas = [f["payload"]["text"] for f in face.events(cid) if f["type"] == "face.chat.delta"]
    assert "".join(deltas) == "hello big world"
    await face.close()


def test_process_mind_starts(mind_proc) -> None:
    assert mind_proc.url.startswith("ws://127.0.0.1:")
