"""The request registry's decisions (DESIGN §5, I5): digest, decide, prune, replay."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from halfpi.core.limits import RequestRetention
from halfpi.core.requests import (
    Decision,
    Finished,
    RequestRecord,
    Tombstone,
    decide,
    payload_digest,
    prunable,
    replay_frames,
)
from halfpi.core.states import REQUEST_TERMINAL
from halfpi.core.wire import Chat, decode_command
from halfpi.errors import IllegalTransition


def _digest_of_frame(frame: str) -> str:
    type_, payload = decode_command(frame)
    return payload_digest(type_, payload)


def _record(digest: str = "d1", *, result: dict[str, object] | None = None) -> RequestRecord:
    return RequestRecord(
        principal_id="p_1",
        request_id="r_1",
        type="face.chat",
        digest=digest,
        status="accepted" if result is None else "succeeded",
        created_at=100.0,
        conversation_id="c_1",
        run_id="run_1",
        accepted={"request_id": "r_1", "operation": "chat", "conversation_id": "c_1"},
        result=result,
        finished_at=None if result is None else 110.0,
    )


def _tombstone(digest: str = "d1") -> Tombstone:
    return Tombstone(
        "p_1", "r_1", digest, {"request_id": "r_1", "status": "succeeded"}, expires_at=1e9
    )


# -- payload digest ------------------------------------------------------------


def test_digest_is_sha256_of_canonical_json() -> None:
    payload = {"request_id": "r1", "conversation_id": "c1", "content": "hi"}
    canonical = json.dumps(
        {"type": "face.chat", "payload": payload}, sort_keys=True, separators=(",", ":")
    ).encode()
    assert payload_digest("face.chat", payload) == hashlib.sha256(canonical).hexdigest()


def test_digest_ignores_key_order_and_whitespace() -> None:
    a = '{"type":"face.chat","payload":{"request_id":"r1","conversation_id":"c1","content":"hi"}}'
    b = (
        '{ "payload" : {\n  "content": "hi",\n  "conversation_id" : "c1",'
        ' "request_id":"r1" },\t"type": "face.chat" }'
    )
    assert _digest_of_frame(a) == _digest_of_frame(b)


def test_digest_of_struct_equals_digest_of_plain_data() -> None:
    struct = Chat(request_id="r1", conversation_id="c1", content="hi")
    plain = {"content": "hi", "request_id": "r1", "conversation_id": "c1"}
    assert payload_digest("face.chat", struct) == payload_digest("face.chat", plain)


@pytest.mark.parametrize(
    ("explicit", "omitted"),
    [
        (
            '{"type":"face.conversation.list","payload":{"request_id":"r","limit":50}}',
            '{"type":"face.conversation.list","payload":{"request_id":"r"}}',
        ),
        (
            '{"type":"face.conversation.create","payload":{"request_id":"r","name":null}}',
            '{"type":"face.conversation.create","payload":{"request_id":"r"}}',
        ),
        (
            '{"type":"face.subscribe","payload":{"request_id":"r","conversation_ids":["c"],'
            '"snapshot":false}}',
            '{"type":"face.subscribe","payload":{"request_id":"r","conversation_ids":["c"]}}',
        ),
    ],
)
def test_digest_explicit_default_equals_omitted(explicit: str, omitted: str) -> None:
    assert _digest_of_frame(explicit) == _digest_of_frame(omitted)


def test_digest_sorts_nested_keys() -> None:
    a = (
        '{"type":"face.subscribe","payload":{"request_id":"r","conversation_ids":["a","b"],'
        '"since":{"a":"e.1","b":"e.2"}}}'
    )
    b = (
        '{"type":"face.subscribe","payload":{"request_id":"r","conversation_ids":["a","b"],'
        '"since":{"b":"e.2","a":"e.1"}}}'
    )
    assert _digest_of_frame(a) == _digest_of_frame(b)


def test_digest_differs_for_different_payloads() -> None:
    base = {"request_id": "r1", "conversation_id": "c1", "content": "hi"}
    digests = {
        payload_digest("face.chat", base),
        payload_digest("face.chat", {**base, "content": "hi "}),
        payload_digest("face.chat", {**base, "conversation_id": "c2"}),
        payload_digest("face.chat", {**base, "request_id": "r2"}),
        payload_digest("face.chat.cancel", base),
    }
    assert len(digests) == 5


def test_digest_keeps_list_order() -> None:
    a = {"request_id": "r", "conversation_ids": ["a", "b"]}
    b = {"request_id": "r", "conversation_ids": ["b", "a"]}
    assert payload_digest("face.subscribe", a) != payload_digest("face.subscribe", b)


@given(
    payload=st.dictionaries(
        st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=6
    )
)
def test_digest_is_independent_of_insertion_order(payload: dict[str, object]) -> None:
    reversed_payload = dict(reversed(list(payload.items())))
    assert payload_digest("face.chat", payload) == payload_digest("face.chat", reversed_payload)


# -- decide --------------------------------------------------------------------


def test_I5_nothing_stored_is_new() -> None:
    assert decide(None, "d1") is Decision.NEW


def test_I5_same_digest_is_a_replay_of_an_accepted_record() -> None:
    assert decide(_record("d1"), "d1") is Decision.REPLAY


def test_I5_same_digest_is_a_replay_of_a_terminal_record() -> None:
    assert decide(_record("d1", result={"status": "succeeded"}), "d1") is Decision.REPLAY


def test_I5_different_digest_is_a_conflict() -> None:
    assert decide(_record("d1"), "d2") is Decision.CONFLICT


def test_I5_tombstone_with_same_digest_is_a_replay() -> None:
    assert decide(_tombstone("d1"), "d1") is Decision.REPLAY


def test_I5_tombstone_with_different_digest_is_a_conflict_never_new() -> None:
    assert decide(_tombstone("d1"), "d2") is Decision.CONFLICT


# -- replay frames ------------------------------------------------------------


def test_I5_replay_of_running_request_answers_the_original_accepted() -> None:
    record = _record()
    assert replay_frames(record) == [("face.accepted", record.accepted)]
    assert not record.terminal


def test_I5_replay_of_terminal_request_answers_the_stored_result() -> None:
    result = {"request_id": "r_1", "status": "succeeded", "content": "hello"}
    record = _record(result=result)
    assert record.terminal
    assert replay_frames(record) == [("face.result", result)]


def test_I5_replay_of_tombstone_answers_the_old_result() -> None:
    tomb = _tombstone()
    assert replay_frames(tomb) == [("face.result", tomb.result)]


# -- retention ----------------------------------------------------------------

RETENTION = RequestRetention(min_seconds=600.0, max_per_principal=2, tombstone_seconds=86_400.0)
NOW = 10_000.0


def _finished(*ages: float) -> list[Finished]:
    return [Finished(f"r{i}", NOW - age) for i, age in enumerate(ages)]


def test_young_records_are_kept_however_many() -> None:
    assert prunable(_finished(1, 2, 3, 4, 5, 599), NOW, RETENTION) == []


def test_old_records_beyond_the_newest_max_are_released() -> None:
    finished = _finished(650, 700, 800, 900, 1000)
    assert sorted(prunable(finished, NOW, RETENTION)) == ["r2", "r3", "r4"]


def test_old_records_within_the_newest_max_are_kept() -> None:
    assert prunable(_finished(700, 800), NOW, RETENTION) == []


def test_young_records_count_towards_the_newest_max() -> None:
    # Three young records fill the "newest 2"; both old ones go.
    finished = _finished(10, 20, 30, 700, 800)
    assert sorted(prunable(finished, NOW, RETENTION)) == ["r3", "r4"]


def test_a_record_is_kept_until_min_seconds_have_passed() -> None:
    finished = [Finished("a", NOW), Finished("b", NOW - 1), Finished("c", NOW - 599.5)]
    assert prunable(finished, NOW, RETENTION) == []
    assert prunable(finished, NOW + 0.5, RETENTION) == ["c"]


def test_prunable_ignores_input_order() -> None:
    finished = _finished(650, 700, 800, 900, 1000, 5, 7)
    expected = sorted(prunable(finished, NOW, RETENTION))
    rng = random.Random(7)
    for _ in range(10):
        rng.shuffle(finished)
        assert sorted(prunable(finished, NOW, RETENTION)) == expected


def test_prunable_of_nothing_is_nothing() -> None:
    assert prunable([], NOW, RETENTION) == []


def test_time_is_an_argument() -> None:
    finished = _finished(100, 200, 300)
    assert prunable(finished, NOW, RETENTION) == []
    assert prunable(finished, NOW + 10_000, RETENTION) == ["r2"]


@given(
    ages=st.lists(st.floats(min_value=0, max_value=2000), max_size=30),
    max_per_principal=st.integers(min_value=0, max_value=10),
)
def test_prunable_property(ages: list[float], max_per_principal: int) -> None:
    retention = RequestRetention(min_seconds=600.0, max_per_principal=max_per_principal)
    finished = [Finished(f"r{i}", NOW - age) for i, age in enumerate(ages)]
    pruned = set(prunable(finished, NOW, retention))
    newest_first = sorted(finished, key=lambda f: f.finished_at, reverse=True)
    for rank, f in enumerate(newest_first):
        old = NOW - f.finished_at >= 600.0
        assert (f.request_id in pruned) == (old and rank >= max_per_principal)


# -- the record's states move by the REQUEST table (accepted → terminal, once) --------


@pytest.mark.parametrize("status", sorted(REQUEST_TERMINAL))
def test_a_record_moves_from_accepted_to_the_status_of_its_result(status: str) -> None:
    record = _record()
    result = {"request_id": "r_1", "status": status}
    record.finish(result, 200.0)
    assert (record.status, record.result, record.finished_at) == (status, result, 200.0)
    assert record.terminal


def test_a_finished_record_never_moves_again() -> None:
    record = _record()
    record.finish({"request_id": "r_1", "status": "succeeded"}, 200.0)
    with pytest.raises(IllegalTransition):
        record.finish({"request_id": "r_1", "status": "failed"}, 300.0)
    assert (record.status, record.finished_at) == ("succeeded", 200.0)


@pytest.mark.parametrize("status", ["accepted", "running", "expired", "lost"])
def test_a_record_cannot_finish_with_a_status_that_is_not_a_request_outcome(
    status: str,
) -> None:
    record = _record()
    with pytest.raises(IllegalTransition):
        record.finish({"request_id": "r_1", "status": status}, 200.0)
    assert record.status == "accepted" and record.result is None
