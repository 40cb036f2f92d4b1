"""Every moment the connection can break, against a real ``halfpi mind``.

The Face talks to the Mind through a fault-injecting TCP proxy and cuts the
link (1) before its request is sent, (2) after sending it but before the
``face.accepted`` reaches it, (3) while the chat runs, (4) after the chat
ended but before the terminal ``face.result`` reaches it, and (5) after
everything finished. Each time it reconnects and must learn exactly what is
true: one admission per request_id (I5), the chat unaffected by the cut
(I1), an exact resume from its last cursor (I4). Then the Mind itself dies
(``kill -9``) mid-chat: what was committed stays, the running chat becomes
``interrupted`` and is never re-run (I11), and old cursors get an honest
reset.

Every test runs twice: with the scripted agent, and with a model — the
Mind's provider talking to a fake model server on 127.0.0.1 over real HTTP
(``tests/support/fake_openai.py``, which answers with the same grammar) —
so each promise holds for a model's words exactly as for the scripted
agent's, and a chat a crash interrupted is never sent to the model again.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.support.client import FaceClient, seq_of
from tests.support.cluster_mind import ClusterMind, started_mind, stop_mind
from tests.support.fake_openai import MODEL, FakeModel
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy, cut_on
from tests.support.stream import (
    assert_contiguous,
    delta_text,
    is_event,
    is_terminal_event,
    positioned,
)

# Also against a two-node cluster behind a round-robin proxy: every
# reconnect lands on the other node (DESIGN §10).
pytestmark = [pytest.mark.e2e, pytest.mark.servers("native", "asgi", "cluster")]

Frame = dict[str, Any]
REPLIES = ("face.accepted", "face.result", "face.error")


@pytest.fixture
async def model() -> AsyncIterator[FakeModel]:
    async with FakeModel() as fake:
        yield fake


@pytest.fixture(params=["scripted", "openai"])
def agent_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def mind_proc(
    tmp_path: Path, server_kind: str, agent_kind: str, model: FakeModel
) -> Iterator[MindProcess]:
    """``halfpi mind`` with the scripted agent, or with ``--agent openai``
    pointed at the fake model server."""
    extra: tuple[str, ...] = ()
    if agent_kind == "openai":
        extra = ("--agent", "openai", "--model", MODEL, "--base-url", model.base_url)
    proc = started_mind(tmp_path / "home", server_kind, extra_args=extra)
    try:
        yield proc
    finally:
        stop_mind(proc)


def asked(model: FakeModel, content: str) -> int:
    """How many requests the model server got for the message ``content``."""
    said = [{"role": "user", "content": content}]
    return sum(1 for r in model.requests if r.messages[-1:] == said)


def words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def body(frame: Frame) -> dict[str, Any]:
    """A frame's payload without per-connection bookkeeping."""
    return {k: v for k, v in frame["payload"].items() if k != "event_seq"}


async def snapshot(face: FaceClient, conversation_id: str) -> dict[str, Any]:
    request_id = await face.command("face.conversation.snapshot",
                                    conversation_id=conversation_id, messages_limit=500)
    frame = await face.reply(request_id)
    assert frame["type"] == "face.snapshot", frame
    return frame["payload"]


def messages_of(snap: dict[str, Any], request_id: str, role: str) -> list[dict[str, Any]]:
    return [m for m in snap["messages"]
            if m["request_id"] == request_id and m["role"] == role]


def answers(face: FaceClient, request_id: str,
            types: tuple[str, ...] = REPLIES) -> list[Frame]:
    return [f for f in face.seen
            if f["type"] in types and f["payload"].get("request_id") == request_id]


def forget(face: FaceClient, request_id: str) -> None:
    """Answers to earlier sends of ``request_id`` are not answers to the next one."""
    for frame in face.seen:
        if frame["payload"].get("request_id") == request_id:
            frame["_taken"] = True


async def replay(face: FaceClient, request_id: str, conversation_id: str,
                 content: str) -> Frame:
    """Re-send a chat with the same request_id and payload; return the first answer."""
    forget(face, request_id)
    await face.command("face.chat", request_id, conversation_id=conversation_id,
                       content=content)
    return await face.reply(request_id, REPLIES)


async def settle(face: FaceClient, request_id: str, first: Frame,
                 timeout: float = 20.0) -> Frame:
    """The terminal face.result of a replay: ``first`` itself, or what follows it."""
    if first["type"] == "face.result":
        return first
    assert first["type"] == "face.accepted", first
    return await face.reply(request_id, ("face.result",), timeout)


async def test_I5_break_before_request_is_sent_then_exactly_one_admission(
    mind_proc: MindProcess, proxy_to: FaultProxy
) -> None:
    face = await FaceClient.connect(proxy_to.url, mind_proc.token)
    cid = await face.create_conversation()

    proxy_to.cut_all()
    assert await face.closed_with(5) is None  # cut, not closed: no close frame
    with pytest.raises(websockets.ConnectionClosed):
        await face.command("face.chat", "q-before", conversation_id=cid, content="hello there")

    again = await FaceClient.connect(proxy_to.url, mind_proc.token)
    result = await again.chat_to_end(cid, "hello there", "q-before")
    assert result["type"] == "face.result", result
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == "hello there"

    # A cautious second retry converges on the same outcome, still one admission.
    second = await replay(again, "q-before", cid, "hello there")
    assert body(second) == body(result)
    snap = await snapshot(again, cid)
    assert len(messages_of(snap, "q-before", "user")) == 1
    assert [m["content"] for m in messages_of(snap, "q-before", "assistant")] == ["hello there"]
    await again.close()


async def test_I5_break_before_accepted_arrives_replay_admits_once(
    mind_proc: MindProcess, proxy_to: FaultProxy
) -> None:
    face = await FaceClient.connect(proxy_to.url, mind_proc.token)
    cid = await face.create_conversation()

    proxy_to.cut_when = cut_on(b'"type":"face.accepted"')
    await face.command("face.chat", "q-lost-ack", conversation_id=cid,
                       content="lost in transit")
    assert await face.closed_with(5) is None
    assert proxy_to.cuts == 1
    assert not answers(face, "q-lost-ack"), face.seen

    proxy_to.cut_when = None
    again = await FaceClient.connect(proxy_to.url, mind_proc.token)
    first = await replay(again, "q-lost-ack", cid, "lost in transit")
    assert first["type"] in ("face.accepted", "face.result"), first
    if first["type"] == "face.accepted":
        assert first["payload"]["operation"] == "chat"
        assert first["payload"]["conversation_id"] == cid
    result = await settle(again, "q-lost-ack", first)
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == "lost in transit"

    snap = await snapshot(again, cid)
    assert len(messages_of(snap, "q-lost-ack", "user")) == 1, snap["messages"]
    assert len(messages_of(snap, "q-lost-ack", "assistant")) == 1, snap["messages"]
    assert snap["pending_chats"] == []
    await again.close()


async def test_I1_chat_keeps_running_through_a_cut_and_resume_is_exact(
    mind_proc: MindProcess, proxy_to: FaultProxy
) -> None:
    face = await FaceClient.connect(proxy_to.url, mind_proc.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    # A second Face, not behind the proxy, watches the same conversation.
    watcher = await FaceClient.connect(mind_proc.url, mind_proc.token)
    await watcher.subscribe(cid)
    text = " ".join(words(60))
    content = f"/pace 40 {text}"

    await face.command("face.chat", "q-running", conversation_id=cid, content=content)
    accepted = await face.reply("q-running", ("face.accepted",))
    await face.expect(lambda f: f["type"] == "face.chat.delta"
                      and "w3" in f["payload"]["text"].split())
    proxy_to.cut_all()
    assert await face.closed_with(5) is None
    before = positioned(face.seen, cid)
    last_cursor = before[-1]["payload"]["cursor"]
    assert not [f for f in before if is_terminal_event(f)], "the cut came too late"
    # Let the chat move on without the cut Face, so that it really missed something.
    await watcher.expect(lambda f: f["type"] == "face.chat.delta"
                         and f["payload"]["seq"] >= seq_of(last_cursor) + 3)

    again = await FaceClient.connect(proxy_to.url, mind_proc.token)
    # I1: the chat was not cancelled by the cut; the replay re-attaches to it.
    first = await replay(again, "q-running", cid, content)
    assert first["type"] == "face.accepted", first
    assert body(first) == body(accepted)
    sub = await again.subscribe(cid, since=last_cursor)
    assert sub["type"] == "face.accepted", sub
    assert sub["payload"]["replay"] == "exact"

    result = await again.reply("q-running", ("face.result",), 20)
    assert result["payload"]["status"] == "succeeded"
    assert result["payload"]["content"] == text
    done = await again.expect(lambda f: is_terminal_event(f, "q-running"))
    assert done["payload"]["type"] == "chat.completed"
    assert done["payload"]["data"]["content"] == text

    after = positioned(again.seen, cid)
    assert_contiguous(after, seq_of(last_cursor) + 1, done["payload"]["seq"])
    assert delta_text(before, "q-running") + delta_text(after, "q-running") == text
    # The replaying connection got the terminal result exactly once.
    assert len(answers(again, "q-running", ("face.result",))) == 1
    # And the Face that never lost its link saw the same history.
    await watcher.expect(lambda f: is_terminal_event(f, "q-running"))
    watched = positioned(watcher.seen, cid)
    assert_contiguous(watched, watched[0]["payload"]["seq"], done["payload"]["seq"])
    assert delta_text(watched, "q-running") == text
    await again.close()
    await watcher.close()


async def test_I5_terminal_result_lost_replay_returns_the_stored_result(
    mind_proc: MindProcess, proxy_to: FaultProxy
) -> None:
    face = await FaceClient.connect(proxy_to.url, mind_proc.token)
    cid = await face.create_conversation()
    text = "the result goes missing here"

    proxy_to.cut_when = cut_on(b'"type":"face.result"')
    await face.command("face.chat", "q-lost-result", conversation_id=cid, content=text)
    assert await face.closed_with(5) is None
    assert not answers(face, "q-lost-result", ("face.result",)), face.seen

    proxy_to.cut_when = None
    again = await FaceClient.connect(proxy_to.url, mind_proc.token)
    first = await replay(again, "q-lost-result", cid, text)
    assert first["type"] == "face.result", first  # finished: the stored terminal result
    assert first["payload"]["status"] == "succeeded"
    assert first["payload"]["content"] == text
    acks = answers(face, "q-lost-result", ("face.accepted",))
    if acks:
        assert first["payload"]["data"]["run_id"] == acks[0]["payload"]["run_id"]

    # Asking again answers the same stored record, byte for byte.
    second = await replay(again, "q-lost-result", cid, text)
    assert body(second) == body(first)
    snap = await snapshot(again, cid)
    assert len(messages_of(snap, "q-lost-result", "user")) == 1
    assert [m["content"] for m in messages_of(snap, "q-lost-result", "assistant")] == [text]
    await again.close()


async def test_I4_snapshot_after_everything_finished_has_the_full_history(
    mind_proc: MindProcess, proxy_to: FaultProxy
) -> None:
    face = await FaceClient.connect(proxy_to.url, mind_proc.token)
    cid = await face.create_conversation("history")
    said = {"h1": "one", "h2": "two two", "h3": "three three three"}
    last_result: Frame | None = None
    for request_id, text in said.items():
        last_result = await face.chat_to_end(cid, text, request_id)
        assert last_result["payload"]["status"] == "succeeded"
    proxy_to.cut_all()
    assert await face.closed_with(5) is None
    assert last_result is not None

    again = await FaceClient.connect(proxy_to.url, mind_proc.token)
    snap = await snapshot(again, cid)
    expected = []
    for request_id, text in said.items():
        expected += [("user", request_id, text, None), ("assistant", request_id, text,
                                                        "succeeded")]
    got = [(m["role"], m["request_id"], m["content"], m["status"]) for m in snap["messages"]]
    assert got == expected
    seqs = [m["seq"] for m in snap["messages"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert snap["conversation"]["id"] == cid
    assert snap["conversation"]["name"] == "history"
    assert snap["has_more_older"] is False
    for key in ("pending_chats", "pending_approvals", "active_runs", "tasks", "tool_history"):
        assert snap[key] == [], key
    # The snapshot reflects the log up to the last chat's terminal event...
    assert seq_of(snap["cursor"]) == seq_of(last_result["payload"]["data"]["cursor"])
    assert snap["cursor"].startswith(snap["epoch"] + ".")

    # ...and continues it with no gap and no overlap.
    sub = await again.subscribe(cid, since=snap["cursor"])
    assert sub["payload"]["replay"] == "exact"
    await again.chat_to_end(cid, "four", "h4")
    done = await again.expect(lambda f: is_terminal_event(f, "h4"))
    assert_contiguous(positioned(again.seen, cid), seq_of(snap["cursor"]) + 1,
                      done["payload"]["seq"])
    await again.close()


async def test_I5_same_request_id_with_another_payload_is_request_conflict(
    mind_proc: MindProcess, proxy_to: FaultProxy
) -> None:
    face = await FaceClient.connect(proxy_to.url, mind_proc.token)
    cid = await face.create_conversation()

    done = await face.chat_to_end(cid, "first payload", "q-same")
    assert done["payload"]["status"] == "succeeded"
    forget(face, "q-same")
    await face.command("face.chat", "q-same", conversation_id=cid, content="other payload")
    error = await face.reply("q-same", REPLIES)
    assert error["type"] == "face.error", error
    assert error["payload"]["code"] == "request_conflict"
    assert error["payload"]["field"] == "request_id"
    assert error["payload"]["retryable"] is False

    # While the first is still running, and from another connection, too.
    slow = f"/pace 40 {' '.join(words(15))}"
    await face.command("face.chat", "q-running", conversation_id=cid, content=slow)
    await face.reply("q-running", ("face.accepted",))
    other = await FaceClient.connect(proxy_to.url, mind_proc.token)
    await other.command("face.chat", "q-running", conversation_id=cid, content="not that")
    error = await other.reply("q-running", REPLIES)
    assert error["type"] == "face.error", error
    assert error["payload"]["code"] == "request_conflict"
    # Another command type under the same id conflicts as well.
    forget(other, "q-running")
    await other.command("face.conversation.create", "q-running", name="x")
    error = await other.reply("q-running", REPLIES)
    assert error["payload"]["code"] == "request_conflict", error
    await face.reply("q-running", ("face.result",), 20)

    snap = await snapshot(other, cid)
    assert [m["content"] for m in messages_of(snap, "q-same", "user")] == ["first payload"]
    assert [m["content"] for m in messages_of(snap, "q-running", "user")] == [slow]
    assert not [m for m in snap["messages"] if m["content"] in ("other payload", "not that")]
    await face.close()
    await other.close()


async def _crash_mid_chat(mind: MindProcess) -> dict[str, Any]:
    """Commit one chat, start a slow one, ``kill -9`` the Mind mid-reply, restart it."""
    face = await FaceClient.connect(mind.url, mind.token)
    cid = await face.create_conversation()
    committed = await face.chat_to_end(cid, "committed before the crash", "q-committed")
    assert committed["payload"]["status"] == "succeeded"
    await face.subscribe(cid)
    content = f"/pace 50 {' '.join(words(60))}"
    await face.command("face.chat", "q-crash", conversation_id=cid, content=content)
    await face.reply("q-crash", ("face.accepted",))
    await face.expect(lambda f: f["type"] == "face.chat.delta"
                      and "w3" in f["payload"]["text"].split())

    mind.kill()
    assert await face.closed_with(5) is None  # no goodbye from a killed process
    seen = positioned(face.seen, cid)
    mind.start()
    return {
        "cid": cid,
        "content": content,
        "seen": seen,
        "old_cursor": seen[-1]["payload"]["cursor"],
        "committed": committed,
    }


async def test_I11_kill_9_mid_chat_interrupts_it_and_keeps_what_was_committed(
    mind_proc: MindProcess, agent_kind: str, model: FakeModel
) -> None:
    crash = await _crash_mid_chat(mind_proc)
    cid, old_cursor = crash["cid"], crash["old_cursor"]
    durable_seqs = [f["payload"]["seq"] for f in crash["seen"] if f["type"] == "face.event"]

    face = await FaceClient.connect(mind_proc.url, mind_proc.token)
    # The in-flight chat's outcome is unknown: interrupted, never re-run.
    result = await replay(face, "q-crash", cid, crash["content"])
    assert result["type"] == "face.result", result
    assert result["payload"]["status"] == "interrupted"
    interrupted_seq = seq_of(result["payload"]["data"]["cursor"])
    assert interrupted_seq > max(durable_seqs)
    # What was committed before the crash answers as before.
    committed = await replay(face, "q-committed", cid, "committed before the crash")
    assert body(committed) == body(crash["committed"])
    # The model was asked once, before the crash; never again after it.
    assert asked(model, crash["content"]) == (1 if agent_kind == "openai" else 0)

    sub = await face.subscribe(cid, since=old_cursor)
    assert sub["type"] == "face.accepted", sub
    if isinstance(mind_proc, ClusterMind):
        # The journal outlived the node (it is in Redis): the old cursor
        # resumes exactly — the durable events from PostgreSQL below the new
        # owner's settle point — up to the interruption.
        assert sub["payload"]["conversations"] == {cid: "exact"}
        event = await face.expect(lambda f: is_event(f, "chat.interrupted", "q-crash"))
        assert event["payload"]["seq"] == interrupted_seq
        rid = await face.command("face.conversation.snapshot", conversation_id=cid)
        snap = (await face.reply(rid, ("face.snapshot", "face.error")))["payload"]
        assert snap["epoch"] == old_cursor.rpartition(".")[0]
    else:
        # An old cursor: the journal's window died with the process. Honest reset.
        assert sub["payload"]["conversations"] == {cid: "reset"}
        reset = await face.expect(lambda f: f["type"] == "face.reset")
        assert reset["payload"]["conversation_id"] == cid
        assert reset["payload"]["reason"] == "epoch_changed"
        snap = reset["payload"]["snapshot"]
        assert snap["epoch"] != old_cursor.rpartition(".")[0]
    assert seq_of(snap["cursor"]) == interrupted_seq
    assert snap["pending_chats"] == []
    got = [(m["role"], m["request_id"], m["content"]) for m in snap["messages"]]
    # The interrupted reply stays, with the text saved before the crash: a few
    # words at this pace is less than one checkpoint period, so none.
    assert got == [
        ("user", "q-committed", "committed before the crash"),
        ("assistant", "q-committed", "committed before the crash"),
        ("user", "q-crash", crash["content"]),
        ("assistant", "q-crash", ""),
    ]
    assert snap["messages"][-1]["status"] == "interrupted"

    # The chat.interrupted event itself, read back from the new window.
    probe = await FaceClient.connect(mind_proc.url, mind_proc.token)
    since = f"{snap['epoch']}.{interrupted_seq - 1}"
    sub = await probe.subscribe(cid, since=since)
    assert sub["payload"]["replay"] == "exact", sub
    event = await probe.expect(lambda f: is_event(f, "chat.interrupted", "q-crash"))
    assert event["payload"]["seq"] == interrupted_seq
    assert event["payload"]["data"]["status"] == "interrupted"

    # The conversation is not stuck: a new chat runs, after everything before.
    after = await face.chat_to_end(cid, "after the restart", "q-after")
    assert after["payload"]["status"] == "succeeded"
    assert after["payload"]["content"] == "after the restart"
    assert seq_of(after["payload"]["data"]["cursor"]) > interrupted_seq
    assert asked(model, crash["content"]) == (1 if agent_kind == "openai" else 0)
    await face.close()
    await probe.close()


@pytest.mark.servers("native", "asgi")  # reads the SQLite file itself
async def test_I11_kill_9_mid_reply_keeps_the_text_saved_so_far(
    mind_proc: MindProcess,
) -> None:
    """DESIGN §5: the text so far is checkpointed while it streams, so a reply
    cut by a crash keeps what its Faces were shown (never more), marked
    ``interrupted`` with a reason."""
    face = await FaceClient.connect(mind_proc.url, mind_proc.token)
    cid = await face.create_conversation()
    await face.subscribe(cid)
    content = f"/pace 100 {' '.join(words(100))}"
    await face.command("face.chat", "q-long", conversation_id=cid, content=content)
    db = mind_proc.home / "halfpi.db"
    saved = await wait_for_checkpoint(db, "q-long")
    mind_proc.kill()
    assert await face.closed_with(5) is None  # reads every frame that arrived
    shown = delta_text(face.seen, "q-long")
    assert shown.startswith(saved)  # never more than the Faces were shown
    mind_proc.start()

    face = await FaceClient.connect(mind_proc.url, mind_proc.token)
    reply = (await snapshot(face, cid))["messages"][-1]
    assert (reply["role"], reply["request_id"], reply["status"]) == (
        "assistant", "q-long", "interrupted"
    )
    assert reply["content"] == saved
    assert "stopped" in reply["reason"]
    await face.close()


async def wait_for_checkpoint(db: Path, request_id: str, timeout: float = 20.0) -> str:
    """Poll the store (read-only) until the running reply has saved some text."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            row = conn.execute(
                "SELECT content FROM runs WHERE request_id = ? AND finished_at IS NULL",
                (request_id,),
            ).fetchone()
        if row is not None and row[0]:
            return str(row[0])
        assert loop.time() < deadline, "the reply never saved its text"
        await asyncio.sleep(0.05)


async def test_I2_seq_after_kill_9_is_above_every_seq_shown_before(
    mind_proc: MindProcess,
) -> None:
    crash = await _crash_mid_chat(mind_proc)
    shown = max(f["payload"]["seq"] for f in crash["seen"])
    face = await FaceClient.connect(mind_proc.url, mind_proc.token)
    result = await replay(face, "q-crash", crash["cid"], crash["content"])
    assert result["payload"]["status"] == "interrupted"
    assert seq_of(result["payload"]["data"]["cursor"]) > shown
    await face.close()
