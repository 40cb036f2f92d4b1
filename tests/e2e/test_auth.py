"""Identity is a stable principal (I8), checked on every command.

Credentials are managed the way a user manages them: ``halfpi face add`` /
``halfpi face revoke`` run as separate processes against the Mind's home
while the Mind is serving.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import websockets

from halfpi.core.hand_wire import HAND_PROTOCOL
from halfpi.core.throttle import ThrottleLimits
from tests.support.cli import face_add, face_revoke, hand_add
from tests.support.client import FaceClient
from tests.support.mind import LocalMind, MindProcess, local_mind
from tests.support.stream import is_terminal_event

Frame = dict[str, Any]


async def say_hello(url: str, token: str) -> FaceClient:
    face = await FaceClient.connect(url, hello=False)
    await face.send("face.hello", {"token": token, "client": {"name": "t", "version": "0"},
                                   "protocol": 3})
    return face


@pytest.mark.e2e
async def test_I8_revocation_closes_live_connection_within_a_second(
    mind_proc: MindProcess,
) -> None:
    added = await face_add(mind_proc.home, "phone")
    face = await FaceClient.connect(mind_proc.url, added.token)
    assert face.welcome is not None
    assert face.welcome["payload"]["principal_id"] == added.principal_id
    cid = await face.create_conversation()
    await face.subscribe(cid)
    owner = await FaceClient.connect(mind_proc.url, mind_proc.token)

    closing = asyncio.create_task(face.closed_with(5))
    await face_revoke(mind_proc.home, "phone")
    loop = asyncio.get_running_loop()
    revoked_at = loop.time()
    code = await closing
    elapsed = loop.time() - revoked_at
    assert code == 4003
    assert elapsed < 1.5, f"closed {elapsed:.2f} s after the revocation"

    # Only that principal's connections go; everyone else carries on.
    request_id = await owner.command("face.conversation.list")
    listed = await owner.reply(request_id)
    assert listed["payload"]["status"] == "succeeded"
    assert cid in [c["id"] for c in listed["payload"]["data"]["conversations"]]
    await owner.close()


@pytest.mark.e2e
async def test_I8_new_credential_with_reused_label_does_not_inherit(
    mind_proc: MindProcess,
) -> None:
    home, url = mind_proc.home, mind_proc.url
    first = await face_add(home, "tablet")
    old = await FaceClient.connect(url, first.token)
    await old.command("face.conversation.create", "shared-id", name="by the first")
    created = await old.reply("shared-id")
    assert created["type"] == "face.result", created
    first_conversation = created["payload"]["data"]["conversation_id"]

    await face_revoke(home, "tablet")
    assert await old.closed_with(5) == 4003

    second = await face_add(home, "tablet")
    assert second.principal_id != first.principal_id
    assert second.token != first.token
    new = await FaceClient.connect(url, second.token)
    assert new.welcome is not None
    welcome = new.welcome["payload"]
    assert (welcome["label"], welcome["principal_id"]) == ("tablet", second.principal_id)

    # The old token stays dead even though its label lives again.
    stale = await say_hello(url, first.token)
    assert await stale.closed_with(5) == 4001
    assert not [f for f in stale.seen if f["type"] == "face.welcome"]

    # Nothing of the old principal is inherited, not even its request records:
    # the same request_id is a new request for the new principal.
    await new.command("face.conversation.create", "shared-id", name="by the second")
    mine = await new.reply("shared-id")
    assert mine["type"] == "face.result", mine
    assert mine["payload"]["data"]["conversation_id"] != first_conversation
    assert mine["payload"]["data"]["name"] == "by the second"
    await new.close()


OBSERVER_SCOPES = ["face:hands:read", "face:sessions:read", "face:tasks:read"]


def observer_commands(cid: str) -> list[tuple[str, dict[str, Any], str]]:
    """(type, payload, expected answer: a reply type or an error code)."""
    return [
        ("face.conversation.create", {"name": "nope"}, "forbidden"),
        ("face.chat", {"conversation_id": cid, "content": "hi"}, "forbidden"),
        ("face.chat.cancel", {"conversation_id": cid, "target_request_id": "x"}, "forbidden"),
        ("face.approval.resolve", {"approval_id": "a_1", "decision": "deny_once"},
         "forbidden"),
        ("face.run.cancel", {"run_id": "r_1"}, "forbidden"),
        ("face.task.cancel", {"task_id": "t_1"}, "forbidden"),
        ("face.conversation.list", {}, "face.result"),
        ("face.conversation.snapshot", {"conversation_id": cid}, "face.snapshot"),
        ("face.conversation.messages", {"conversation_id": cid, "limit": 10}, "face.result"),
        ("face.subscribe", {"conversation_ids": [cid]}, "face.accepted"),
        ("face.task.list", {}, "face.result"),
        ("face.task.get", {"task_id": "t_1"}, "task_not_found"),
        ("face.task.log", {"task_id": "t_1"}, "task_not_found"),
        ("face.hand.list", {}, "face.result"),
        ("face.ping", {}, "face.pong"),
    ]


async def test_I8_observer_scopes_are_enforced_per_command(lmind: LocalMind) -> None:
    operator = await FaceClient.connect(lmind.url, lmind.token)
    cid = await operator.create_conversation()
    added = await face_add(lmind.config.home, "wall", "--profile", "observer")
    await lmind.mind.refresh_credentials()
    observer = await FaceClient.connect(lmind.url, added.token)
    assert observer.welcome is not None
    welcome = observer.welcome["payload"]
    assert (welcome["profile"], welcome["scopes"]) == ("observer", OBSERVER_SCOPES)

    for type_, payload, expected in observer_commands(cid):
        request_id = await observer.command(type_, **payload)
        answer = await observer.expect(
            lambda f, r=request_id: f["payload"].get("request_id") == r)
        if expected.startswith("face."):
            assert answer["type"] == expected, (type_, answer)
            if expected == "face.result":
                assert answer["payload"]["status"] == "succeeded", (type_, answer)
        else:
            assert answer["type"] == "face.error", (type_, answer)
            assert answer["payload"]["code"] == expected, (type_, answer)

    # Read access is real: the observer watches the operator's chat, in summary.
    result = await operator.chat_to_end(cid, "watched closely", "w-1")
    assert result["payload"]["status"] == "succeeded"
    done = await observer.expect(lambda f: is_terminal_event(f, "w-1"))
    assert done["payload"]["data"]["content"] == "watched closely"
    request_id = await observer.command("face.conversation.snapshot", conversation_id=cid)
    snap = await observer.reply(request_id)
    assert snap["payload"]["detail_mode"] == "summary"
    assert [m["request_id"] for m in snap["payload"]["messages"]] == ["w-1", "w-1"]
    await observer.close()
    await operator.close()


async def test_I8_new_credential_is_accepted_right_after_face_add(
    tmp_path: Path, server_kind: str
) -> None:
    # The poll is far away: only a look-up on the unknown token can let it in.
    async with local_mind(tmp_path / "home", server=server_kind, credential_poll_s=30.0) as m:
        added = await face_add(m.config.home, "script")
        face = await say_hello(m.url, added.token)
        welcome = await face.expect(lambda f: f["type"] == "face.welcome", 5)
        assert welcome["payload"]["principal_id"] == added.principal_id
        await face.close()


# -- failed handshakes are throttled per address (DESIGN §11) -------------------------


async def guess(url: str, token: str, **connect: Any) -> tuple[int | None, list[Frame]]:
    """One hello with ``token``; returns the close code and what came before it."""
    face = await FaceClient.connect(url, hello=False, **connect)
    await face.send("face.hello", {"token": token, "client": {"name": "g", "version": "0"},
                                   "protocol": 3})
    code = await face.closed_with(30)
    return code, face.seen


async def test_failed_handshakes_wait_longer_and_longer_and_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, server_kind: str
) -> None:
    throttle = ThrottleLimits(base_s=0.05, cap_s=0.4, max_wait_s=1.0)
    secret = "hpf_guess-" + "s3cr3t" * 6
    async with local_mind(tmp_path / "home", server=server_kind, handshake_throttle=throttle,
                          local_hand=False) as m:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(6):
            code, seen = await guess(m.url, secret)
            assert code == 4001
            assert [f["payload"]["code"] for f in seen] == ["unauthorized"]
        elapsed = loop.time() - started
        # 0, 0.05, 0.1, 0.2, 0.4, 0.4: each guess waited for the one before it.
        assert elapsed >= 1.15, elapsed
        # The right token, from the same address, still gets in (after its wait).
        face = await FaceClient.connect(m.url, m.token)
        assert face.welcome is not None
        await face.close()
    failures = [r.getMessage() for r in caplog.records if "handshake from" in r.getMessage()]
    assert len(failures) == 6, failures
    for count, line in enumerate(failures, 1):
        assert "127.0.0.1" in line and f"failure {count} " in line, line
    for record in caplog.records:
        text = record.getMessage()
        assert "s3cr3t" not in text and secret[:8] not in text, text


async def test_parallel_guesses_from_one_address_are_refused_rate_limited(
    tmp_path: Path, server_kind: str,
) -> None:
    # After one failure the next check would wait 10 s, beyond the 5 s anyone
    # is kept waiting: every other attempt is refused at once, unchecked.
    throttle = ThrottleLimits(base_s=10.0, cap_s=10.0, max_wait_s=5.0)
    async with local_mind(tmp_path / "home", server=server_kind, handshake_throttle=throttle,
                          local_hand=False) as m:
        code, _ = await guess(m.url, "hpf_wrong")
        assert code == 4001
        outcomes = await asyncio.gather(*(guess(m.url, "hpf_wrong") for _ in range(8)),
                                        guess(m.url, m.token))
        for code, seen in outcomes:
            assert code == 4029
            assert [(f["payload"]["code"], f["payload"]["retryable"]) for f in seen] == [
                ("rate_limited", True)]
        # Another address is not affected.
        other = await FaceClient.connect(m.url, hello=False, local_addr=("127.0.0.2", 0))
        await other.hello(m.token)
        assert other.welcome is not None
        await other.close()


async def test_hand_handshakes_are_throttled_too(tmp_path: Path, server_kind: str) -> None:
    throttle = ThrottleLimits(base_s=10.0, cap_s=10.0, max_wait_s=5.0)
    async with local_mind(tmp_path / "home", server=server_kind, handshake_throttle=throttle,
                          local_hand=False) as m:
        hand_url = m.url.replace("/v1/face", "/v1/hand")
        codes = []
        for _ in range(2):
            ws = await websockets.connect(hand_url)
            await ws.send(json.dumps({"type": "hand.hello", "payload": {
                "token": "hph_wrong", "hand_id": "h", "instance_id": "i",
                "info": {"hostname": "h", "os": "o", "arch": "a", "version": "0"},
                "tools": [], "protocol": HAND_PROTOCOL, "runs": []}}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None
            codes.append(closed.value.rcvd.code)
        assert codes == [4001, 4029]


async def test_unknown_tokens_share_one_credential_reread(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", credential_poll_s=30.0, local_hand=False) as m:
        mind = m.mind
        reads = 0
        version = mind.store.credentials_version

        async def counted() -> int:
            nonlocal reads
            reads += 1
            return await version()

        mind.store.credentials_version = counted  # type: ignore[method-assign]
        results = await asyncio.gather(*(
            mind.authenticate(f"hpf_guess-{i}", "face", f"198.51.100.{i}")
            for i in range(50)))
        assert results == [None] * 50
        assert reads == 1, reads


# -- at most N live connections per principal (DESIGN §11) ----------------------------


async def test_connections_beyond_the_per_principal_cap_are_refused_4029(
    tmp_path: Path, server_kind: str,
) -> None:
    async with local_mind(tmp_path / "home", server=server_kind, max_connections_per_principal=3,
                          local_hand=False) as m:
        faces = [await FaceClient.connect(m.url, m.token) for _ in range(3)]
        code, seen = await guess(m.url, m.token)
        assert code == 4029
        assert [(f["payload"]["code"], f["payload"]["retryable"]) for f in seen] == [
            ("rate_limited", True)]
        # Another principal has its own allowance.
        added = await face_add(m.config.home, "phone")
        phone = await FaceClient.connect(m.url, added.token)
        assert phone.welcome is not None
        # A closed connection frees its place.
        await faces.pop().close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while True:
            face = await FaceClient.connect(m.url, hello=False)
            await face.send("face.hello", {"token": m.token, "protocol": 3,
                                           "client": {"name": "t", "version": "0"}})
            first = await face.recv(5)
            if first["type"] == "face.welcome":
                break
            assert loop.time() < deadline, "the closed connection's place was never freed"
            await face.closed_with(5)
        for face_ in (*faces, face, phone):
            await face_.close()


async def test_hand_connections_count_against_the_cap_too(tmp_path: Path, server_kind: str) -> None:
    async with local_mind(tmp_path / "home", server=server_kind, max_connections_per_principal=1,
                          local_hand=False) as m:
        added = await hand_add(m.config.home, "laptop")
        hand_url = m.url.replace("/v1/face", "/v1/hand")

        async def hello() -> websockets.ClientConnection:
            ws = await websockets.connect(hand_url)
            await ws.send(json.dumps({"type": "hand.hello", "payload": {
                "token": added.token, "hand_id": "laptop", "instance_id": "i",
                "info": {"hostname": "h", "os": "o", "arch": "a", "version": "0"},
                "tools": [], "protocol": HAND_PROTOCOL, "runs": []}}))
            return ws

        first = await hello()
        assert json.loads(await asyncio.wait_for(first.recv(), 10))["type"] == "hand.welcome"
        second = await hello()
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(second.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4029
        await first.close()


async def test_a_trusted_proxy_names_the_client_address_and_no_one_else_does(
    tmp_path: Path, server_kind: str,
) -> None:
    throttle = ThrottleLimits(base_s=10.0, cap_s=10.0, max_wait_s=5.0)
    async with local_mind(tmp_path / "home", server=server_kind, handshake_throttle=throttle,
                          trusted_proxies=("127.0.0.1",), local_hand=False) as m:
        def via(client: str, peer: str = "127.0.0.1") -> dict[str, Any]:
            return {"additional_headers": {"X-Forwarded-For": f"198.51.100.1, {client}"},
                    "local_addr": (peer, 0)}

        code, _ = await guess(m.url, "hpf_wrong", **via("203.0.113.5"))
        assert code == 4001
        code, _ = await guess(m.url, m.token, **via("203.0.113.5"))
        assert code == 4029  # that client is throttled …
        other = await FaceClient.connect(m.url, m.token, **via("203.0.113.6"))
        assert other.welcome is not None  # … not the next one behind the same proxy
        # A peer that is not a trusted proxy cannot pick its address.
        direct = await FaceClient.connect(m.url, m.token, **via("203.0.113.5", "127.0.0.2"))
        assert direct.welcome is not None
        await other.close()
        await direct.close()
