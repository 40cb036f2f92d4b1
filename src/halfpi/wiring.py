"""Which backends a Mind uses, picked from its configuration in one place.

The Store and the Journal are seams (``store/base.py``, ``journal/base.py``);
this module is the only one that names their implementations. The Mind's
wiring (``mind/run.py``) and the command line (credentials) both get their
Store here, so they always agree on where the truth lives.

Store URLs (``Config.store_url``, ``--store``; docs/operations.md):

- ``sqlite:///PATH`` — SQLite at the absolute PATH (``sqlite:PATH`` for a
  relative one); the default (None) is ``HOME/halfpi.db``.
- ``postgresql://…`` — reserved for cluster mode (DESIGN §10): refused with
  one line until it exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from halfpi.config import Config
from halfpi.journal.base import Journal
from halfpi.journal.memory import MemoryJournal
from halfpi.store.base import Store
from halfpi.store.sqlite import SQLiteStore

T = TypeVar("T")

_USE_SQLITE = "use sqlite:///PATH (the default is sqlite:///HOME/halfpi.db)"


def sqlite_path(url: str) -> Path:
    """The database file a store URL names. Raises ValueError, one line
    that never repeats the URL (it may hold a password), for any URL this
    halfpi cannot use — ``postgresql://`` included, until it exists."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower().split("+", 1)[0]
    if scheme in ("postgresql", "postgres"):
        raise ValueError(f"the PostgreSQL store (cluster mode) is not built yet: {_USE_SQLITE}")
    if scheme != "sqlite":
        what = f"{scheme}: is not a store this halfpi knows" if scheme else "not a store URL"
        raise ValueError(f"{what}: {_USE_SQLITE}")
    if parts.netloc:
        raise ValueError(f"a sqlite: URL names a file on this machine, with no host: {_USE_SQLITE}")
    if parts.query or parts.fragment:
        raise ValueError(f"a sqlite: URL takes no options: {_USE_SQLITE}")
    if not parts.path:
        raise ValueError(f"the sqlite: URL names no file: {_USE_SQLITE}")
    return Path(unquote(parts.path)).expanduser()


def make_store(config: Config) -> Store:
    """The configured Store, not yet opened (``await store.open()``)."""
    if config.store_url is None:
        return SQLiteStore(config.db_path)
    return SQLiteStore(sqlite_path(config.store_url))


def make_journal(config: Config) -> Journal:
    """The configured Journal: in-process ("memory") is the only kind so far."""
    if config.journal_kind == "memory":
        return MemoryJournal(config.journal)
    if config.journal_kind == "redis":
        raise ValueError("the Redis journal (cluster mode) is not built yet: use memory")
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
