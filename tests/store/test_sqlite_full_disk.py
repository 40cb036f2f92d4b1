"""The SQLite Store on a disk that fills up (docs/operations.md, "Health and
metrics"): a group commit the database refuses fails every write in it, the
Store says its last commit failed (what ``/readyz`` reads at once), and the
first commit after space returns clears it. A real tmpfs, really full."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from halfpi.core.requests import RequestRecord
from halfpi.errors import StoreError
from halfpi.store.base import ConversationRow, StoredEvent, WriteTx
from halfpi.store.sqlite import SQLiteStore
from tests.support.tmpfs import fill, small_filesystem


@pytest.fixture
async def store_on_small_disk(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    with small_filesystem(tmp_path / "disk") as disk:
        store = SQLiteStore(disk / "home" / "halfpi.db")
        await store.open()
        try:
            yield store
        finally:
            await store.close()


def admission(request_id: str) -> RequestRecord:
    return RequestRecord(principal_id="p_1", request_id=request_id, type="face.chat",
                         digest="d", status="accepted", created_at=100.0,
                         conversation_id="c_1", run_id=f"run_{request_id}")


def big_event(seq: int) -> StoredEvent:
    # Larger than any page the WAL may still have: its commit needs new ones.
    return StoredEvent("c_1", seq, "chat.message", b'"%s"' % (b"x" * 256 * 1024), 100.0)


async def test_a_commit_the_full_disk_refuses_fails_and_is_remembered_until_one_succeeds(
    store_on_small_disk: SQLiteStore,
) -> None:
    store = store_on_small_disk
    await store.write(WriteTx(conversations=[ConversationRow("c_1", None, 100.0)]))
    assert store.last_commit_failed is False
    filler = fill(store.path.parent)

    with pytest.raises(StoreError, match="database or disk is full"):
        await store.write(WriteTx(events=[big_event(1)]))
    assert store.last_commit_failed is True

    filler.unlink()
    await store.write(WriteTx(events=[big_event(1)]))
    assert store.last_commit_failed is False


async def test_a_full_disk_fails_the_whole_group_commit_not_write_by_write(
    store_on_small_disk: SQLiteStore,
) -> None:
    """A refusal by the database is not a refusal of one write: no write of
    the batch stands (and the Store says so), also when the batch was being
    redone write by write."""
    store = store_on_small_disk
    await store.write(WriteTx(conversations=[ConversationRow("c_1", None, 100.0)]))
    fill(store.path.parent)
    futures = [
        store.write(WriteTx(events=[big_event(1)])),
        store.write(WriteTx(admit=admission("r_1"), events=[big_event(2)])),
    ]
    for future in futures:
        with pytest.raises(StoreError, match="commit failed: database or disk is full"):
            await future
    assert store.last_commit_failed is True
