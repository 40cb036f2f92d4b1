"""The outstanding-command table's rules (I6), as plain state."""

from __future__ import annotations

from typing import Any

import msgspec

from halfpi.core import wire
from halfpi.core.events import Snapshot
from halfpi.face.commands import command_of
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
    return Command(command_of(type_, {"request_id": request_id, **payload}), sent_gen=sent_gen)


def resolve(request_id: str, sent_gen: int | None = 1) -> Command:
    return command("face.approval.resolve", request_id, sent_gen, approval_id="a",
                   decision="allow_once")


def chat(request_id: str, content: str = "hi") -> Command:
    return command("face.chat", request_id, conversation_id="c_1", content=content)


def test_I6_settle_resends_the_unsent_and_the_replay_safe_and_reconciles_the_rest() -> None:
    table = Outstanding()
    unsent = table.add(resolve("a", sent_gen=None))
    safe = table.add(chat("b"))
    unsafe = table.add(resolve("c"))
    subscribe = wire.Subscribe(request_id="s", conversation_ids=["c_1"])
    own = table.add(Command(subscribe, SUBSCRIBE, sent_gen=1))
    plan = table.settle({"face.chat"})
    assert (plan.resend, plan.reconcile, plan.dropped) == ([unsent, safe], [unsafe], [own])
    # What is resent stays outstanding; what is reconciled or dropped does not.
    assert [c.request_id for c in table] == ["a", "b"]


def test_a_request_id_is_one_command() -> None:
    table = Outstanding()
    first = table.add(chat("q"))
    assert table.add(chat("q", content="other")) is first
    assert len(table) == 1


def test_only_a_chat_is_reconciled_by_reading_its_conversation() -> None:
    asked = chat("q")
    read = reconcile_read(asked, "r-1")
    assert read is not None and read.target is asked
    assert read.body == wire.ConversationSnapshot(request_id="r-1", conversation_id="c_1",
                                                  messages_limit=500)
    assert reconcile_read(resolve("a"), "r-2") is None


def snapshot(*messages: dict[str, Any]) -> Snapshot:
    return msgspec.convert({"conversation": {"id": "c_1"}, "cursor": "e.2", "epoch": "e",
                            "messages": list(messages)}, Snapshot)


def message(role: str, request_id: str, **more: Any) -> dict[str, Any]:
    return {"seq": 1, "role": role, "request_id": request_id, "content": f"{role} says", **more}


def test_a_reply_found_in_the_conversation_is_the_chats_result() -> None:
    snap = snapshot(message("user", "q"), message("assistant", "q", status="failed"))
    assert reconciled(chat("q"), snap) == Result("q", "failed", "assistant says",
                                                 reconciled=True)


def test_an_unknown_outcome_says_what_the_mind_shows() -> None:
    admitted = reconciled(chat("q"), snapshot(message("user", "q")))
    absent = reconciled(chat("q"), snapshot(message("user", "other")))
    unread = reconciled(chat("q"), None)
    assert isinstance(admitted, OutcomeUnknown) and "admitted it" in str(admitted)
    assert isinstance(absent, OutcomeUnknown) and "no admission" in str(absent)
    assert isinstance(unread, OutcomeUnknown) and "read the conversation" in str(unread)
