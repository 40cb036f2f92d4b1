"""One conformance suite for every Store backend (STYLE §4).

A backend joins with one line in ``BACKENDS``: a :class:`BackendKind` that
names the store URL of a fresh, empty storage (the store itself comes from
the same factory the Mind and the CLI use, ``halfpi.wiring.make_store``)
and a way to hold its writer, so that what is queued meanwhile provably
lands in one group commit. Every method of the ``Store`` Protocol is
exercised here (a test below fails otherwise).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from halfpi.config import Config
from halfpi.core.limits import RequestRetention
from halfpi.core.requests import RequestRecord, Tombstone, replay_frames
from halfpi.core.tasks import task_digest
from halfpi.errors import HalfpiError, LabelInUse, StoreError, TerminalExists
from halfpi.mind import auth
from halfpi.store.base import (
    ApprovalRow,
    ChatRunRow,
    ConversationRow,
    Credential,
    Fence,
    FinishedRequest,
    MessageRow,
    Store,
    StoredEvent,
    TaskRow,
    TaskUpdate,
    TextAppend,
    ToolCallRow,
    ToolRunRow,
    TxOutcome,
    WriteTx,
)
from halfpi.store.sqlite import SQLiteStore
from halfpi.wiring import make_store
from tests.support.postgres import fresh_database, hold_postgres_writer

# -- backends --------------------------------------------------------------------


@dataclass(frozen=True)
class BackendKind:
    name: str
    url: Callable[[Path], str]  # the store URL of a fresh, empty storage under a tmp dir
    hold_writer: Callable[[Any], AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class Backend:
    kind: BackendKind
    config: Config

    def make(self) -> Any:
        """A new, unopened Store on the same storage (for restarts)."""
        return make_store(self.config)

    def hold_writer(self, store: Any) -> AbstractAsyncContextManager[None]:
        return self.kind.hold_writer(store)


class _HeldTx(WriteTx):
    """A no-op transaction whose evaluation parks the SQLite writer thread."""

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self._entered = entered
        self._release = release

    @property
    def only_events(self) -> bool:
        self._entered.set()
        self._release.wait(30)
        return True


@asynccontextmanager
async def _hold_sqlite_writer(store: SQLiteStore) -> AsyncIterator[None]:
    """While inside, the writer is busy with a batch of its own: everything
    written meanwhile waits in its queue and is taken as the next batch."""
    entered, release = threading.Event(), threading.Event()
    held = store.write(_HeldTx(entered, release))
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        yield
    finally:
        release.set()
        assert (await held).committed


SQLITE = BackendKind("sqlite", lambda tmp: f"sqlite://{tmp}/halfpi.db", _hold_sqlite_writer)
# A fresh database on the test run's PostgreSQL (skipped where none can run).
POSTGRES = BackendKind("postgres", lambda tmp: fresh_database(), hold_postgres_writer)

BACKENDS = [
    pytest.param(SQLITE, id="sqlite"),
    pytest.param(POSTGRES, id="postgres"),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    kind: BackendKind = request.param
    return Backend(kind, Config(home=tmp_path, store_url=kind.url(tmp_path)))


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Any]:
    s = backend.make()
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def other_handle(backend: Backend, store: Any) -> AsyncIterator[Any]:
    """A second Store on the same storage, opened while ``store`` is: what
    another process (the CLI while the Mind runs) sees and writes."""
    s = backend.make()
    await s.open()
    try:
        yield s
    finally:
        await s.close()


# -- builders --------------------------------------------------------------------


def record(
    request_id: str = "r_1",
    digest: str = "d_1",
    *,
    principal: str = "p_1",
    conversation: str | None = "c_1",
    created_at: float = 100.0,
) -> RequestRecord:
    return RequestRecord(
        principal_id=principal,
        request_id=request_id,
        type="face.chat",
        digest=digest,
        status="accepted",
        created_at=created_at,
        conversation_id=conversation,
        run_id=f"run_{request_id}",
        accepted={"request_id": request_id, "operation": "chat", "conversation_id": conversation},
    )


def stored(conv: str, seq: int, type_: str = "chat.message", ts: float = 100.0) -> StoredEvent:
    return StoredEvent(conv, seq, type_, b'{"n":%d}' % seq, ts)


def message_row(conv: str, seq: int, request_id: str | None = None) -> MessageRow:
    return MessageRow(conv, seq, "user", f"m{seq}", request_id, None, 100.0 + seq)


def chat_run_row(
    run_id: str,
    request_id: str = "r_1",
    *,
    conv: str = "c_1",
    started: float = 100.0,
    status: str = "running",
    principal: str = "p_1",
) -> ChatRunRow:
    return ChatRunRow(run_id, conv, request_id, principal, status, started)


def finished(
    request_id: str, at: float, *, principal: str = "p_1", status: str = "succeeded"
) -> FinishedRequest:
    return FinishedRequest(
        principal, request_id, status, {"request_id": request_id, "status": status}, at
    )


def conversation(conv: str, created_at: float = 100.0) -> ConversationRow:
    return ConversationRow(conv, f"name of {conv}", created_at, "p_1")


async def commit(store: Any, tx: WriteTx) -> TxOutcome:
    outcome: TxOutcome = await store.write(tx)
    return outcome


# -- admission (I5) ---------------------------------------------------------------


async def test_I5_admit_inserts_once(store: Any) -> None:
    rec = record()
    first = await commit(
        store,
        WriteTx(
            admit=rec,
            conversations=[conversation("c_1")],
            messages=[message_row("c_1", 1, request_id="r_1")],
            chat_runs=[chat_run_row("run_1")],
            events=[stored("c_1", 1), stored("c_1", 2, "chat.started")],
        ),
    )
    assert first.committed
    assert first.existing is None
    assert await store.get_request("p_1", "r_1") == rec


async def test_I5_second_admit_returns_the_existing_record_and_writes_nothing(store: Any) -> None:
    rec = record(digest="d_first")
    await commit(
        store,
        WriteTx(
            admit=rec,
            chat_runs=[chat_run_row("run_1")],
            events=[stored("c_1", 1)],
            messages=[message_row("c_1", 1)],
        ),
    )
    again = await commit(
        store,
        WriteTx(
            admit=record(digest="d_second"),
            conversations=[conversation("c_9")],
            messages=[message_row("c_1", 2)],
            chat_runs=[chat_run_row("run_2", started=200.0)],
            events=[stored("c_1", 2)],
            finished=[finished("r_1", 300.0)],
        ),
    )
    assert not again.committed
    assert isinstance(again.existing, RequestRecord)
    assert again.existing.digest == "d_first"
    assert again.existing == rec
    # Nothing else of the dropped transaction was written.
    assert await store.head_seq("c_1") == 1
    assert [
        m.seq
        for m in (await store.messages("c_1", limit=10, before_seq=None, max_seq=None)).messages
    ] == [1]
    assert (await store.chat_run_for_request("c_1", "r_1")).run_id == "run_1"
    assert await store.get_conversation("c_9") is None
    still = await store.get_request("p_1", "r_1")
    assert isinstance(still, RequestRecord)
    assert not still.terminal


async def test_I5_same_request_id_of_another_principal_is_a_separate_key(store: Any) -> None:
    assert (await commit(store, WriteTx(admit=record(principal="p_1")))).committed
    assert (await commit(store, WriteTx(admit=record(principal="p_2")))).committed
    assert (await store.get_request("p_2", "r_1")).principal_id == "p_2"


async def test_I5_racing_admits_in_one_batch_admit_once(store: Any, backend: Backend) -> None:
    async with backend.hold_writer(store):
        a = store.write(WriteTx(admit=record(digest="d_a"), events=[stored("c_1", 1)]))
        b = store.write(WriteTx(admit=record(digest="d_b"), events=[stored("c_1", 2)]))
    first, second = await a, await b
    assert first.committed
    assert not second.committed
    assert second.existing is not None and second.existing.digest == "d_a"
    assert [e.seq for e in await store.events("c_1", 0, 10)] == [1]


async def test_I5_admit_of_a_tombstoned_key_gets_the_tombstone(store: Any) -> None:
    retention = RequestRetention(min_seconds=10.0, max_per_principal=0, tombstone_seconds=1000.0)
    await commit(store, WriteTx(admit=record(digest="d_old")))
    await commit(store, WriteTx(finished=[finished("r_1", 200.0)]))
    assert await store.prune_requests(500.0, retention) == 1
    late = await commit(store, WriteTx(admit=record(digest="d_old"), events=[stored("c_1", 5)]))
    assert isinstance(late.existing, Tombstone)
    assert late.existing.digest == "d_old"
    assert await store.head_seq("c_1") == 0


async def test_I5_records_survive_a_restart(backend: Backend) -> None:
    first = backend.make()
    await first.open()
    rec = record()
    await commit(first, WriteTx(admit=rec, events=[stored("c_1", 1)]))
    await first.close()
    second = backend.make()
    await second.open()
    try:
        assert await second.get_request("p_1", "r_1") == rec
        assert await second.head_seq("c_1") == 1
        again = await commit(second, WriteTx(admit=record(digest="other")))
        assert again.existing == rec
    finally:
        await second.close()


# -- group commit ---------------------------------------------------------------------


async def test_concurrent_writes_are_grouped_and_all_committed(
    store: Any, backend: Backend
) -> None:
    n = 60
    before = store.batches
    async with backend.hold_writer(store):
        futures = [store.write(WriteTx(events=[stored("c_1", seq)])) for seq in range(1, n + 1)]
        futures += [
            store.write(
                WriteTx(admit=record(f"r_{i}"), chat_runs=[chat_run_row(f"run_{i}", f"r_{i}")])
            )
            for i in range(n)
        ]
    outcomes = await asyncio.gather(*futures)
    assert all(o.committed for o in outcomes)
    assert store.batches - before < 2 * n
    assert store.batches - before <= 2  # the held batch, then everything else at once
    assert [e.seq for e in await store.events("c_1", 0, 1000)] == list(range(1, n + 1))
    assert len(await store.open_requests()) == n
    assert len(await store.open_chat_runs()) == n


async def test_gathered_writes_all_commit(store: Any) -> None:
    outcomes = await asyncio.gather(
        *(store.write(WriteTx(events=[stored("c_2", seq)])) for seq in range(1, 201))
    )
    assert all(o.committed for o in outcomes)
    assert await store.head_seq("c_2") == 200
    assert store.batches <= 200


async def test_a_failing_tx_fails_only_its_own_future(store: Any, backend: Backend) -> None:
    await commit(store, WriteTx(messages=[message_row("c_1", 1)]))
    before = store.batches
    async with backend.hold_writer(store):
        ok_admit = store.write(WriteTx(admit=record("r_ok"), messages=[message_row("c_2", 1)]))
        bad = store.write(
            WriteTx(
                admit=record("r_bad"),
                chat_runs=[chat_run_row("run_bad", "r_bad")],
                events=[stored("c_1", 7)],
                messages=[message_row("c_1", 1)],  # duplicate primary key
            )
        )
        ok_events = store.write(WriteTx(events=[stored("c_3", 1)]))
        ok_conv = store.write(WriteTx(conversations=[conversation("c_3")]))
    results = await asyncio.gather(ok_admit, bad, ok_events, ok_conv, return_exceptions=True)
    assert store.batches - before == 2  # one held batch, then all four together
    assert isinstance(results[1], StoreError)
    assert all(isinstance(r, TxOutcome) and r.committed for i, r in enumerate(results) if i != 1)
    # The failing transaction left nothing behind; the others are all there.
    assert await store.get_request("p_1", "r_bad") is None
    assert await store.chat_run_for_request("c_1", "r_bad") is None
    assert await store.head_seq("c_1") == 0
    assert isinstance(await store.get_request("p_1", "r_ok"), RequestRecord)
    assert await store.head_seq("c_3") == 1
    assert await store.get_conversation("c_3") is not None


async def test_a_failing_event_append_fails_only_its_own_future(
    store: Any, backend: Backend
) -> None:
    await commit(store, WriteTx(events=[stored("c_1", 1)]))
    async with backend.hold_writer(store):
        bad = store.write(WriteTx(events=[stored("c_1", 1)]))  # duplicate seq
        ok_admit = store.write(WriteTx(admit=record("r_ok")))
        ok_events = store.write(WriteTx(events=[stored("c_2", 1)]))
    results = await asyncio.gather(bad, ok_admit, ok_events, return_exceptions=True)
    assert isinstance(results[0], StoreError)
    assert isinstance(results[1], TxOutcome) and results[1].committed
    assert isinstance(results[2], TxOutcome) and results[2].committed


async def test_a_meta_row_commits_and_the_last_commit_did_not_fail(store: Any) -> None:
    """The readiness probe's write (``/readyz``): a real row, set again in place."""
    assert store.last_commit_failed is False
    await commit(store, WriteTx(meta=[("readyz_probe", "1.0")]))
    await commit(store, WriteTx(meta=[("readyz_probe", "2.0")]))
    assert store.last_commit_failed is False


async def test_close_commits_what_is_queued(backend: Backend) -> None:
    first = backend.make()
    await first.open()
    pending = [first.write(WriteTx(events=[stored("c_1", seq)])) for seq in range(1, 21)]
    await first.close()
    assert all(o.committed for o in await asyncio.gather(*pending))
    second = backend.make()
    await second.open()
    try:
        assert await second.head_seq("c_1") == 20
    finally:
        await second.close()


async def test_write_after_close_raises(backend: Backend) -> None:
    s = backend.make()
    await s.open()
    await s.close()
    with pytest.raises(StoreError):
        s.write(WriteTx(events=[stored("c_1", 1)]))


# -- events -----------------------------------------------------------------------------


async def test_events_round_trip_in_seq_order(store: Any) -> None:
    written = [stored("c_1", seq, ts=100.0 + seq) for seq in range(1, 11)]
    await commit(store, WriteTx(events=written[5:]))
    await commit(store, WriteTx(events=written[:5]))
    await commit(store, WriteTx(events=[stored("c_2", 1)]))
    assert await store.events("c_1", 0, 100) == written
    assert await store.events("c_1", 3, 4) == written[3:7]
    assert await store.events("c_1", 10, 100) == []
    assert await store.head_seq("c_1") == 10
    assert await store.head_seq("c_2") == 1
    assert await store.head_seq("c_unknown") == 0


async def test_event_data_bytes_survive_unchanged(store: Any) -> None:
    data = '{"text":"h\\u00e9llo \u263a","nested":{"a":[1,2.5,null]}}'.encode()
    await commit(store, WriteTx(events=[StoredEvent("c_1", 1, "chat.message", data, 1.5)]))
    [event] = await store.events("c_1", 0, 1)
    assert event.data == data
    assert event.ts == 1.5


# -- messages ----------------------------------------------------------------------------


@pytest.fixture
async def messages_store(store: Any) -> Any:
    rows = [message_row("c_1", seq) for seq in range(2, 21, 2)]  # seqs 2, 4, …, 20
    await commit(store, WriteTx(messages=rows))
    await commit(store, WriteTx(messages=[message_row("c_2", 3)]))
    return store


async def _page(store: Any, **kwargs: Any) -> tuple[list[int], bool]:
    kwargs.setdefault("before_seq", None)
    kwargs.setdefault("max_seq", None)
    page = await store.messages("c_1", **kwargs)
    return [m.seq for m in page.messages], page.has_more_older


async def test_messages_round_trip(messages_store: Any) -> None:
    page = await messages_store.messages("c_2", limit=10, before_seq=None, max_seq=None)
    assert page.messages == [message_row("c_2", 3)]
    assert not page.has_more_older
    row = page.messages[0]
    assert (row.seq, row.role, row.content, row.request_id, row.status, row.ts) == (
        3, "user", "m3", None, None, 103.0
    )


async def test_a_reply_keeps_its_error_code_and_reason(store: Any) -> None:
    failed = MessageRow(
        "c_1", 4, "assistant", "half a", "r_1", "failed", 104.0, "agent_failed", "it broke"
    )
    await commit(store, WriteTx(messages=[failed]))
    page = await store.messages("c_1", limit=10, before_seq=None, max_seq=None)
    assert page.messages == [failed]
    assert page.messages[0].error_code == "agent_failed"
    assert page.messages[0].reason == "it broke"


async def test_messages_latest_page_is_oldest_first(messages_store: Any) -> None:
    assert await _page(messages_store, limit=3) == ([16, 18, 20], True)


async def test_messages_paging_with_before_seq(messages_store: Any) -> None:
    assert await _page(messages_store, limit=3, before_seq=16) == ([10, 12, 14], True)
    assert await _page(messages_store, limit=3, before_seq=9) == ([4, 6, 8], True)
    assert await _page(messages_store, limit=3, before_seq=8) == ([2, 4, 6], False)
    assert await _page(messages_store, limit=3, before_seq=4) == ([2], False)
    assert await _page(messages_store, limit=3, before_seq=2) == ([], False)


async def test_messages_limit_exactly_the_rest_has_no_more(messages_store: Any) -> None:
    assert await _page(messages_store, limit=10) == (list(range(2, 21, 2)), False)
    assert await _page(messages_store, limit=9) == (list(range(4, 21, 2)), True)


async def test_messages_max_seq_is_inclusive(messages_store: Any) -> None:
    assert await _page(messages_store, limit=3, max_seq=14) == ([10, 12, 14], True)
    assert await _page(messages_store, limit=3, max_seq=15) == ([10, 12, 14], True)
    assert await _page(messages_store, limit=3, max_seq=1) == ([], False)
    assert await _page(messages_store, limit=3, max_seq=0) == ([], False)


async def test_messages_before_seq_and_max_seq_take_the_tighter(messages_store: Any) -> None:
    assert await _page(messages_store, limit=3, before_seq=12, max_seq=15) == ([6, 8, 10], True)
    assert await _page(messages_store, limit=3, before_seq=18, max_seq=9) == ([4, 6, 8], True)


async def test_messages_of_an_unknown_conversation(store: Any) -> None:
    page = await store.messages("c_none", limit=5, before_seq=None, max_seq=None)
    assert (page.messages, page.has_more_older) == ([], False)


# -- runs and requests ------------------------------------------------------------------


async def test_chat_run_round_trip_and_upsert(store: Any) -> None:
    run = chat_run_row("run_1")
    await commit(store, WriteTx(chat_runs=[run]))
    assert await store.chat_run_for_request("c_1", "r_1") == run
    done = ChatRunRow("run_1", "c_1", "r_1", "p_1", "succeeded", 100.0, 150.0, "hello", None)
    await commit(store, WriteTx(chat_runs=[done]))
    assert await store.chat_run_for_request("c_1", "r_1") == done
    assert await store.open_chat_runs() == []


async def test_run_text_goes_on_the_end_of_the_saved_content(store: Any) -> None:
    # A text checkpoint after the first carries only the new text (DESIGN §5).
    await commit(store, WriteTx(chat_runs=[chat_run_row("run_1")]))
    await commit(store, WriteTx(run_text=[TextAppend("run_1", "héllo ")]))
    await commit(store, WriteTx(run_text=[TextAppend("run_1", "wörld")]))
    row = await store.chat_run_for_request("c_1", "r_1")
    assert (row.status, row.content) == ("running", "héllo wörld")
    # the run's end writes its whole text, as it always did
    done = ChatRunRow("run_1", "c_1", "r_1", "p_1", "succeeded", 100.0, 150.0, "all", None)
    await commit(store, WriteTx(chat_runs=[done]))
    assert await store.chat_run_for_request("c_1", "r_1") == done


async def test_chat_run_for_request_is_the_newest_of_any_principal(store: Any) -> None:
    await commit(store, WriteTx(chat_runs=[chat_run_row("run_a", started=100.0, principal="p_1")]))
    await commit(store, WriteTx(chat_runs=[chat_run_row("run_c", started=50.0, principal="p_1")]))
    await commit(store, WriteTx(chat_runs=[chat_run_row("run_b", started=200.0, principal="p_2")]))
    other = chat_run_row("run_x", "r_1", conv="c_other", started=900.0)
    await commit(store, WriteTx(chat_runs=[other]))
    assert (await store.chat_run_for_request("c_1", "r_1")).run_id == "run_b"
    assert await store.chat_run_for_request("c_1", "r_404") is None


async def test_open_chat_runs_are_the_unfinished_ones_oldest_first(store: Any) -> None:
    await commit(
        store,
        WriteTx(
            chat_runs=[
                chat_run_row("run_3", "r_3", started=300.0),
                chat_run_row("run_1", "r_1", started=100.0),
                ChatRunRow(
                    "run_2", "c_1", "r_2", "p_1", "failed", 200.0, 250.0, None, "agent_failed"
                ),
            ]
        ),
    )
    assert [r.run_id for r in await store.open_chat_runs()] == ["run_1", "run_3"]


async def test_open_requests_are_the_accepted_ones(store: Any) -> None:
    for i in range(3):
        await commit(store, WriteTx(admit=record(f"r_{i}")))
    await commit(store, WriteTx(finished=[finished("r_1", 200.0)]))
    assert sorted(r.request_id for r in await store.open_requests()) == ["r_0", "r_2"]


async def test_finished_request_moves_the_record_to_terminal(store: Any) -> None:
    await commit(store, WriteTx(admit=record()))
    result = {"request_id": "r_1", "status": "succeeded", "content": "hi"}
    await commit(
        store, WriteTx(finished=[FinishedRequest("p_1", "r_1", "succeeded", result, 150.0)])
    )
    rec = await store.get_request("p_1", "r_1")
    assert isinstance(rec, RequestRecord)
    assert rec.terminal
    assert (rec.status, rec.result, rec.finished_at) == ("succeeded", result, 150.0)
    assert replay_frames(rec) == [("face.result", result)]


async def test_I10_a_second_finish_does_not_overwrite_the_first(store: Any) -> None:
    await commit(store, WriteTx(admit=record()))
    await commit(store, WriteTx(finished=[finished("r_1", 150.0, status="succeeded")]))
    await commit(store, WriteTx(finished=[finished("r_1", 160.0, status="cancelled")]))
    rec = await store.get_request("p_1", "r_1")
    assert isinstance(rec, RequestRecord)
    assert (rec.status, rec.finished_at) == ("succeeded", 150.0)
    assert rec.result == {"request_id": "r_1", "status": "succeeded"}


# -- one outcome per run (I10, DESIGN §12) ------------------------------------------


def outcome(type_: str, seq: int, conv: str = "c_1", **data: Any) -> StoredEvent:
    return StoredEvent(conv, seq, type_, json.dumps(data).encode(), 100.0 + seq)


Outcome = tuple[str, dict[str, Any]]

# Each kind of run, its terminal event, and a second, contradicting one.
TERMINAL_PAIRS = [
    pytest.param(
        ("chat.completed", {"run_id": "run_1", "status": "succeeded"}),
        ("chat.interrupted", {"run_id": "run_1", "status": "interrupted"}),
        id="chat",
    ),
    pytest.param(
        ("chat.tool_completed", {"tool_call_id": "t_1", "status": "succeeded"}),
        ("chat.tool_completed", {"tool_call_id": "t_1", "status": "lost"}),
        id="tool_call",
    ),
    pytest.param(
        ("approval.resolved", {"approval_id": "a_1", "status": "allowed"}),
        ("approval.resolved", {"approval_id": "a_1", "status": "expired"}),
        id="approval",
    ),
    pytest.param(
        ("run.changed", {"run_id": "tr_1", "status": "succeeded"}),
        ("run.changed", {"run_id": "tr_1", "status": "lost"}),
        id="tool_run",
    ),
]


@pytest.mark.parametrize(("first", "second"), TERMINAL_PAIRS)
async def test_I10_the_store_refuses_a_second_terminal_event_for_one_run(
    store: Any, first: Outcome, second: Outcome
) -> None:
    await commit(store, WriteTx(events=[outcome(first[0], 1, **first[1])]))
    with pytest.raises(TerminalExists):
        await commit(store, WriteTx(events=[outcome(second[0], 2, **second[1])]))
    events = await store.events("c_1", 0, 10)
    assert [(e.seq, e.type) for e in events] == [(1, first[0])]


@pytest.mark.parametrize(("first", "second"), TERMINAL_PAIRS)
async def test_I10_a_refused_terminal_event_fails_only_its_own_write_in_a_group_commit(
    store: Any, backend: Backend, first: Outcome, second: Outcome
) -> None:
    async with backend.hold_writer(store):
        winner = store.write(WriteTx(events=[outcome(first[0], 1, **first[1])]))
        loser = store.write(WriteTx(events=[outcome(second[0], 2, **second[1])]))
        other = store.write(WriteTx(events=[stored("c_1", 3)]))
    results = await asyncio.gather(winner, loser, other, return_exceptions=True)
    assert isinstance(results[0], TxOutcome) and results[0].committed
    assert isinstance(results[1], TerminalExists)
    assert isinstance(results[2], TxOutcome) and results[2].committed
    assert [e.seq for e in await store.events("c_1", 0, 10)] == [1, 3]


async def test_terminal_events_of_different_runs_all_commit(store: Any) -> None:
    await commit(
        store,
        WriteTx(
            events=[
                outcome("chat.completed", 1, run_id="run_1"),
                outcome("chat.completed", 2, run_id="run_2"),
                outcome("run.changed", 3, run_id="run_1", status="succeeded"),  # a tool run
                outcome("chat.tool_completed", 4, tool_call_id="run_1"),
                outcome("approval.resolved", 5, approval_id="run_1", status="denied"),
            ]
        ),
    )
    assert len(await store.events("c_1", 0, 10)) == 5


async def test_a_tool_run_may_change_state_until_it_ends(store: Any) -> None:
    for seq, status in enumerate(["queued", "running", "running", "succeeded"], start=1):
        await commit(store, WriteTx(events=[outcome("run.changed", seq, run_id="tr_1",
                                                     status=status)]))
    with pytest.raises(TerminalExists):
        await commit(store, WriteTx(events=[outcome("run.changed", 5, run_id="tr_1",
                                                     status="timed_out")]))
    assert [e.seq for e in await store.events("c_1", 0, 10)] == [1, 2, 3, 4]


async def test_I10_a_refused_end_of_chat_leaves_the_first_end_whole(store: Any) -> None:
    """The end of a chat is one transaction (run, request, message, event):
    when its event is refused, none of the rest is written either."""
    await commit(store, WriteTx(admit=record(), chat_runs=[chat_run_row("run_1")]))
    first = ChatRunRow("run_1", "c_1", "r_1", "p_1", "succeeded", 100.0, 150.0, "hello", None)
    await commit(
        store,
        WriteTx(
            events=[outcome("chat.completed", 5, run_id="run_1")],
            chat_runs=[first],
            finished=[finished("r_1", 150.0)],
            messages=[MessageRow("c_1", 5, "assistant", "hello", "r_1", "succeeded", 150.0)],
        ),
    )
    with pytest.raises(TerminalExists):
        await commit(
            store,
            WriteTx(
                events=[outcome("chat.interrupted", 6, run_id="run_1")],
                chat_runs=[ChatRunRow("run_1", "c_1", "r_1", "p_1", "interrupted", 100.0, 160.0)],
                finished=[finished("r_1", 160.0, status="interrupted")],
                messages=[MessageRow("c_1", 6, "assistant", "", "r_1", "interrupted", 160.0)],
            ),
        )
    assert await store.chat_run_for_request("c_1", "r_1") == first
    rec = await store.get_request("p_1", "r_1")
    assert isinstance(rec, RequestRecord) and rec.status == "succeeded"
    page = await store.messages("c_1", limit=10, before_seq=None, max_seq=None)
    assert [m.seq for m in page.messages] == [5]
    assert await store.head_seq("c_1") == 5


def approval_row(status: str, decided_at: float | None) -> ApprovalRow:
    return ApprovalRow("a_1", "c_1", "r_1", "t_1", "exec_command", "why", "d", None,
                       "summary", status, 100.0, 220.0, decided_at=decided_at)


def tool_call_row(status: str, finished_at: float | None) -> ToolCallRow:
    return ToolCallRow("t_1", "c_1", "run_1", "r_1", "exec_command", "summary", "d", None, (),
                       1, status, 100.0, finished_at=finished_at)


def tool_run_row(status: str, finished_at: float | None) -> ToolRunRow:
    return ToolRunRow("tr_1", "t_1", "c_1", "local", "exec_command", status, 100.0, finished_at)


# Each kind of run row: open, ended, and ended otherwise.
ROW_STATES = [
    pytest.param("chat_runs", chat_run_row("run_1"),
                 ChatRunRow("run_1", "c_1", "r_1", "p_1", "succeeded", 100.0, 150.0),
                 ChatRunRow("run_1", "c_1", "r_1", "p_1", "interrupted", 100.0, 160.0), id="chat"),
    pytest.param("tool_runs", tool_run_row("running", None), tool_run_row("succeeded", 150.0),
                 tool_run_row("lost", 160.0), id="tool_run"),
    pytest.param("tool_calls", tool_call_row("called", None), tool_call_row("succeeded", 150.0),
                 tool_call_row("lost", 160.0), id="tool_call"),
    pytest.param("approvals", approval_row("pending", None), approval_row("allowed", 150.0),
                 approval_row("cancelled", 160.0), id="approval"),
]


@pytest.mark.parametrize(("field", "opened", "ended", "contradiction"), ROW_STATES)
async def test_I10_an_ended_row_keeps_its_terminal_status(
    store: Any, field: str, opened: Any, ended: Any, contradiction: Any
) -> None:
    """Even a write with no event cannot turn one outcome into another."""
    await commit(store, WriteTx(**{field: [opened]}))
    await commit(store, WriteTx(**{field: [ended]}))
    await commit(store, WriteTx(**{field: [ended]}))  # the same outcome again: harmless
    with pytest.raises(TerminalExists):
        await commit(store, WriteTx(**{field: [contradiction]}))


def test_terminal_exists_is_a_store_error_that_no_retry_can_fix() -> None:
    error = TerminalExists("chat:run_1")
    assert isinstance(error, StoreError)
    assert error.retryable is False
    assert StoreError("disk full").retryable is True


async def test_get_request_of_an_unknown_key_is_none(store: Any) -> None:
    assert await store.get_request("p_1", "r_404") is None


# -- retention (DESIGN §5) ------------------------------------------------------------------

RETENTION = RequestRetention(min_seconds=600.0, max_per_principal=2, tombstone_seconds=86_400.0)


async def _terminal(store: Any, request_id: str, at: float, principal: str = "p_1") -> None:
    await commit(
        store,
        WriteTx(
            admit=record(request_id, f"d_{request_id}", principal=principal, created_at=at - 1)
        ),
    )
    await commit(store, WriteTx(finished=[finished(request_id, at, principal=principal)]))


async def test_prune_turns_old_terminal_records_into_tombstones(store: Any) -> None:
    for i, at in enumerate([100.0, 200.0, 300.0, 400.0]):
        await _terminal(store, f"r_{i}", at)
    await commit(store, WriteTx(admit=record("r_open", created_at=0.0)))
    now = 2_000.0
    assert await store.prune_requests(now, RETENTION) == 2
    for request_id in ("r_0", "r_1"):
        tomb = await store.get_request("p_1", request_id)
        assert isinstance(tomb, Tombstone)
        assert tomb.digest == f"d_{request_id}"
        assert tomb.result == {"request_id": request_id, "status": "succeeded"}
        assert tomb.expires_at == now + RETENTION.tombstone_seconds
        assert replay_frames(tomb) == [("face.result", tomb.result)]
    for request_id in ("r_2", "r_3", "r_open"):
        assert isinstance(await store.get_request("p_1", request_id), RequestRecord)
    assert await store.prune_requests(now, RETENTION) == 0


async def test_prune_keeps_records_younger_than_min_seconds(store: Any) -> None:
    for i in range(5):
        await _terminal(store, f"r_{i}", 1_000.0 + i)
    assert await store.prune_requests(1_599.5, RETENTION) == 0
    assert await store.prune_requests(1_600.5, RETENTION) == 1
    assert isinstance(await store.get_request("p_1", "r_0"), Tombstone)
    assert isinstance(await store.get_request("p_1", "r_1"), RequestRecord)
    assert await store.prune_requests(1_602.5, RETENTION) == 2
    # r_3 and r_4 are old too, but they are the newest max_per_principal.
    assert await store.prune_requests(9_999.0, RETENTION) == 0
    kinds = [type(await store.get_request("p_1", f"r_{i}")) for i in range(5)]
    assert kinds == [Tombstone, Tombstone, Tombstone, RequestRecord, RequestRecord]


async def test_prune_counts_per_principal(store: Any) -> None:
    for i in range(2):
        await _terminal(store, f"r_{i}", 100.0, principal="p_a")
    for i in range(3):
        await _terminal(store, f"r_{i}", 100.0 + i, principal="p_b")
    assert await store.prune_requests(5_000.0, RETENTION) == 1
    assert isinstance(await store.get_request("p_b", "r_0"), Tombstone)
    assert isinstance(await store.get_request("p_a", "r_0"), RequestRecord)


async def test_prune_never_touches_accepted_records(store: Any) -> None:
    for i in range(5):
        await commit(store, WriteTx(admit=record(f"r_{i}", created_at=0.0)))
    assert await store.prune_requests(1e9, RETENTION) == 0
    assert len(await store.open_requests()) == 5


async def test_tombstones_expire(store: Any) -> None:
    retention = RequestRetention(min_seconds=10.0, max_per_principal=0, tombstone_seconds=100.0)
    await _terminal(store, "r_1", 0.0)
    assert await store.prune_requests(50.0, retention) == 1
    assert isinstance(await store.get_request("p_1", "r_1"), Tombstone)
    await store.prune_requests(150.0, retention)  # expires_at 150: not yet past
    assert isinstance(await store.get_request("p_1", "r_1"), Tombstone)
    await store.prune_requests(150.5, retention)
    assert await store.get_request("p_1", "r_1") is None


# -- conversations -----------------------------------------------------------------------------


async def test_conversations_round_trip_and_page_by_id(store: Any) -> None:
    rows = [conversation(f"c_{i:03d}", created_at=float(i)) for i in range(5)]
    await commit(store, WriteTx(conversations=rows))
    assert await store.get_conversation("c_002") == rows[2]
    assert await store.get_conversation("c_404") is None
    assert await store.list_conversations(2, None) == [rows[4], rows[3]]
    assert await store.list_conversations(2, "c_003") == [rows[2], rows[1]]
    assert await store.list_conversations(10, "c_001") == [rows[0]]


async def test_a_conversation_name_changes_in_place(store: Any) -> None:
    await commit(store, WriteTx(conversations=[conversation("c_1"), conversation("c_2")]))
    await commit(store, WriteTx(conversation_names=[("c_1", "plans")]))
    renamed = await store.get_conversation("c_1")
    assert renamed == ConversationRow("c_1", "plans", 100.0, "p_1")
    assert await store.get_conversation("c_2") == conversation("c_2")
    assert [r.name for r in await store.list_conversations(10, None)] == ["name of c_2", "plans"]


async def test_a_new_conversation_has_no_epoch_until_one_is_written(store: Any) -> None:
    """The epoch (DESIGN §3) is the Store's: the Mind writes one when the
    journal starts a new window of continuity for the conversation."""
    await commit(store, WriteTx(conversations=[conversation("c_1"), conversation("c_2")]))
    assert (await store.get_conversation("c_1")).epoch is None
    await commit(store, WriteTx(epochs=[("c_1", "e1")]))
    assert (await store.get_conversation("c_1")).epoch == "e1"
    assert (await store.get_conversation("c_2")).epoch is None
    await commit(store, WriteTx(epochs=[("c_1", "e2")]))
    assert await store.get_conversation("c_1") == dataclasses.replace(
        conversation("c_1"), epoch="e2"
    )
    listed = {r.conversation_id: r.epoch for r in await store.list_conversations(10, None)}
    assert listed == {"c_1": "e2", "c_2": None}


async def test_a_conversation_keeps_its_epoch_across_a_restart(backend: Backend) -> None:
    first = backend.make()
    await first.open()
    await commit(first, WriteTx(conversations=[conversation("c_1")], epochs=[("c_1", "e1")]))
    await first.close()
    second = backend.make()
    await second.open()
    try:
        assert (await second.get_conversation("c_1")).epoch == "e1"
    finally:
        await second.close()


async def test_an_epoch_rides_a_write_with_events_without_being_merged_away(store: Any) -> None:
    await commit(store, WriteTx(conversations=[conversation("c_1")]))
    tx = WriteTx(events=[stored("c_1", 1)], epochs=[("c_1", "e1")])
    assert not tx.only_events
    await commit(store, tx)
    assert (await store.get_conversation("c_1")).epoch == "e1"
    assert [e.seq for e in await store.events("c_1", 0, 10)] == [1]


async def test_a_duplicate_conversation_fails_its_tx(store: Any) -> None:
    await commit(store, WriteTx(conversations=[conversation("c_1")]))
    with pytest.raises(StoreError):
        await commit(store, WriteTx(admit=record(), conversations=[conversation("c_1")]))
    assert await store.get_request("p_1", "r_1") is None


# -- credentials ------------------------------------------------------------------------------


def face_credential(
    label: str, principal: str, *, created_at: float = 1.0, token_hash: str | None = None
) -> Credential:
    return Credential(
        principal_id=principal,
        label=label,
        kind="face",
        profile="operator",
        scopes=frozenset({"face:chat", "face:sessions:read"}),
        token_hash=token_hash or f"hash_{principal}",
        created_at=created_at,
    )


async def test_credentials_add_list_and_version(store: Any) -> None:
    assert await store.credentials() == []
    v0 = await store.credentials_version()
    a = face_credential("laptop", "p_a", created_at=1.0)
    b = face_credential("phone", "p_b", created_at=2.0)
    await store.add_credential(a)
    assert await store.credentials_version() == v0 + 1
    await store.add_credential(b)
    assert await store.credentials_version() == v0 + 2
    assert await store.credentials() == [a, b]
    assert all(c.live for c in await store.credentials())


async def test_a_live_label_is_unique_per_kind(store: Any) -> None:
    await store.add_credential(face_credential("laptop", "p_a"))
    version = await store.credentials_version()
    with pytest.raises(LabelInUse) as refused:
        await store.add_credential(face_credential("laptop", "p_b"))
    assert str(refused.value) == "a live face credential labelled 'laptop' already exists"
    assert await store.credentials_version() == version
    hand = Credential("p_h", "laptop", "hand", "hand", frozenset(), "hash_h", 2.0)
    await store.add_credential(hand)
    assert {c.kind for c in await store.credentials()} == {"face", "hand"}


async def test_a_reused_token_hash_is_a_store_error_not_a_label_in_use(store: Any) -> None:
    await store.add_credential(face_credential("laptop", "p_a", token_hash="same"))
    with pytest.raises(StoreError) as refused:
        await store.add_credential(face_credential("phone", "p_b", token_hash="same"))
    assert not isinstance(refused.value, LabelInUse)
    assert [c.principal_id for c in await store.credentials()] == ["p_a"]


async def test_revocation_bumps_the_version_and_frees_the_label(store: Any) -> None:
    await store.add_credential(face_credential("laptop", "p_old"))
    version = await store.credentials_version()
    assert await store.revoke_credential("face", "laptop", 50.0) is True
    assert await store.credentials_version() == version + 1
    [old] = await store.credentials()
    assert (old.revoked_at, old.live) == (50.0, False)
    # Revoking again changes nothing; nor does revoking another kind's label.
    assert await store.revoke_credential("face", "laptop", 60.0) is False
    assert await store.revoke_credential("hand", "laptop", 60.0) is False
    assert await store.revoke_credential("face", "nobody", 60.0) is False
    assert await store.credentials_version() == version + 1
    # The label is free again, under a new principal.
    await store.add_credential(face_credential("laptop", "p_new", created_at=70.0))
    creds = await store.credentials()
    assert [(c.principal_id, c.live) for c in creds] == [("p_old", False), ("p_new", True)]


async def test_revocation_revokes_only_that_kind(store: Any) -> None:
    await store.add_credential(face_credential("box", "p_face"))
    await store.add_credential(Credential("p_hand", "box", "hand", "hand", frozenset(), "h", 2.0))
    assert await store.revoke_credential("hand", "box", 5.0)
    assert {c.principal_id: c.live for c in await store.credentials()} == {
        "p_face": True,
        "p_hand": False,
    }


async def test_I8_a_change_by_another_process_moves_the_version_it_polls(
    store: Any, other_handle: Any
) -> None:
    """The Mind polls ``credentials_version`` and re-reads when it moved: a
    credential added or revoked through another handle on the same storage
    (the CLI, while the Mind runs) must move it, and be read back."""
    seen = await store.credentials_version()
    await other_handle.add_credential(face_credential("phone", "p_phone"))
    assert await store.credentials_version() != seen
    seen = await store.credentials_version()
    assert [c.principal_id for c in await store.credentials()] == ["p_phone"]
    assert await other_handle.revoke_credential("face", "phone", 9.0)
    assert await store.credentials_version() != seen
    [revoked] = await store.credentials()
    assert revoked.revoked_at == 9.0
    # …and the label is free on both handles.
    await store.add_credential(face_credential("phone", "p_again", created_at=10.0))
    with pytest.raises(LabelInUse):
        await other_handle.add_credential(face_credential("phone", "p_third", created_at=11.0))


async def test_I8_added_credentials_get_fresh_principals(store: Any) -> None:
    added = await auth.add_credential(store, "face", "laptop", "operator", 10.0, approve=True)
    assert added.token.startswith("hpf_")
    assert added.credential.token_hash == auth.hash_token(added.token)
    assert "face:approve" in added.credential.scopes
    with pytest.raises(LabelInUse, match="already exists"):
        await auth.add_credential(store, "face", "laptop", "observer", 11.0)
    assert await store.revoke_credential("face", "laptop", 12.0)
    again = await auth.add_credential(store, "face", "laptop", "observer", 13.0)
    assert again.credential.principal_id != added.credential.principal_id
    assert again.token != added.token
    stored_creds = {c.principal_id: c for c in await store.credentials()}
    assert stored_creds[added.credential.principal_id].revoked_at == 12.0
    assert stored_creds[again.credential.principal_id] == again.credential


async def test_an_unknown_scope_is_refused_before_the_store_is_touched(store: Any) -> None:
    version = await store.credentials_version()
    with pytest.raises(ValueError, match="unknown scopes"):
        await auth.add_credential(store, "face", "x", "operator", 1.0, extra_scopes=("face:fly",))
    assert await store.credentials_version() == version
    assert await store.credentials() == []


async def test_I8_credential_cache_follows_the_store(store: Any) -> None:
    face = await auth.add_credential(store, "face", "laptop", "operator", 10.0)
    hand = await auth.add_credential(store, "hand", "box", "hand", 10.0)
    cache = auth.CredentialCache()
    assert cache.load(await store.credentials(), await store.credentials_version()) == set()
    assert cache.authenticate(face.token, "face") == face.credential
    assert cache.authenticate(face.token, "hand") is None  # a Face token is not a Hand token
    assert cache.authenticate(hand.token, "hand") == hand.credential
    assert cache.authenticate("hpf_wrong", "face") is None
    assert cache.has_face()

    await store.revoke_credential("face", "laptop", 20.0)
    gone = cache.load(await store.credentials(), await store.credentials_version())
    assert gone == {face.credential.principal_id}
    assert cache.authenticate(face.token, "face") is None
    assert cache.get(face.credential.principal_id) is None
    assert cache.get(hand.credential.principal_id) == hand.credential


# -- tool calls, approvals and tool runs (DESIGN §6 to §8) ------------------------------


def full_tool_call(tool_call_id: str, called_seq: int, *, conv: str = "c_1") -> ToolCallRow:
    return ToolCallRow(
        tool_call_id, conv, "run_1", "r_1", "exec_command", "transparent", f"d_{tool_call_id}",
        {"command": "ls", "nested": [1, None]}, ("looks like a secret",), called_seq, "called",
        100.0 + called_seq, hand_id="local", run_id=f"tr_{tool_call_id}",
    )


async def test_tool_history_is_the_newest_calls_up_to_a_seq_oldest_first(store: Any) -> None:
    calls = [full_tool_call(f"t_{n}", n) for n in (2, 4, 6, 8)]
    await commit(store, WriteTx(tool_calls=[*calls, full_tool_call("t_x", 3, conv="c_2")]))
    assert await store.tool_history("c_1", max_seq=100, limit=10) == calls
    assert await store.tool_history("c_1", max_seq=6, limit=2) == calls[1:3]
    assert await store.tool_history("c_1", max_seq=1, limit=10) == []
    assert await store.tool_history("c_none", max_seq=100, limit=10) == []


async def test_a_tool_call_record_is_completed_in_place(store: Any) -> None:
    called = full_tool_call("t_1", 5)
    await commit(store, WriteTx(tool_calls=[called]))
    assert await store.open_tool_calls() == [called]
    done = dataclasses.replace(
        called, status="succeeded", success=True, output_bytes=12, digest="sha",
        truncated=False, result={"stdout": "a\n"}, completed_seq=7, finished_at=150.0,
    )
    await commit(store, WriteTx(tool_calls=[done]))
    assert await store.tool_history("c_1", max_seq=10, limit=10) == [done]
    assert await store.open_tool_calls() == []


async def test_approvals_round_trip_and_open_ones_are_undecided(store: Any) -> None:
    pending = ApprovalRow("a_1", "c_1", "r_1", "t_1", "exec_command", "why", "d",
                          {"command": "rm -rf /tmp/x"}, "transparent", "pending", 100.0, 220.0)
    other = dataclasses.replace(approval_row("pending", None), approval_id="a_2")
    await commit(store, WriteTx(approvals=[pending, other]))
    assert await store.get_approval("a_1") == pending
    assert await store.get_approval("a_404") is None
    assert sorted(a.approval_id for a in await store.open_approvals()) == ["a_1", "a_2"]
    decided = dataclasses.replace(
        pending, status="allowed", decision="allow_once", decided_by="p_1",
        decision_reason="fine", decided_at=130.0,
    )
    await commit(store, WriteTx(approvals=[decided]))
    assert await store.get_approval("a_1") == decided
    assert [a.approval_id for a in await store.open_approvals()] == ["a_2"]


async def test_fence_of_is_the_highest_token_a_write_carried_where_the_store_fences(
    backend: Backend, store: Any
) -> None:
    assert await store.fence_of("c_1") == 0
    await store.write(WriteTx(fence=Fence("c_1", 3)))
    await store.write(WriteTx(fence=Fence("c_1", 7)))
    # PostgreSQL keeps the highest token (a new owner asks its lease for a
    # larger one); SQLite fences nothing (one Mind per home).
    assert await store.fence_of("c_1") == (7 if backend.config.postgres else 0)
    assert await store.fence_of("c_2") == 0


async def test_tool_runs_round_trip_and_open_ones_are_unfinished(store: Any) -> None:
    running = tool_run_row("running", None)
    await commit(store, WriteTx(tool_runs=[running]))
    assert await store.get_tool_run("tr_1") == running
    assert await store.get_tool_run("tr_404") is None
    assert await store.open_tool_runs() == [running]
    done = ToolRunRow("tr_1", "t_1", "c_1", "local", "exec_command", "succeeded", 100.0, 150.0,
                      0, 42, "sha")
    await commit(store, WriteTx(tool_runs=[done]))
    assert await store.get_tool_run("tr_1") == done
    assert await store.open_tool_runs() == []


# -- the background tasks' outbox (DESIGN §8) ------------------------------------------


def task_row(
    task_id: str = "k_1",
    *,
    delivery_id: str | None = None,
    conv: str = "c_1",
    hand: str = "h_1",
    created: float = 100.0,
    due: float | None = None,
    request_id: str = "r_1",
) -> TaskRow:
    args = {"command": "make test", "env": {"CI": "1"}, "n": [1, 2.5, None]}
    return TaskRow(
        task_id=task_id,
        delivery_id=delivery_id or f"dl_{task_id}",
        conversation_id=conv,
        hand_id=hand,
        hand_label=f"label of {hand}",
        tool="exec_command",
        args=args,
        timeout_s=600.0,
        digest=task_digest("exec_command", args, 600.0),
        detail_mode="transparent",
        principal_id="p_1",
        request_id=request_id,
        created_at=created,
        next_attempt_at=created if due is None else due,
        approved=True,
    )


def task_event(seq: int, task_id: str = "k_1", state: str = "queued") -> StoredEvent:
    return outcome("task.changed", seq, task_id=task_id, state=state)


async def test_a_task_is_created_with_its_admission_and_its_event_in_one_transaction(
    store: Any,
) -> None:
    task = task_row()
    first = await commit(
        store, WriteTx(admit=record(), tasks=[task], events=[task_event(1)])
    )
    assert first.committed
    assert await store.get_task("k_1") == task
    assert await store.task_for_delivery("dl_k_1") == task
    assert task.state == "queued" and task.attempts == 0 and task.updated_at == 100.0
    assert [e.type for e in await store.events("c_1", 0, 10)] == ["task.changed"]
    assert await store.get_task("k_404") is None
    assert await store.task_for_delivery("dl_404") is None


async def test_I5_a_replayed_admission_creates_no_second_task(store: Any) -> None:
    await commit(store, WriteTx(admit=record(), tasks=[task_row("k_1")], events=[task_event(1)]))
    again = await commit(
        store,
        WriteTx(admit=record(), tasks=[task_row("k_2")], events=[task_event(2, "k_2")]),
    )
    assert not again.committed
    assert await store.get_task("k_2") is None
    assert [t.task_id for t in await store.list_tasks(limit=10)] == ["k_1"]
    assert await store.head_seq("c_1") == 1


async def test_a_task_in_a_write_that_fails_is_not_created(store: Any) -> None:
    await commit(store, WriteTx(events=[stored("c_1", 1)]))
    with pytest.raises(StoreError):
        await commit(store, WriteTx(admit=record(), tasks=[task_row()], events=[task_event(1)]))
    assert await store.get_task("k_1") is None
    assert await store.get_request("p_1", "r_1") is None
    assert await store.due_tasks(1_000.0, 10) == []


async def test_a_delivery_id_belongs_to_one_task_only(store: Any, backend: Backend) -> None:
    first = task_row("k_1", delivery_id="dl_same")
    await commit(store, WriteTx(admit=record("r_1"), tasks=[first], events=[task_event(1)]))
    async with backend.hold_writer(store):
        second = store.write(
            WriteTx(
                admit=record("r_2"),
                tasks=[task_row("k_2", delivery_id="dl_same", request_id="r_2")],
                events=[task_event(2, "k_2")],
            )
        )
        other = store.write(
            WriteTx(tasks=[task_row("k_3", request_id="r_3")], events=[task_event(3, "k_3")])
        )
    results = await asyncio.gather(second, other, return_exceptions=True)
    assert isinstance(results[0], StoreError) and not isinstance(results[0], TerminalExists)
    assert isinstance(results[1], TxOutcome) and results[1].committed
    # The refused write left nothing behind: no task, no admission, no event.
    assert await store.get_task("k_2") is None
    assert await store.get_request("p_1", "r_2") is None
    assert await store.task_for_delivery("dl_same") == first
    assert [e.seq for e in await store.events("c_1", 0, 10)] == [1, 3]


async def test_a_task_id_is_created_once(store: Any) -> None:
    await commit(store, WriteTx(tasks=[task_row("k_1")]))
    with pytest.raises(StoreError):
        await commit(store, WriteTx(tasks=[task_row("k_1", delivery_id="dl_other")]))
    assert await store.task_for_delivery("dl_other") is None


async def test_a_task_moves_by_its_table_from_delivery_to_its_end(store: Any) -> None:
    task = task_row()
    await commit(store, WriteTx(tasks=[task]))
    receipt = {"delivery_id": "dl_k_1", "task_id": "ht_1", "state": "queued",
               "deduplicated": False, "received_at": 5.0}
    await commit(store, WriteTx(task_updates=[TaskUpdate(
        "k_1", 101.0, attempts=1, next_attempt_at=103.0, delivered_at=101.5,
        hand_task_id="ht_1", answer=receipt)]))
    await commit(store, WriteTx(task_updates=[TaskUpdate(
        "k_1", 102.0, state="running", started_at=6.0, delivered_at=999.0)]))
    ended = TaskUpdate("k_1", 110.0, state="succeeded", ended_at=9.0, exit_code=0,
                       log_bytes=12, log_truncated=False)
    await commit(store, WriteTx(task_updates=[ended], events=[task_event(1, state="succeeded")]))
    got = await store.get_task("k_1")
    assert got == dataclasses.replace(
        task, state="succeeded", attempts=1, next_attempt_at=103.0, updated_at=110.0,
        delivered_at=101.5, hand_task_id="ht_1", answer=receipt, started_at=6.0,
        ended_at=9.0, exit_code=0, log_bytes=12, log_truncated=False,
    )
    assert got is not None and got.terminal


async def test_I10_the_first_terminal_state_of_a_task_wins(store: Any) -> None:
    await commit(store, WriteTx(tasks=[task_row()]))
    await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 101.0, state="running")]))
    await commit(store, WriteTx(task_updates=[TaskUpdate(
        "k_1", 110.0, state="succeeded", ended_at=9.0, exit_code=0)]))
    won = await store.get_task("k_1")
    # The same end again (a Hand re-sending its snapshot) is harmless and
    # changes nothing of the outcome; the answer it carries is recorded.
    await commit(store, WriteTx(task_updates=[TaskUpdate(
        "k_1", 120.0, state="succeeded", ended_at=12.0, exit_code=3, error="late",
        answer={"again": True})]))
    again = await store.get_task("k_1")
    assert again == dataclasses.replace(won, updated_at=120.0, answer={"again": True})
    # Another end is refused, with everything its write carried.
    for contradiction in ("cancelled", "lost", "failed"):
        with pytest.raises(TerminalExists):
            await commit(store, WriteTx(
                task_updates=[TaskUpdate("k_1", 130.0, state=contradiction, ended_at=13.0)],
                events=[task_event(1, state=contradiction)],
            ))
    assert await store.get_task("k_1") == again
    assert await store.head_seq("c_1") == 0


async def test_I10_a_cancel_racing_a_completion_in_one_group_commit_converges(
    store: Any, backend: Backend
) -> None:
    await commit(store, WriteTx(tasks=[task_row()]))
    await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 101.0, state="running")]))
    async with backend.hold_writer(store):
        done = store.write(WriteTx(
            task_updates=[TaskUpdate("k_1", 110.0, state="succeeded", exit_code=0)],
            events=[task_event(1, state="succeeded")],
        ))
        cancel = store.write(WriteTx(
            task_updates=[TaskUpdate("k_1", 111.0, state="cancelled")],
            events=[task_event(2, state="cancelled")],
        ))
    results = await asyncio.gather(done, cancel, return_exceptions=True)
    assert isinstance(results[0], TxOutcome) and results[0].committed
    assert isinstance(results[1], TerminalExists)
    got = await store.get_task("k_1")
    assert got is not None and (got.state, got.exit_code) == ("succeeded", 0)
    assert [e.seq for e in await store.events("c_1", 0, 10)] == [1]


async def test_a_task_move_its_table_does_not_allow_fails_its_write(store: Any) -> None:
    await commit(store, WriteTx(tasks=[task_row()]))
    await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 101.0, state="running")]))
    for backwards in ("queued", "dead"):
        with pytest.raises(StoreError) as refused:
            await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 102.0, state=backwards)]))
        assert not isinstance(refused.value, TerminalExists)
    got = await store.get_task("k_1")
    assert got is not None and (got.state, got.updated_at) == ("running", 101.0)


async def test_a_dead_task_stays_dead_when_a_hand_reports_it_late(store: Any) -> None:
    await commit(store, WriteTx(tasks=[task_row()]))
    await commit(store, WriteTx(task_updates=[TaskUpdate(
        "k_1", 130.0, state="dead", attempts=3, ended_at=130.0, error="no Hand acknowledged")]))
    assert await store.due_tasks(1_000.0, 10) == []
    with pytest.raises(TerminalExists):
        await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 140.0, state="running")]))
    got = await store.get_task("k_1")
    assert got is not None and (got.state, got.attempts) == ("dead", 3)


async def test_a_task_a_hand_acknowledged_never_dies(store: Any) -> None:
    """Once a Hand has a task it is the authority: the outbox cannot give
    up on it, even when the receipt's write and the outbox's race."""
    await commit(store, WriteTx(tasks=[task_row()]))
    await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 101.0, delivered_at=101.0)]))
    with pytest.raises(StoreError) as refused:
        await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 102.0, state="dead")]))
    assert not isinstance(refused.value, TerminalExists)
    # Nor in the very write that says it was delivered.
    await commit(store, WriteTx(tasks=[task_row("k_2")]))
    with pytest.raises(StoreError):
        await commit(store, WriteTx(task_updates=[
            TaskUpdate("k_2", 102.0, state="dead", delivered_at=102.0)]))
    assert [(t.task_id, t.state) for t in await store.list_tasks(limit=10)] == [
        ("k_2", "queued"), ("k_1", "queued")]


async def test_an_update_of_an_unknown_task_changes_nothing(store: Any) -> None:
    outcome_ = await commit(store, WriteTx(task_updates=[TaskUpdate("k_404", 1.0, state="lost")]))
    assert outcome_.committed
    assert await store.get_task("k_404") is None


def test_an_update_to_an_unknown_state_is_refused_before_the_store_is_touched() -> None:
    with pytest.raises(HalfpiError):
        TaskUpdate("k_1", 1.0, state="exploded")


async def test_due_tasks_are_the_undelivered_open_ones_most_overdue_first(store: Any) -> None:
    rows = [
        task_row("k_a", created=100.0, due=105.0),
        task_row("k_b", created=101.0, due=102.0),
        task_row("k_c", created=102.0, due=105.0),  # same time as k_a: the older first
        task_row("k_d", created=103.0, due=200.0),  # not yet
        task_row("k_e", created=104.0, due=101.0),  # delivered below
        task_row("k_f", created=105.0, due=101.0),  # dead below
        task_row("k_g", created=106.0, due=104.0, conv="c_2", hand="h_2"),
    ]
    await commit(store, WriteTx(tasks=rows))
    await commit(store, WriteTx(task_updates=[
        TaskUpdate("k_e", 110.0, delivered_at=110.0, hand_task_id="ht_e"),
        TaskUpdate("k_f", 110.0, state="dead", ended_at=110.0),
    ]))
    assert [t.task_id for t in await store.due_tasks(150.0, 10)] == ["k_b", "k_g", "k_a", "k_c"]
    assert [t.task_id for t in await store.due_tasks(104.0, 10)] == ["k_b", "k_g"]
    assert await store.due_tasks(101.0, 10) == []
    # Paging: the dispatcher takes a page, records its attempts (which moves
    # them later), and the next call gives the next page.
    page = await store.due_tasks(150.0, 2)
    assert [t.task_id for t in page] == ["k_b", "k_g"]
    await commit(store, WriteTx(task_updates=[
        TaskUpdate(t.task_id, 150.0, attempts=t.attempts + 1, next_attempt_at=152.0)
        for t in page
    ]))
    assert [t.task_id for t in await store.due_tasks(150.0, 2)] == ["k_a", "k_c"]
    assert [t.task_id for t in await store.due_tasks(152.0, 10)] == ["k_a", "k_c", "k_b", "k_g"]


async def test_tasks_list_newest_first_by_conversation_hand_and_state_in_pages(
    store: Any,
) -> None:
    rows = [
        task_row(f"k_{n}", conv="c_1" if n % 2 else "c_2", hand="h_1" if n < 4 else "h_2",
                 created=100.0 + n)
        for n in range(6)
    ]
    rows.append(task_row("k_6", created=105.0))  # created with k_5: the higher id first
    await commit(store, WriteTx(tasks=rows))
    await commit(store, WriteTx(task_updates=[TaskUpdate("k_1", 120.0, state="running"),
                                              TaskUpdate("k_2", 120.0, state="lost")]))

    async def ids(**query: Any) -> list[str]:
        return [t.task_id for t in await store.list_tasks(**query)]

    assert await ids(limit=10) == ["k_6", "k_5", "k_4", "k_3", "k_2", "k_1", "k_0"]
    assert await ids(limit=3) == ["k_6", "k_5", "k_4"]
    assert await ids(limit=3, before="k_4") == ["k_3", "k_2", "k_1"]
    assert await ids(limit=3, before="k_1") == ["k_0"]
    assert await ids(limit=3, before="k_0") == []
    assert await ids(limit=10, conversation_id="c_1") == ["k_6", "k_5", "k_3", "k_1"]
    assert await ids(limit=10, hand_id="h_1") == ["k_6", "k_3", "k_2", "k_1", "k_0"]
    assert await ids(limit=10, conversation_id="c_1", hand_id="h_1") == ["k_6", "k_3", "k_1"]
    assert await ids(limit=10, states=["queued", "running"]) == ["k_6", "k_5", "k_4", "k_3",
                                                                  "k_1", "k_0"]
    assert await ids(limit=10, states=["lost"]) == ["k_2"]
    assert await ids(limit=10, states=[]) == []
    assert await ids(limit=2, before="k_5", hand_id="h_2") == ["k_4"]
    assert await ids(limit=10, conversation_id="c_none") == []


async def test_the_outbox_survives_a_restart(backend: Backend) -> None:
    first = backend.make()
    await first.open()
    await commit(first, WriteTx(admit=record(), tasks=[task_row()], events=[task_event(1)]))
    await first.close()
    second = backend.make()
    await second.open()
    try:
        assert [t.task_id for t in await second.due_tasks(100.0, 10)] == ["k_1"]
        assert await second.get_task("k_1") == task_row()
    finally:
        await second.close()


# -- the suite covers the seam --------------------------------------------------------


def test_every_store_method_is_exercised_here() -> None:
    """A method added to the Store Protocol needs a test here, so every
    backend proves it the same way."""
    methods = {
        name
        for name, value in vars(Store).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }
    source = inspect.getsource(sys.modules[__name__])
    missing = {m for m in methods if not re.search(rf"\.{m}\(", source)}
    assert methods and not missing, f"no test calls {sorted(missing)}"
