"""The outstanding-command table's rules (I6), as plain state."""

from __future__ import annotations

from typing import Any

from halfpi.face.errors import OutcomeUnknown
from halfpi.face.outstanding import (
    SUBSCRIBE,
    Command,
    Outstanding,
    reconcile_read,
    reconciled,
)
from halfpi.face.results import Result


def command(type_: str, request_id: str, sent_gen: int | None = 1, **payload: Any) -> Command:
    return Command(type_, {"request_id": request_id, **payload}, sent_gen=sent_gen)


def test_I6_settle_resends_the_unsent_and_the_replay_safe_and_reconciles_the_rest() -> None:
    table = Outstanding()
    unsent = table.add(command("face.approval.resolve", "a", sent_gen=None))
    safe = table.add(command("face.chat", "b"))
    unsafe = table.add(command("face.approval.resolve", "c"))
    own = table.add(Command("face.subscribe", {"request_id": "s"}, SUBSCRIBE, sent_gen=1))
    plan = table.settle({"face.chat"})
    assert (plan.resend, plan.reconcile, plan.dropped) == ([unsent, safe], [unsafe], [own])
    # What is resent stays outstanding; what is reconciled or dropped does not.
    assert [c.request_id for c in table] == ["a", "b"]


def test_a_request_id_is_one_command() -> None:
    table = Outstanding()
    first = table.add(command("face.chat", "q"))
    assert table.add(command("face.chat", "q", content="other")) is first
    assert len(table) == 1


def test_only_a_chat_is_reconciled_by_reading_its_conversation() -> None:
    chat = command("face.chat", "q", conversation_id="c_1")
    read = reconcile_read(chat, "r-1")
    assert read is not None and read.target is chat
    assert read.payload == {"request_id": "r-1", "conversation_id": "c_1", "messages_limit": 500}
    assert reconcile_read(command("face.approval.resolve", "a"), "r-2") is None


def message(role: str, request_id: str, **more: Any) -> dict[str, Any]:
    return {"role": role, "request_id": request_id, "content": f"{role} says", **more}


def test_a_reply_found_in_the_conversation_is_the_chats_result() -> None:
    chat = command("face.chat", "q", conversation_id="c_1")
    snap = {"messages": [message("user", "q"), message("assistant", "q", status="failed")]}
    assert reconciled(chat, snap) == Result("q", "failed", "assistant says",
                                            data={"reconciled": True})


def test_an_unknown_outcome_says_what_the_mind_shows() -> None:
    chat = command("face.chat", "q", conversation_id="c_1")
    admitted = reconciled(chat, {"messages": [message("user", "q")]})
    absent = reconciled(chat, {"messages": [message("user", "other")]})
    unread = reconciled(chat, None)
    assert isinstance(admitted, OutcomeUnknown) and "admitted it" in str(admitted)
    assert isinstance(absent, OutcomeUnknown) and "no admission" in str(absent)
    assert isinstance(unread, OutcomeUnknown) and "read the conversation" in str(unread)
