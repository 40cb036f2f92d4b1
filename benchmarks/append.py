"""Durable writes: chat admissions through the actor, and plain event appends,
each against plain ``sqlite3`` writing the same rows.

**Chats** (the real path): a Mind in this process (``build_mind``: the
SQLite store with ``synchronous=FULL``, the in-process journal, the
scripted agent at full speed), no sockets. W concurrent writers, one
conversation each, as W Faces' sessions would: for each chat the request
registry lookup (``store.get_request``, a read), then
``ConversationActor.admit_chat`` — one transaction with the request record,
the user's message, the run and ``chat.message`` + ``chat.started`` under a
SAVEPOINT of the group commit — then the agent's one-word reply and the
end's transaction (``chat.completed``, the assistant's message, the run's
end, the request's result); a chat counts once its end is durable.
Baseline: ``_rawsql.py`` — ``BEGIN IMMEDIATE``, W admissions each in a
SAVEPOINT, ``COMMIT``; then W ends likewise: two commits per W chats, the
same rows, no futures, threads or event loop.

**Event appends**: W writers each awaiting ``SQLiteStore.write(WriteTx(
events=[event]))`` in a loop (the delta-free event path; merged into one
``executemany`` per commit) against ``BEGIN IMMEDIATE; executemany(W rows);
COMMIT`` with the rows built before the clock starts.

Same schema (``halfpi.store.sqlite.SCHEMA``), same PRAGMAs (WAL, the same
``synchronous``), rounds alternating. CPU is this process's (all threads:
the store's writer thread included) as a share of one core.

    python benchmarks/append.py [--writers W] [--events N] [--chats N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import _rawsql
from _bench import (
    figure,
    machine_busy_seconds,
    saturation,
    summary_table,
    table,
    workdir,
    write_json,
)

from halfpi.config import Config
from halfpi.core.requests import RequestRecord
from halfpi.process import build_mind
from halfpi.store.base import StoredEvent, WriteTx
from halfpi.store.sqlite import SCHEMA, SQLiteStore

# A durable event that ends no run (a run's outcome may be stored once only:
# the store refuses a second chat.completed for one run_id), of the size of
# a short chat.completed.
TYPE = "chat.message"
DATA = (
    b'{"request_id":"chat-000123","role":"user","client_hint":"r_0000000000000000",'
    b'"content":"a short message of a few words"}'
)
INSERT = "INSERT INTO events (conversation_id, seq, type, data, ts) VALUES (?,?,?,?,?)"
CONTENT = "hello"  # the scripted agent echoes it: one delta


class Clock:
    """Wall time, this process's CPU and the machine's over one window."""

    def __enter__(self) -> Clock:
        self._machine = machine_busy_seconds()
        self._cpu = time.process_time()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        self.cpu = time.process_time() - self._cpu
        self.machine = machine_busy_seconds() - self._machine

    def as_dict(self, work: int) -> dict[str, Any]:
        util = self.cpu / self.seconds
        return {
            "per_s": work / self.seconds,
            "seconds": self.seconds,
            "server_util": util,
            "load_util": 0.0,
            "load_max": 0.0,
            "others_util": max(0.0, self.machine - self.cpu) / self.seconds,
            "saturated": saturation(util, 0.0),
        }


# -- chats through the actor ------------------------------------------------------


async def chats_halfpi(home: Path, writers: int, per_writer: int) -> dict[str, Any]:
    config = Config(home=home, port=0, scripted_delta_ms=0.0, local_hand=False,
                    credential_poll_s=3600.0)
    home.mkdir(parents=True, exist_ok=True)
    mind = build_mind(replace(config))
    await mind.start()
    principal = "p_bench"
    try:
        actors = []
        for w in range(writers):
            record = RequestRecord(principal, f"create-{w}", "face.conversation.create",
                                   _rawsql.DIGEST, "accepted", mind.wall())
            await mind.create_conversation(record, f"c{w}")
            assert record.conversation_id is not None
            actors.append(await mind.actor(record.conversation_id))

        async def writer(w: int, first: int, count: int) -> None:
            actor = actors[w]
            for i in range(first, first + count):
                key = (principal, f"chat-{w}-{i}")
                async with mind.registry.lock(key):
                    if await mind.store.get_request(*key) is not None:
                        raise RuntimeError(f"{key} exists")
                    record = RequestRecord(principal, key[1], "face.chat", _rawsql.DIGEST,
                                           "accepted", mind.wall())
                    await actor.admit_chat(record, CONTENT, lambda _r: None)
                    run = actor.chat_run
                assert run is not None
                if await run.done != "succeeded":
                    raise RuntimeError(f"chat {key} did not succeed")

        await asyncio.gather(*(writer(w, 0, 2) for w in range(writers)))  # warm-up
        batches = mind.store.batches  # type: ignore[attr-defined]
        with Clock() as clock:
            await asyncio.gather(*(writer(w, 2, per_writer) for w in range(writers)))
        commits = mind.store.batches - batches  # type: ignore[attr-defined]
    finally:
        await mind.drain()
    chats = writers * per_writer
    return {**clock.as_dict(chats), "commits": commits, "per_commit": 2 * chats / commits}


def chats_raw(path: Path, writers: int, per_writer: int) -> dict[str, Any]:
    conn = _rawsql.open_db(path)
    now = time.time()
    for w in range(writers):
        _rawsql.add_conversation(conn, f"c{w}", now)

    def batch(i: int) -> list[_rawsql.Chat]:
        return [_rawsql.Chat(f"c{w}", f"chat-{w}-{i}", f"run-{w}-{i}", 1 + 3 * i, CONTENT)
                for w in range(writers)]

    def one_round(i: int) -> None:
        chats = batch(i)
        t = time.time()
        _rawsql.commit(conn, lambda: [_rawsql.admit(conn, c, t) for c in chats])
        t = time.time()
        _rawsql.commit(conn, lambda: [_rawsql.complete(conn, c, c.seq + 2, CONTENT, t)
                                      for c in chats])

    for i in range(2):  # warm-up, as for halfpi
        one_round(i)
    with Clock() as clock:
        for i in range(2, 2 + per_writer):
            one_round(i)
    conn.close()
    return {**clock.as_dict(writers * per_writer), "commits": 2 * per_writer,
            "per_commit": writers}


# -- event appends --------------------------------------------------------------------


async def events_halfpi(path: Path, synchronous: str, writers: int,
                        per_writer: int) -> dict[str, Any]:
    store = SQLiteStore(path, synchronous=synchronous)
    await store.open()
    now = time.time()

    async def writer(index: int, first: int, count: int) -> None:
        conversation_id = f"c{index:04d}"
        for seq in range(first, first + count):
            await store.write(WriteTx(events=[StoredEvent(conversation_id, seq, TYPE, DATA, now)]))

    await asyncio.gather(*(writer(w, 1, 5) for w in range(writers)))  # warm-up
    batches = store.batches
    with Clock() as clock:
        await asyncio.gather(*(writer(w, 6, per_writer) for w in range(writers)))
    commits = store.batches - batches
    await store.close()
    check = sqlite3.connect(path)
    stored = check.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    check.close()
    if stored != writers * (per_writer + 5):
        raise RuntimeError(f"{stored} rows stored, {writers * (per_writer + 5)} expected")
    events = writers * per_writer
    return {**clock.as_dict(events), "commits": commits, "per_commit": events / max(1, commits)}


def events_raw(path: Path, synchronous: str, writers: int, per_writer: int) -> dict[str, Any]:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.executescript(SCHEMA)
    now = time.time()
    data = DATA.decode()

    def batch(seq: int) -> list[tuple[Any, ...]]:
        return [(f"c{w:04d}", seq, TYPE, data, now) for w in range(writers)]

    def commit(rows: list[tuple[Any, ...]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, rows)
        conn.execute("COMMIT")

    for seq in range(1, 6):
        commit(batch(seq))
    batches = [batch(seq) for seq in range(6, 6 + per_writer)]
    with Clock() as clock:
        for rows in batches:
            commit(rows)
    conn.close()
    return {**clock.as_dict(writers * per_writer), "commits": len(batches),
            "per_commit": writers}


def filesystem(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True,
                             check=True).stdout.splitlines()[-1].split()
        return out[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "?"


def run_all(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, list[Any]]]:
    results: dict[str, dict[str, list[Any]]] = {}
    counter = 0
    cases = [("chats", "FULL")] + [("events", mode) for mode in args.modes]
    for kind, synchronous in cases:
        runs: dict[str, list[Any]] = {"halfpi": [], "raw": []}
        for index in range(args.rounds):  # alternate the order so drift hits both
            for side in ("halfpi", "raw") if index % 2 == 0 else ("raw", "halfpi"):
                counter += 1
                where = tmp / f"{kind}-{side}-{synchronous}-{counter}"
                where.mkdir()
                if kind == "chats":
                    per = args.chats // args.writers
                    r = (asyncio.run(chats_halfpi(where, args.writers, per)) if side == "halfpi"
                         else chats_raw(where / "raw.db", args.writers, per))
                else:
                    per = args.events // args.writers
                    path = where / "events.db"
                    r = (asyncio.run(events_halfpi(path, synchronous, args.writers, per))
                         if side == "halfpi" else events_raw(path, synchronous, args.writers, per))
                runs[side].append(r)
                if args.verbose:
                    print(f"{kind} {synchronous} {side}: {r['per_s']:,.0f}/s, "
                          f"{r['per_commit']:.1f} per commit", file=sys.stderr)
        results[f"{kind} {synchronous}"] = runs
    return results


def report(results: dict[str, dict[str, list[Any]]], args: argparse.Namespace,
           fs: str) -> list[dict[str, Any]]:
    rows = []
    summary = []
    for case, runs in results.items():
        kind, synchronous = case.split()
        for side in ("halfpi", "raw"):
            for i, r in enumerate(runs[side]):
                rows.append([f"{case} {side} #{i + 1}", r["per_s"], r["commits"],
                             r["per_commit"], f"{r['server_util']:.0%}",
                             f"{r['others_util']:.0%}"])
        unit = "chats/s" if kind == "chats" else "events/s"
        full = synchronous == "FULL"
        metric = (f"durable chats (admission + end), synchronous={synchronous}" if kind == "chats"
                  else f"durable event append, synchronous={synchronous}")
        summary.append(figure(
            "append", metric, unit, runs["halfpi"], runs["raw"], "per_s",
            target="≥ 0.5x raw" if full else "",
            judge=(lambda _m, ratio: None if ratio is None else ratio >= 0.5) if full else None,
            note=f"{args.writers} writers; halfpi "
            f"{sum(r['per_commit'] for r in runs['halfpi']) / len(runs['halfpi']):.0f} "
            f"{'transactions' if kind == 'chats' else 'events'}/commit"
            + ("; 2 transactions per chat, 3 events" if kind == "chats" else ""),
        ))
    print(table(["round", "per s", "commits", "per commit", "CPU", "rest"], rows,
                f"Durable writes (WAL; database on {fs}; CPU = this process, all threads, "
                f"share of one core; rest = the rest of the machine)"))
    print()
    print(summary_table(summary, "Durable write summary"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--events", type=int, default=60_000, help="events per round")
    parser.add_argument("--chats", type=int, default=3_000, help="chats per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["FULL"],
                        help="synchronous settings for the event appends")
    parser.add_argument("--dir", default=None, help="where to create the databases")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds; each round's work as in the full run")
    parser.add_argument("--verbose", action="store_true", help="print every round")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:  # the same rounds as the full run (the same commits per round), fewer
        args.rounds = min(args.rounds, 3)
    if args.dir:
        os.environ["TMPDIR"] = args.dir
    with workdir("halfpi-append-") as tmp:
        fs = filesystem(tmp)
        results = run_all(args, tmp)
    rows = report(results, args, fs)
    write_json(args.json, rows, {"bench": "append"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
