from halfpi.face.client import FaceClient
from halfpi.face.view import ConversationView
from tests.support.mind import LocalMind


async def test_sdk_view_matches_snapshot(lmind: LocalMind) -> None:
    async with FaceClient(lmind.url, lmind.token) as client:
        cid = await client.create_conversation("sdk")
        view = await client.subscribe(cid)
        result = await client.ask(cid, "hello from the sdk")
        assert result.ok and result.content == "hello from the sdk"
        snap = await client.snapshot(cid)
        truth = ConversationView(cid)
        truth.apply_snapshot(snap)
        # The view converges once it has applied everything up to the snapshot.
        await client.wait_view(cid, lambda v: v.seq >= truth.seq, timeout=10)
        assert view.summary() == truth.summary()
