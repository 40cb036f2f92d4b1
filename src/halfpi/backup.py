"""``halfpi backup DEST`` and ``halfpi restore SRC`` (docs/operations.md,
"Backup and restore").

A backup is a folder (0700): ``halfpi.db``, a consistent copy of the
database made with SQLite's online backup API through a connection of its
own that only reads (in WAL mode a reader never blocks the Mind's writer,
so the Mind keeps serving while it runs; the copy is the database as of
one moment), the home's own files that are not in the database (the
local tokens, the stream key, the agent's settings and key), and
``backup.json`` (what was taken, when, by which halfpi, at which schema
version, and which files hold a secret: a Hand's tool policy refuses those
wherever the folder is copied). It is as secret as the home: every file 0600.

Restore copies it into a home that is empty (or not there yet), checking
the database's integrity first. The Mind started there loads every
conversation in a new epoch (the in-process journal starts empty), so a
Face's cursor resumes with an honest reset (``epoch_changed``), and every
request record is the Store's, so a retried request is still admitted
once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from halfpi import __version__
from halfpi.core.redact import BACKUP_MANIFEST
from halfpi.private import private_dir, write_private
from halfpi.store.sqlite_schema import SCHEMA_VERSION, user_version

DATABASE = "halfpi.db"
MANIFEST = BACKUP_MANIFEST
# The home's files a Mind needs besides its database (those present are taken).
HOME_FILES = ("face.token", "hand.token", "stream.key", "agent.toml", "openai.key")
# Those that hold a secret: the manifest lists them, and a Hand's tool policy
# refuses them wherever the folder is copied (docs/hands.md, "Tool policy").
SECRET_FILES = frozenset({DATABASE, "face.token", "hand.token", "stream.key", "openai.key"})


class BackupError(Exception):
    """One line for the user (``halfpi: …``, status 1)."""


@dataclass(frozen=True, slots=True)
class Taken:
    folder: Path
    schema: int
    files: tuple[str, ...]
    seconds: float


def _read_connection(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise BackupError(f"there is no database at {path} (check --home or --store)")
    # Read-only: this connection never writes, whatever the database holds.
    # A file: URI names an absolute path (``restore ../bk1`` is relative).
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30.0)


def copy_database(source: Path, target: Path) -> int:
    """Copy the database at ``source`` to a new file ``target`` (0600) with
    the online backup API, in one step: one read transaction, a consistent
    copy while writers go on. Returns its schema version."""
    src = _read_connection(source)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
            # A self-contained file: no -wal beside it to lose.
            dst.execute("PRAGMA journal_mode=DELETE")
            return user_version(dst)
        finally:
            dst.close()
    except sqlite3.Error as exc:
        with contextlib.suppress(OSError):
            target.unlink()
        raise BackupError(f"cannot copy the database {source}: {exc}") from None
    finally:
        src.close()


def backup(home: Path, database: Path, dest: Path) -> Taken:
    """Take a backup of ``home`` (database at ``database``) into the new
    folder ``dest``."""
    started = time.monotonic()
    if dest.exists():
        raise BackupError(f"{dest} exists already: give a new folder to back up into")
    private_dir(dest)
    try:
        schema = copy_database(database, dest / DATABASE)
        files = [DATABASE]
        for name in HOME_FILES:
            path = home / name
            if path.is_file():
                write_private(dest / name, path.read_bytes())
                files.append(name)
        manifest = {"halfpi": __version__, "schema": schema, "files": files,
                    "secrets": [f for f in files if f in SECRET_FILES],
                    "taken_at": time.time()}
        write_private(dest / MANIFEST, json.dumps(manifest, indent=1).encode() + b"\n")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return Taken(dest, schema, tuple(files), time.monotonic() - started)


def _empty(home: Path) -> bool:
    return not home.exists() or (home.is_dir() and not any(home.iterdir()))


def restore(source: Path, home: Path, database: Path) -> Taken:
    """Restore the backup folder ``source`` into the empty ``home`` (its
    database at ``database``)."""
    started = time.monotonic()
    if not (source / DATABASE).is_file() or not (source / MANIFEST).is_file():
        raise BackupError(f"{source} is not a halfpi backup (no {DATABASE} and {MANIFEST})")
    if not _empty(home):
        raise BackupError(f"the home {home} is not empty: restore only into a new or empty home")
    if database.parent != home and database.exists():
        raise BackupError(f"the database {database} exists already: restore into a new one")
    check = _read_connection(source / DATABASE)
    try:
        [(verdict,)] = check.execute("PRAGMA quick_check").fetchall()
        schema = user_version(check)
    except sqlite3.Error as exc:
        raise BackupError(f"{source / DATABASE} is not a readable database: {exc}") from None
    finally:
        check.close()
    if verdict != "ok":
        raise BackupError(f"{source / DATABASE} is damaged ({verdict}): use another backup")
    if schema > SCHEMA_VERSION:
        raise BackupError(f"the backup's schema version {schema} is newer than this halfpi "
                          f"understands ({SCHEMA_VERSION}): restore it with a newer halfpi")
    private_dir(home)
    private_dir(database.parent)
    copy_database(source / DATABASE, database)
    files = [DATABASE]
    for name in HOME_FILES:
        path = source / name
        if path.is_file():
            write_private(home / name, path.read_bytes())
            files.append(name)
    return Taken(home, schema, tuple(files), time.monotonic() - started)


PG_DUMP_GUIDANCE = """\
halfpi: this Mind's store is PostgreSQL: back it up with PostgreSQL's own tools, e.g.
  pg_dump --format=custom --file=halfpi.dump DATABASE_URL
and restore into an empty database with
  pg_restore --dbname=NEW_DATABASE_URL halfpi.dump
then start the Minds on it; copy each node's home files (face.token, hand.token,
stream.key) by hand. A restored cluster resumes cursors with a reset when its Redis
journal was not kept (docs/cluster.md)."""
