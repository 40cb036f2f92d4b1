"""``halfpi.wiring``: the one place that picks the Store and the Journal
from configuration (docs/operations.md, "The store")."""

from __future__ import annotations

from pathlib import Path

import pytest

from halfpi.config import Config
from halfpi.errors import StoreError
from halfpi.journal.memory import MemoryJournal
from halfpi.store.base import Store
from halfpi.store.postgres import PostgresStore
from halfpi.store.sqlite import SQLiteStore
from halfpi.wiring import make_journal, make_store, run_on_store


def test_the_default_store_is_sqlite_in_the_home(tmp_path: Path) -> None:
    store = make_store(Config(home=tmp_path))
    assert isinstance(store, SQLiteStore)
    assert store.path == tmp_path / "halfpi.db"


def test_a_sqlite_url_picks_its_file(tmp_path: Path) -> None:
    store = make_store(Config(home=tmp_path, store_url="sqlite:///srv/halfpi/minds.db"))
    assert isinstance(store, SQLiteStore) and store.path == Path("/srv/halfpi/minds.db")


def test_a_postgresql_url_picks_the_postgresql_store_without_connecting(tmp_path: Path) -> None:
    url = "postgresql://me:secret@db.invalid/halfpi"
    store = make_store(Config(home=tmp_path, store_url=url))
    assert isinstance(store, PostgresStore) and store.url == url
    # No file of the Mind's is the database: only the home is private.
    assert Config(home=tmp_path, store_url=url).private_paths == (tmp_path,)


def test_the_journal_is_in_process_and_other_kinds_are_refused(tmp_path: Path) -> None:
    assert isinstance(make_journal(Config(home=tmp_path)), MemoryJournal)
    with pytest.raises(ValueError, match=r"Redis journal needs a URL"):
        make_journal(Config(home=tmp_path, journal_kind="redis"))
    with pytest.raises(ValueError, match="'kafka' is not a journal"):
        make_journal(Config(home=tmp_path, journal_kind="kafka"))


def test_run_on_store_opens_runs_one_coroutine_and_closes(tmp_path: Path) -> None:
    opened: list[Store] = []

    async def work(store: Store) -> int:
        opened.append(store)
        return await store.credentials_version()

    config = Config(home=tmp_path, store_url=f"sqlite://{tmp_path}/data/minds.db")
    assert run_on_store(config, work) == 0
    assert (tmp_path / "data" / "minds.db").exists()
    [store] = opened
    assert isinstance(store, SQLiteStore) and store.closed


def test_run_on_store_of_a_database_that_is_not_one_is_one_store_error(tmp_path: Path) -> None:
    (tmp_path / "halfpi.db").write_bytes(b"not a database" * 100)

    async def work(store: Store) -> None:  # pragma: no cover - never reached
        raise AssertionError("the store opened")

    with pytest.raises(StoreError) as refused:
        run_on_store(Config(home=tmp_path), work)
    assert str(refused.value).startswith(f"cannot open the database {tmp_path / 'halfpi.db'}: ")
    assert "\n" not in str(refused.value)
