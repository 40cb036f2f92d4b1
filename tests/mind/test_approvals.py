"""Approvals (DESIGN §7): the first valid decision wins, audit before execution (I10).

Every test drives a real Mind with the scripted agent: ``/tool exec_command …``
makes the chat wait at ``approval.requested``. Most use a real port; the
TTL's tests use a fake clock and no sockets (``tests/support/rig.py``), so
the default two minutes pass in microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from halfpi.mind.hands import ToolRun
from halfpi.store.base import WriteTx
from tests.support.cli import face_add
from tests.support.client import FaceClient, connect_new_credential
from tests.support.clock import T0, WALL0
from tests.support.frames import event, events_of
from tests.support.hand import allow_check
from tests.support.mind import LocalMind, hand_ready
from tests.support.rig import Peer, Rig, fake_time_mind
from tests.support.store import HeldCommits

TRUE_TOOL = '/tool exec_command {"argv": ["true"]}'


# -- helpers ---------------------------------------------------------------------------


def read_row(db: Path, table: str, key: str, value: str) -> dict[str, Any] | None:
    """One row, read through a separate read-only connection (what is durable)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,)).fetchone()
        return dict(row) if row is not None else None


async def approver(lmind: LocalMind, home: Path, label: str) -> FaceClient:
    """A second operator that may approve, created the way a user creates it."""
    added = await face_add(home, label, "--approve")
    return await connect_new_credential(lmind.url, added.token)


async def wait_approval(face: FaceClient, request_id: str) -> str:
    frame = await face.expect(event("approval.requested", request_id=request_id))
    return str(frame["payload"]["data"]["approval_id"])


@contextlib.asynccontextmanager
async def operator(lmind: LocalMind) -> AsyncIterator[FaceClient]:
    face = await FaceClient.connect(lmind.url, lmind.token)
    try:
        yield face
    finally:
        await face.close()


# -- I10: racing decisions -----------------------------------------------------------------


async def test_I10_approval_race_one_winner(lmind: LocalMind) -> None:
    await hand_ready(lmind)
    db = lmind.config.db_path
    face_a = await FaceClient.connect(lmind.url, lmind.token)
    face_b = await approver(lmind, lmind.config.home, "second-approver")
    cid = await face_a.create_conversation()
    await face_a.subscribe(cid)
    await face_b.subscribe(cid)

    # Audit before execution: at the moment a run is dispatched to a Hand, the
    # approval's decision must already be durable in the store.
    hands = lmind.mind.hands
    original_start = hands.start
    dispatched: dict[str, dict[str, Any] | None] = {}

    def start(run: ToolRun) -> None:
        dispatched[run.tool_call_id] = read_row(db, "approvals", "tool_call_id", run.tool_call_id)
        original_start(run)

    hands.start = start  # type: ignore[method-assign]

    winners = {"allow_once": 0, "deny_once": 0}
    principals = {
        face_a.welcome["payload"]["principal_id"]: face_a,  # type: ignore[index]
        face_b.welcome["payload"]["principal_id"]: face_b,  # type: ignore[index]
    }
    assert len(principals) == 2
    for i in range(200):
        chat_id = await face_a.command("face.chat", conversation_id=cid, content=TRUE_TOOL)
        approval_id = await wait_approval(face_a, chat_id)
        await wait_approval(face_b, chat_id)
        decisions = {face_a: "allow_once", face_b: "deny_once"}
        if i % 2:
            decisions = {face_a: "deny_once", face_b: "allow_once"}
        order = [face_a, face_b] if i % 4 < 2 else [face_b, face_a]
        # Both leave at the same moment, before either reply is read.
        ids = await asyncio.gather(
            *(
                face.command(
                    "face.approval.resolve", approval_id=approval_id, decision=decisions[face]
                )
                for face in order
            )
        )
        sent = dict(zip(order, ids, strict=True))
        replies = await asyncio.gather(*(face.reply(sent[face]) for face in order))
        chat_result = await face_a.reply(chat_id, timeout=20)
        await face_b.expect(event("chat.completed", request_id=chat_id))

        assert [r["type"] for r in replies] == ["face.result", "face.result"], replies
        data = [r["payload"]["data"] for r in replies]
        outcomes = sorted(d["outcome"] for d in data)
        assert outcomes == ["already_resolved", "applied"], (i, data)
        winner = next(d for d in data if d["outcome"] == "applied")
        resolution = winner["resolution"]
        for d in data:
            assert d["resolution"] == resolution, (i, data)
        winning_face = principals[resolution["decided_by"]]
        winning_reply = replies[order.index(winning_face)]["payload"]["data"]
        assert winning_reply["outcome"] == "applied", "the winner is the one who decided"
        assert resolution["decision"] == decisions[winning_face]
        allowed = resolution["decision"] == "allow_once"
        assert resolution["status"] == ("allowed" if allowed else "denied")
        winners[resolution["decision"]] += 1

        # Everyone sees the same single approval.resolved.
        for face in (face_a, face_b):
            resolved = events_of(face.seen, "approval.resolved", approval_id=approval_id)
            assert len(resolved) == 1, (i, resolved)
            shown = resolved[0]["payload"]["data"]
            assert (shown["status"], shown["decision"], shown["decided_by"]) == (
                resolution["status"],
                resolution["decision"],
                resolution["decided_by"],
            )

        # The tool ran iff the winner allowed, and only after the audit row.
        tool_call_id = shown["tool_call_id"]
        completed = events_of(face_a.seen, "chat.tool_completed", tool_call_id=tool_call_id)
        assert len(completed) == 1
        runs = events_of(face_a.seen, "run.changed", tool_call_id=tool_call_id)
        if allowed:
            audit = dispatched.get(tool_call_id)
            assert audit is not None, "the approval row was not durable at dispatch"
            assert audit["status"] == "allowed" and audit["decided_at"] is not None
            assert audit["decided_by"] == resolution["decided_by"]
            assert completed[0]["payload"]["data"]["status"] == "succeeded"
            assert [r["payload"]["data"]["status"] for r in runs][-1] == "succeeded"
            assert chat_result["payload"]["content"].startswith("exec_command succeeded")
        else:
            assert tool_call_id not in dispatched
            assert runs == []
            assert completed[0]["payload"]["data"]["status"] == "denied"
            assert completed[0]["payload"]["data"]["error_category"] == "denied"
            assert chat_result["payload"]["content"].startswith("exec_command denied")
        assert chat_result["payload"]["status"] == "succeeded"
        stored = read_row(db, "approvals", "approval_id", approval_id)
        assert stored is not None
        assert (stored["status"], stored["decision"], stored["decided_by"]) == (
            resolution["status"],
            resolution["decision"],
            resolution["decided_by"],
        )
        face_a.seen.clear()
        face_b.seen.clear()

    # Decisions and send order alternate, so each decision must have won sometimes.
    assert winners["allow_once"] > 0 and winners["deny_once"] > 0, winners
    await face_a.close()
    await face_b.close()


async def test_replayed_resolve_returns_the_same_result(lmind: LocalMind) -> None:
    await hand_ready(lmind)
    async with operator(lmind) as face:
        cid = await face.create_conversation()
        await face.subscribe(cid)
        chat_id = await face.command("face.chat", conversation_id=cid, content=TRUE_TOOL)
        approval_id = await wait_approval(face, chat_id)
        resolve_id = await face.command(
            "face.approval.resolve", approval_id=approval_id, decision="allow_once"
        )
        first = await face.reply(resolve_id)
        assert first["payload"]["data"]["outcome"] == "applied"
        await face.reply(chat_id)
        # The same request again, after everything settled: the stored outcome.
        await face.command(
            "face.approval.resolve", resolve_id, approval_id=approval_id, decision="allow_once"
        )
        again = await face.reply(resolve_id)
        strip = {k: v for k, v in first["payload"].items() if k != "event_seq"}
        assert {k: v for k, v in again["payload"].items() if k != "event_seq"} == strip
        # The same request_id with another decision is a conflict, not a decision.
        await face.command(
            "face.approval.resolve", resolve_id, approval_id=approval_id, decision="deny_once"
        )
        conflict = await face.reply(resolve_id)
        assert conflict["type"] == "face.error"
        assert conflict["payload"]["code"] == "request_conflict"
        assert len(events_of(face.seen, "approval.resolved", approval_id=approval_id)) == 1


# -- expiry, cancel, refusals ---------------------------------------------------------------


HAND_TOOL = '/tool exec_command {"argv": ["true"], "hand": "dev"}'


async def waiting_approval(rig: Rig) -> tuple[Peer, Peer, str, str]:
    """A chat waiting for its approval: ``(face, hand, chat request_id, approval_id)``."""
    hand = await rig.hand("dev")
    face = await rig.face()
    cid = await rig.conversation(face)
    chat = await rig.command(face, "face.chat", conversation_id=cid, content=HAND_TOOL)
    check = await rig.take(hand, lambda f: f["type"] == "hand.check")
    hand.send("hand.checked", allow_check(check["payload"]))  # the Mind's floor asks
    requested = await rig.expect(face, event("approval.requested", request_id=chat))
    return face, hand, chat, requested["payload"]["data"]["approval_id"]


async def test_approval_expires_at_its_ttl_and_a_late_decision_is_refused(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        ttl = rig.mind.config.approval_ttl_s
        face, hand, chat, approval_id = await waiting_approval(rig)
        requested = await rig.expect(face, event("approval.requested"))
        assert requested["payload"]["data"]["expires_at"] == WALL0 + ttl

        rig.advance(ttl - 0.001)
        assert rig.mind.approvals.live[approval_id].state == "pending", "not before the TTL"
        rig.advance(0.001)
        resolved = await rig.expect(face, event("approval.resolved", approval_id=approval_id))
        assert resolved["payload"]["data"]["status"] == "expired"
        assert resolved["payload"]["data"]["decided_by"] is None
        assert resolved["payload"]["ts"] == WALL0 + ttl

        # The chat goes on: the tool did not run and the agent was told.
        result = await rig.reply(face, chat)
        assert result["payload"]["status"] == "succeeded"
        assert result["payload"]["content"].startswith("exec_command expired")
        completed = await rig.expect(face, event("chat.tool_completed", request_id=chat))
        assert completed["payload"]["data"]["status"] == "expired"
        assert completed["payload"]["data"]["success"] is False
        assert face.seen(event("run.changed")) == []
        assert hand.wire.of_type("hand.run") == []

        late = await rig.reply(face, await rig.command(
            face, "face.approval.resolve", approval_id=approval_id, decision="allow_once"))
        assert late["type"] == "face.error", late
        assert late["payload"]["code"] == "approval_expired"
        stored = read_row(rig.mind.config.db_path, "approvals", "approval_id", approval_id)
        assert stored is not None
        assert stored["status"] == "expired" and stored["decision"] is None
        assert stored["decided_at"] == WALL0 + ttl


async def test_a_decision_at_the_ttl_is_refused_even_before_the_timer_ran(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        face, hand, chat, approval_id = await waiting_approval(rig)
        approval = rig.mind.approvals.live[approval_id]
        rig.clock.now = T0 + rig.mind.config.approval_ttl_s  # no timer has run yet
        late = await rig.reply(face, await rig.command(
            face, "face.approval.resolve", approval_id=approval_id, decision="allow_once"))
        assert late["type"] == "face.error", late
        assert late["payload"]["code"] == "approval_expired"
        resolved = await rig.expect(face, event("approval.resolved", approval_id=approval_id))
        assert resolved["payload"]["data"]["status"] == "expired"
        assert approval.timer is not None and approval.timer.done  # called off, not run
        rig.advance(0.0)
        assert len(face.seen(event("approval.resolved", approval_id=approval_id))) == 1
        assert (await rig.reply(face, chat))["payload"]["content"].startswith(
            "exec_command expired")
        assert hand.wire.of_type("hand.run") == []


async def test_a_decision_just_before_the_ttl_applies_and_calls_the_timer_off(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        ttl = rig.mind.config.approval_ttl_s
        face, hand, _, approval_id = await waiting_approval(rig)
        rig.advance(ttl - 0.001)
        decided = await rig.reply(face, await rig.command(
            face, "face.approval.resolve", approval_id=approval_id, decision="allow_once"))
        assert decided["payload"]["data"]["outcome"] == "applied", decided
        await rig.take(hand, lambda f: f["type"] == "hand.run")
        rig.advance(1.0)
        resolved = face.seen(event("approval.resolved", approval_id=approval_id))
        assert [r["payload"]["data"]["status"] for r in resolved] == ["allowed"]


async def test_chat_cancel_cancels_the_pending_approval(lmind: LocalMind) -> None:
    await hand_ready(lmind)
    async with operator(lmind) as face:
        cid = await face.create_conversation()
        await face.subscribe(cid)
        chat_id = await face.command("face.chat", conversation_id=cid, content=TRUE_TOOL)
        approval_id = await wait_approval(face, chat_id)
        cancel_id = await face.command(
            "face.chat.cancel", conversation_id=cid, target_request_id=chat_id
        )
        resolved = await face.expect(event("approval.resolved", approval_id=approval_id))
        assert resolved["payload"]["data"]["status"] == "cancelled"
        chat_result = await face.reply(chat_id)
        assert chat_result["payload"]["status"] == "cancelled"
        cancel_result = await face.reply(cancel_id)
        assert cancel_result["payload"]["data"]["outcome"] == "cancelled"
        await face.expect(event("chat.cancelled", request_id=chat_id))
        completed = await face.expect(event("chat.tool_completed", request_id=chat_id))
        assert completed["payload"]["data"]["status"] == "cancelled"
        assert events_of(face.seen, "run.changed") == []
        # The order every Face sees: approval cancelled, tool completed, chat cancelled.
        types = [f["payload"]["type"] for f in face.seen if f["type"] == "face.event"]
        tail = [t for t in types if t in
                ("approval.resolved", "chat.tool_completed", "chat.cancelled")]
        assert tail == ["approval.resolved", "chat.tool_completed", "chat.cancelled"]

        # A decision that comes too late converges on the standing outcome.
        resolve_id = await face.command(
            "face.approval.resolve", approval_id=approval_id, decision="allow_once"
        )
        late = await face.reply(resolve_id)
        assert late["type"] == "face.result", late
        assert late["payload"]["data"]["outcome"] == "already_resolved"
        assert late["payload"]["data"]["resolution"]["status"] == "cancelled"
        stored = read_row(lmind.config.db_path, "approvals", "approval_id", approval_id)
        assert stored is not None and stored["status"] == "cancelled"
        assert events_of(face.seen, "run.changed") == []


async def test_resolving_an_unknown_approval_is_not_found(lmind: LocalMind) -> None:
    async with operator(lmind) as face:
        resolve_id = await face.command(
            "face.approval.resolve", approval_id="a_no_such_approval", decision="allow_once"
        )
        reply = await face.reply(resolve_id)
        assert reply["type"] == "face.error"
        assert reply["payload"]["code"] == "approval_not_found"


async def test_operator_without_approve_scope_is_forbidden(lmind: LocalMind) -> None:
    await hand_ready(lmind)
    added = await face_add(lmind.config.home, "no-approve")
    plain = await connect_new_credential(lmind.url, added.token)
    assert plain.welcome is not None
    assert "face:approve" not in plain.welcome["payload"]["scopes"]
    async with operator(lmind) as owner:
        cid = await owner.create_conversation()
        await owner.subscribe(cid)
        await plain.subscribe(cid)
        chat_id = await owner.command("face.chat", conversation_id=cid, content=TRUE_TOOL)
        approval_id = await wait_approval(plain, chat_id)
        resolve_id = await plain.command(
            "face.approval.resolve", approval_id=approval_id, decision="allow_once"
        )
        refused = await plain.reply(resolve_id)
        assert refused["type"] == "face.error"
        assert refused["payload"]["code"] == "forbidden"
        # Still pending: the refusal decided nothing.
        stored = read_row(lmind.config.db_path, "approvals", "approval_id", approval_id)
        assert stored is not None and stored["status"] == "pending"
        assert stored["decided_at"] is None
        snap_id = await owner.command("face.conversation.snapshot", conversation_id=cid)
        snap = await owner.reply(snap_id)
        pending = [a["approval_id"] for a in snap["payload"]["pending_approvals"]]
        assert pending == [approval_id]
        # The owner's decision is the one that counts.
        decide_id = await owner.command(
            "face.approval.resolve", approval_id=approval_id, decision="deny_once"
        )
        decided = await owner.reply(decide_id)
        assert decided["payload"]["data"]["outcome"] == "applied"
        await owner.reply(chat_id)
        await plain.expect(event("chat.completed", request_id=chat_id))
        resolved = events_of(plain.seen, "approval.resolved", approval_id=approval_id)
        assert [r["payload"]["data"]["decided_by"] for r in resolved] == [
            owner.welcome["payload"]["principal_id"]  # type: ignore[index]
        ]
    await plain.close()


# -- a cancel that lands while the tool call is being recorded ----------------------------


WINDOWS: dict[str, Callable[[WriteTx], bool]] = {
    "tool_called": lambda tx: any(c.status == "called" for c in tx.tool_calls),
    "approval_requested": lambda tx: any(a.status == "pending" for a in tx.approvals),
}


@pytest.mark.parametrize("window", sorted(WINDOWS))
async def test_chat_cancel_while_the_call_is_being_recorded_leaves_nothing_open(
    lmind: LocalMind, window: str
) -> None:
    await hand_ready(lmind)
    async with operator(lmind) as face:
        cid = await face.create_conversation()
        await face.subscribe(cid)
        held = HeldCommits(lmind.mind.store, WINDOWS[window])
        lmind.mind.store = held  # type: ignore[assignment]
        chat_id = await face.command("face.chat", conversation_id=cid, content=TRUE_TOOL)
        await held.arrived.wait()
        cancel_id = await face.command(
            "face.chat.cancel", conversation_id=cid, target_request_id=chat_id
        )
        # Accepted means the chat's task was told to stop, with the commit in flight.
        await face.reply(cancel_id, ("face.accepted",))
        await held.release()
        lmind.mind.store = held.inner
        chat = await face.reply(chat_id)
        assert chat["payload"]["status"] == "cancelled"
        await face.reply(cancel_id)
        after = await face.chat_to_end(cid, "still here")  # a barrier: the log moved on
        assert after["payload"]["status"] == "succeeded"

        # No silent gap: every durable event reached the subscriber.
        seqs = [seq for f in face.seen if f["type"] in ("face.event", "face.chat.delta")
                for seq in range(f["payload"].get("first_seq", f["payload"]["seq"]),
                                 f["payload"]["seq"] + 1)]
        assert seqs == list(range(1, seqs[-1] + 1)), seqs
        # Nothing left open: the call completed, no approval still pending.
        db = lmind.config.db_path
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            calls = conn.execute(
                "SELECT status, finished_at FROM tool_calls WHERE conversation_id = ?", (cid,)
            ).fetchall()
            approvals = conn.execute(
                "SELECT status FROM approvals WHERE conversation_id = ?", (cid,)
            ).fetchall()
        assert [status for status, _ in calls] == ["cancelled"]
        assert all(finished is not None for _, finished in calls)
        assert all(status != "pending" for (status,) in approvals), approvals
        snap_id = await face.command("face.conversation.snapshot", conversation_id=cid)
        snap = await face.reply(snap_id)
        assert [r["status"] for r in snap["payload"]["tool_history"]] == ["cancelled"]


# -- approvals across conversations (session-level news) -------------------------------------


def approval_news(type_: str, approval_id: str | None = None) -> Callable[[Any], bool]:
    def match(frame: dict[str, Any]) -> bool:
        return frame["type"] == type_ and (
            approval_id is None or frame["payload"]["approval_id"] == approval_id
        )

    return match


async def test_a_pending_approval_is_announced_to_faces_following_other_conversations(
    lmind: LocalMind,
) -> None:
    await hand_ready(lmind)
    async with operator(lmind) as owner, operator(lmind) as elsewhere:
        cid = await owner.create_conversation("deploy")
        await owner.subscribe(cid)
        other = await elsewhere.create_conversation("notes")
        await elsewhere.subscribe(other)  # follows another conversation only
        chat_id = await owner.command(
            "face.chat",
            conversation_id=cid,
            content='/tool exec_command {"argv": ["true"], "api_key": "k-42"}',
        )
        approval_id = await wait_approval(owner, chat_id)
        pending = await elsewhere.expect(approval_news("face.approval.pending", approval_id))
        summary = {k: v for k, v in pending["payload"].items() if k != "event_seq"}
        assert set(summary) == {
            "conversation_id",
            "approval_id",
            "request_id",
            "tool",
            "reason",
            "expires_at",
        }
        assert summary["conversation_id"] == cid
        assert summary["request_id"] == chat_id
        assert summary["tool"] == "exec_command"
        assert "k-42" not in str(pending)  # a summary: never the arguments

        listed_id = await elsewhere.command("face.approval.list")
        listed = (await elsewhere.reply(listed_id))["payload"]["data"]["approvals"]
        assert [a["approval_id"] for a in listed] == [approval_id]
        assert listed[0] == summary

        resolve_id = await elsewhere.command(
            "face.approval.resolve", approval_id=approval_id, decision="deny_once"
        )
        await elsewhere.reply(resolve_id)
        settled = await owner.expect(approval_news("face.approval.settled", approval_id))
        assert settled["payload"]["status"] == "denied"
        assert settled["payload"]["conversation_id"] == cid
        await elsewhere.expect(approval_news("face.approval.settled", approval_id))
        resolved = await owner.expect(event("approval.resolved", approval_id=approval_id))
        assert resolved["payload"]["data"]["decided_by_label"] == "local"
        await owner.reply(chat_id)

        listed_id = await elsewhere.command("face.approval.list")
        assert (await elsewhere.reply(listed_id))["payload"]["data"]["approvals"] == []


async def test_an_expired_approval_is_announced_as_settled(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        watcher = await rig.face()  # follows no conversation
        _, _, chat, approval_id = await waiting_approval(rig)
        pending = await rig.expect(watcher, approval_news("face.approval.pending", approval_id))
        assert pending["payload"]["request_id"] == chat
        assert pending["payload"]["expires_at"] == WALL0 + rig.mind.config.approval_ttl_s
        rig.advance(rig.mind.config.approval_ttl_s)
        settled = await rig.expect(watcher, approval_news("face.approval.settled", approval_id))
        assert settled["payload"]["status"] == "expired"
        listed = await rig.reply(watcher, await rig.command(watcher, "face.approval.list"))
        assert listed["payload"]["data"]["approvals"] == []
