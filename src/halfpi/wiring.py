"""Which backends a Mind uses, picked from its configuration in one place.

The Store and the Journal are seams (``store/base.py``, ``journal/base.py``);
this module is the only one that names their implementations. The Mind's
wiring (``halfpi/process.py``) and the command line (credentials) both get their
Store here, so they always agree on where the truth lives.

Store URLs (``Config.store_url``, ``--store``; docs/operations.md):
``sqlite:///PATH`` (the default, None, is ``HOME/halfpi.db``);
``postgresql://…`` for cluster mode (DESIGN §10, docs/cluster.md), whose
driver (asyncpg) is imported only when that Store opens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from halfpi.config import Config
from halfpi.journal.base import Journal
from halfpi.journal.memory import MemoryJournal
from halfpi.store.base import Store
from halfpi.store.sqlite import SQLiteStore

T = TypeVar("T")


def make_store(config: Config) -> Store:
    """The configured Store, not yet opened (``await store.open()``)."""
    if config.postgres:
        from halfpi.store.postgres import PostgresStore

        assert config.store_url is not None
        return PostgresStore(config.store_url)
    # config.db_path raises ValueError for a store URL this halfpi cannot use.
    # The home is the Mind's own folder; one named by a URL may be shared.
    return SQLiteStore(config.db_path, own_folder=config.store_url is None)


def make_journal(config: Config) -> Journal:
    """The configured Journal: in-process ("memory", the default) or Redis."""
    if config.journal_kind == "memory":
        return MemoryJournal(config.journal)
    if config.journal_kind == "redis":
        if not config.redis_url:
            raise ValueError("the Redis journal needs a URL: --redis redis://HOST:PORT")
        from halfpi.journal.redis import RedisJournal  # lazily: redis is optional

        return RedisJournal.from_url(config.redis_url, config.journal)
    raise ValueError(f"{config.journal_kind!r} is not a journal this halfpi knows: use memory")


def run_on_store(config: Config, work: Callable[[Store], Awaitable[T]]) -> T:
    """Open the configured Store, run ``work`` on it, close it, and return
    what ``work`` returned: how a synchronous caller (the command line)
    reaches the Store. Raises StoreError (one line) when it cannot open."""

    async def main() -> T:
        store = make_store(config)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(main())
