"""Bad input from a Face gets a stable code, and hurts no other Face.

Every refusal is a ``face.error`` whose ``payload.code`` a client can branch
on (and whose ``field`` names the culprit), or a close code (DESIGN §4):
4001 unauthorized, 4009 protocol violation, 4010 no hello in time.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.support.cli import face_add, face_revoke
from tests.support.client import FaceClient
from tests.support.mind import LocalMind, MindProcess, local_mind

# Also against a two-node cluster behind a round-robin proxy (DESIGN §10).
pytestmark = pytest.mark.servers("native", "asgi", "cluster")

Frame = dict[str, Any]
KiB = 1024
MiB = 1024 * KiB


def frame(type_: str, payload: Any, **extra: Any) -> str:
    return json.dumps({"type": type_, "payload": payload, **extra})


async def still_open(face: FaceClient) -> None:
    """The connection still answers commands."""
    request_id = await face.command("face.ping")
    pong = await face.reply(request_id, ("face.pong",))
    assert pong["payload"] == {"event_seq": pong["payload"]["event_seq"],
                               "request_id": request_id}


async def next_error(face: FaceClient, timeout: float = 5.0) -> Frame:
    error = await face.expect(lambda f: f["type"] == "face.error", timeout)
    return error["payload"]


INVALID_FRAMES = [
    # (case, raw text, field named, request_id echoed)
    ("not_json", "{not json", None, None),
    ("trailing_data", frame("face.ping", {}) + " trailing", None, None),
    ("not_an_object", "[1, 2, 3]", None, None),
    ("unknown_type", frame("face.bogus", {"request_id": "b-type"}), "type", "b-type"),
    ("unknown_field", frame("face.conversation.list", {"request_id": "b-field", "bogus": 1}),
     "bogus", "b-field"),
    ("unknown_envelope_field", frame("face.ping", {}, extra=1), "extra", None),
    ("wrong_type", frame("face.conversation.list", {"request_id": "b-wrong", "limit": "ten"}),
     "limit", "b-wrong"),
    ("wrong_nested_type",
     frame("face.subscribe", {"request_id": "b-nested", "conversation_ids": [7]}),
     "conversation_ids[0]", "b-nested"),
    ("out_of_range", frame("face.conversation.list", {"request_id": "b-range", "limit": 0}),
     "limit", "b-range"),
    ("missing_request_id", frame("face.conversation.list", {}), "request_id", None),
    ("empty_request_id", frame("face.conversation.list", {"request_id": ""}), "request_id",
     None),
    ("payload_not_an_object", frame("face.ping", [1]), None, None),
    ("type_not_a_string", json.dumps({"type": 5, "payload": {}}), "type", None),
]


@pytest.mark.parametrize(("case", "raw", "field", "request_id"), INVALID_FRAMES,
                         ids=[c[0] for c in INVALID_FRAMES])
async def test_invalid_frame_is_invalid_request_naming_the_field(
    lmind: LocalMind, case: str, raw: str, field: str | None, request_id: str | None
) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    await face.send_raw(raw)
    error = await next_error(face)
    assert error["code"] == "invalid_request", error
    assert error["retryable"] is False
    if field is not None:
        assert error.get("field") == field, error
    assert error.get("request_id") == request_id, error
    await still_open(face)  # one bad frame is not a protocol violation
    await face.close()


async def test_frame_over_the_size_limit_is_invalid_request(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    content = "x" * (MiB + KiB)
    await face.command("face.chat", "big-frame", conversation_id=cid, content=content)
    error = await next_error(face)
    assert error["code"] == "invalid_request", error
    await still_open(face)
    # Nothing was admitted: the id is still free for a valid command.
    result = await face.chat_to_end(cid, "small", "big-frame")
    assert result["type"] == "face.result" and result["payload"]["content"] == "small"
    await face.close()


# A proxy in the way cannot relay the close: the Mind resets the connection
# while the client is still sending (unread data), and the reset drops it.
@pytest.mark.servers("native", "asgi")
async def test_frame_over_the_hard_limit_closes_1009(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    try:
        await face.send_raw(frame("face.ping", {"request_id": "x" * (4 * MiB + KiB)}))
    except websockets.ConnectionClosed as exc:  # closed while the frame was still going out
        code = exc.rcvd.code if exc.rcvd is not None else None
    else:
        code = await face.closed_with(5)
    assert code == 1009


async def test_binary_frame_is_invalid_request(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    await face.send_raw(frame("face.ping", {"request_id": "bin"}).encode())
    error = await next_error(face)
    assert error["code"] == "invalid_request", error
    await still_open(face)
    await face.close()


async def test_three_consecutive_invalid_frames_close_4009(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    for raw in ("nope", frame("face.bogus", {})):
        await face.send_raw(raw)
        assert (await next_error(face))["code"] == "invalid_request"
    await face.send_raw(b"\x00\x01")
    assert await face.closed_with(5) == 4009


async def test_a_valid_frame_resets_the_invalid_streak(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    for _ in range(3):
        await face.send_raw("nope")
        await face.send_raw("nope")
        await still_open(face)
    await face.close()


async def test_command_errors_carry_their_own_codes(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    checks = [
        ("face.conversation.snapshot", {"conversation_id": "c_missing"},
         "conversation_not_found", "conversation_id"),
        ("face.subscribe", {"conversation_ids": [cid], "since": {cid: "no-dot"}},
         "invalid_request", f"since.{cid}"),
        ("face.subscribe", {"conversation_ids": [cid], "since": {"c_other": "e.1"}},
         "invalid_request", "since"),
        ("face.chat.cancel", {"conversation_id": cid, "target_request_id": "nothing"},
         "run_not_found", "target_request_id"),
        ("face.approval.resolve", {"approval_id": "a_1", "decision": "allow_once"},
         "approval_not_found", "approval_id"),
    ]
    for type_, payload, code, field in checks:
        request_id = await face.command(type_, **payload)
        error = await face.reply(request_id)
        assert error["type"] == "face.error", (type_, error)
        assert (error["payload"]["code"], error["payload"].get("field")) == (code, field), error
    await still_open(face)
    await face.close()


async def test_chat_content_over_256_kib_is_too_large(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    cid = await face.create_conversation()
    await face.command("face.chat", "huge", conversation_id=cid, content="y" * (256 * KiB + 1))
    error = await face.reply("huge")
    assert error["type"] == "face.error", error
    assert error["payload"]["code"] == "too_large"
    assert error["payload"]["field"] == "content"
    # Exactly 256 KiB is allowed; and a refusal is not recorded, so the id is free.
    result = await face.chat_to_end(cid, "z" * (256 * KiB), "huge")
    assert result["type"] == "face.result", result
    assert result["payload"]["status"] == "succeeded"
    await face.close()


async def test_no_hello_in_time_closes_4010(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", hello_timeout_s=0.3, credential_poll_s=0.05) as m:
        face = await FaceClient.connect(m.url, hello=False)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await face.closed_with(5) == 4010
        assert 0.25 <= loop.time() - started < 3.0
        # A Face that does say hello in time is served.
        prompt = await FaceClient.connect(m.url, m.token)
        await still_open(prompt)
        await prompt.close()


async def test_command_before_hello_closes_4001(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, hello=False)
    await face.command("face.conversation.list")
    assert await face.closed_with(5) == 4001
    assert not [f for f in face.seen if f["type"] == "face.result"]


async def test_wrong_protocol_version_closes_4001(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, hello=False)
    await face.send("face.hello", {"token": lmind.token,
                                   "client": {"name": "old", "version": "1"}, "protocol": 2})
    assert await face.closed_with(5) == 4001
    assert not [f for f in face.seen if f["type"] == "face.welcome"]


CLOSING_INPUT = [
    # (case, say hello first, frames sent, errors expected before the close, close code)
    ("third_invalid_frame", True, ["nope", "nope", "nope"],
     [("invalid_request", None)] * 3, 4009),
    ("command_before_hello", False, [frame("face.conversation.list", {"request_id": "early"})],
     [("invalid_request", "type")], 4001),
    ("wrong_protocol", False,
     [frame("face.hello", {"token": "TOKEN", "client": {"name": "old", "version": "1"},
                           "protocol": 2})],
     [("invalid_request", "protocol")], 4001),
    ("hello_without_client", False,
     [frame("face.hello", {"token": "TOKEN", "protocol": 3})],
     [("invalid_request", "client")], 4001),
    ("hello_with_unknown_token", False,
     [frame("face.hello", {"token": "hpf_nope", "client": {"name": "x", "version": "1"},
                           "protocol": 3})],
     [("unauthorized", None)], 4001),
    ("garbage_before_hello", False, ["{not json"], [("invalid_request", None)], 4001),
]


@pytest.mark.parametrize(("case", "hello", "raws", "errors", "code"), CLOSING_INPUT,
                         ids=[c[0] for c in CLOSING_INPUT])
async def test_the_error_that_explains_a_close_arrives_before_it(
    lmind: LocalMind, case: str, hello: bool, raws: list[str],
    errors: list[tuple[str, str | None]], code: int,
) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token if hello else None, hello=hello)
    for raw in raws:
        await face.send_raw(raw.replace("TOKEN", lmind.token))
    assert await face.closed_with(5) == code
    got = [(f["payload"]["code"], f["payload"].get("field"))
           for f in face.seen if f["type"] == "face.error"]
    assert got == errors


async def test_unknown_token_closes_4001(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, hello=False)
    await face.send("face.hello", {"token": "hpf_not-a-token",
                                   "client": {"name": "x", "version": "1"}, "protocol": 3})
    assert await face.closed_with(5) == 4001
    assert not [f for f in face.seen if f["type"] == "face.welcome"]


async def test_second_hello_is_refused_and_the_connection_stays(lmind: LocalMind) -> None:
    face = await FaceClient.connect(lmind.url, lmind.token)
    await face.send("face.hello", {"token": lmind.token,
                                   "client": {"name": "x", "version": "1"}, "protocol": 3})
    error = await next_error(face)
    assert (error["code"], error.get("field")) == ("invalid_request", "type")
    await still_open(face)
    await face.close()


@pytest.mark.servers("native", "asgi")  # adds credentials in the home
async def test_token_of_a_revoked_credential_closes_4001_at_hello(lmind: LocalMind) -> None:
    home = lmind.config.home
    added = await face_add(home, "laptop")
    await lmind.mind.refresh_credentials()
    live = await FaceClient.connect(lmind.url, added.token)
    assert live.welcome is not None
    assert live.welcome["payload"]["principal_id"] == added.principal_id

    await face_revoke(home, "laptop")
    assert await live.closed_with(5) == 4003  # the Mind has seen the revocation
    refused = await FaceClient.connect(lmind.url, hello=False)
    await refused.send("face.hello", {"token": added.token,
                                      "client": {"name": "x", "version": "1"}, "protocol": 3})
    assert await refused.closed_with(5) == 4001
    assert not [f for f in refused.seen if f["type"] == "face.welcome"]


@pytest.mark.servers("native", "asgi")  # adds credentials in the home
async def test_observer_is_forbidden_transparent_detail_and_chat(lmind: LocalMind) -> None:
    operator = await FaceClient.connect(lmind.url, lmind.token)
    cid = await operator.create_conversation()
    added = await face_add(lmind.config.home, "watcher", "--profile", "observer")
    await lmind.mind.refresh_credentials()
    observer = await FaceClient.connect(lmind.url, added.token)
    assert observer.welcome is not None
    assert observer.welcome["payload"]["profile"] == "observer"

    for type_, payload in [
        ("face.subscribe", {"conversation_ids": [cid], "detail_mode": "transparent"}),
        ("face.conversation.snapshot", {"conversation_id": cid, "detail_mode": "transparent"}),
        ("face.chat", {"conversation_id": cid, "content": "let me in"}),
    ]:
        request_id = await observer.command(type_, **payload)
        error = await observer.reply(request_id)
        assert error["type"] == "face.error", (type_, error)
        assert error["payload"]["code"] == "forbidden", (type_, error)
        assert error["payload"]["retryable"] is False

    # Summary is what an observer gets, and it stays connected.
    request_id = await observer.command("face.conversation.snapshot", conversation_id=cid)
    snap = await observer.reply(request_id)
    assert snap["type"] == "face.snapshot", snap
    assert snap["payload"]["detail_mode"] == "summary"
    assert snap["payload"]["messages"] == []  # the refused chat left no trace
    await still_open(observer)
    await observer.close()
    await operator.close()


async def test_bad_input_on_one_connection_does_not_disturb_another(lmind: LocalMind) -> None:
    good = await FaceClient.connect(lmind.url, lmind.token)
    cid = await good.create_conversation()
    await good.subscribe(cid)
    text = " ".join(f"w{i}" for i in range(20))
    await good.command("face.chat", "steady", conversation_id=cid, content=f"/pace 10 {text}")
    await good.reply("steady", ("face.accepted",))

    bad = await FaceClient.connect(lmind.url, lmind.token)
    await bad.send_raw("x" * (MiB + 1))
    await bad.send_raw(b"\xff")
    await bad.send_raw("{")
    assert await bad.closed_with(5) == 4009

    result = await good.reply("steady", ("face.result",), 10)
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == text
    await still_open(good)
    await good.close()


@pytest.mark.e2e
async def test_bad_input_against_a_real_mind_process(mind_proc: MindProcess) -> None:
    good = await FaceClient.connect(mind_proc.url, mind_proc.token)
    cid = await good.create_conversation()
    await good.command("face.chat", "steady", conversation_id=cid,
                       content="/pace 20 " + " ".join(f"w{i}" for i in range(15)))
    await good.reply("steady", ("face.accepted",))

    bad = await FaceClient.connect(mind_proc.url, mind_proc.token)
    await bad.send_raw(frame("face.conversation.list", {"request_id": "r1", "nope": True}))
    error = await next_error(bad)
    assert (error["code"], error.get("field"), error.get("request_id")) == (
        "invalid_request", "nope", "r1")
    await bad.command("face.chat", "huge", conversation_id=cid, content="y" * (256 * KiB + 1))
    assert (await bad.reply("huge"))["payload"]["code"] == "too_large"
    for raw in ("{", b"\x00"):
        await bad.send_raw(raw)
        assert (await next_error(bad))["code"] == "invalid_request"
    await bad.send_raw(frame("face.nope", {}))
    assert await bad.closed_with(5) == 4009

    late = await FaceClient.connect(mind_proc.url, hello=False)
    await late.command("face.conversation.list")
    assert await late.closed_with(5) == 4001

    result = await good.reply("steady", ("face.result",), 10)
    assert result["payload"]["status"] == "succeeded"
    await still_open(good)
    await good.close()
