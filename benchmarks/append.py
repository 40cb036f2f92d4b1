"""Durable append: SQLiteStore group commit against raw batched ``executemany``.

``halfpi``: W concurrent writers (one conversation each, as W actors would
be) each await ``SQLiteStore.write(WriteTx(events=[event]))`` in a loop; the
store's writer thread commits whatever is queued in one transaction. A write
counts once its future resolved, i.e. once it is durable.

Baseline, same run, same schema (``halfpi.store.sqlite.SCHEMA``), same
PRAGMAs (WAL, the same ``synchronous``): the same rows inserted with plain
``sqlite3`` as ``BEGIN IMMEDIATE; executemany(W rows); COMMIT`` - the best a
group commit of W writers can do, with the rows built before the clock starts.

Both run with ``synchronous=FULL`` (the store's default: an fsync per commit)
and ``synchronous=NORMAL``. The database lives in a temporary directory on
the filesystem of ``--dir`` (default: the system temporary directory).

    python benchmarks/append.py [--writers W] [--events N] [--rounds R] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    best,
    machine_busy_seconds,
    median,
    spread,
    summary_row,
    summary_table,
    table,
    workdir,
    write_json,
)

from halfpi.store.base import StoredEvent, WriteTx
from halfpi.store.sqlite import SCHEMA, SQLiteStore

TYPE = "chat.completed"
DATA = (
    b'{"request_id":"chat-000123","run_id":"r_0000000000000000","status":"succeeded",'
    b'"content":"a short reply of a few words"}'
)
INSERT = "INSERT INTO events (conversation_id, seq, type, data, ts) VALUES (?,?,?,?,?)"


async def store_run(path: Path, synchronous: str, writers: int, per_writer: int) -> dict[str, Any]:
    store = SQLiteStore(path, synchronous=synchronous)
    await store.open()
    now = time.time()

    async def writer(index: int, first: int, count: int) -> None:
        conversation_id = f"c{index:04d}"
        for seq in range(first, first + count):
            await store.write(WriteTx(events=[StoredEvent(conversation_id, seq, TYPE, DATA, now)]))

    await asyncio.gather(*(writer(w, 1, 5) for w in range(writers)))  # warm-up
    batches = store.batches
    machine = machine_busy_seconds()
    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(writer(w, 6, per_writer) for w in range(writers)))
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    machine = machine_busy_seconds() - machine
    batches = store.batches - batches
    await store.close()
    events = writers * per_writer
    check = sqlite3.connect(path)
    stored = check.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    check.close()
    if stored != writers * (per_writer + 5):
        raise RuntimeError(f"{stored} rows stored, {writers * (per_writer + 5)} expected")
    return {
        "events_per_s": events / seconds,
        "seconds": seconds,
        "commits": batches,
        "per_commit": events / max(1, batches),
        "cpu_util": cpu / seconds,
        "others_util": max(0.0, machine - cpu) / seconds,
    }


def raw_run(path: Path, synchronous: str, writers: int, per_writer: int) -> dict[str, Any]:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.executescript(SCHEMA)
    now = time.time()
    data = DATA.decode()

    def batch(seq: int) -> list[tuple[Any, ...]]:
        return [(f"c{w:04d}", seq, TYPE, data, now) for w in range(writers)]

    def commit(rows: list[tuple[Any, ...]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, rows)
        conn.execute("COMMIT")

    for seq in range(1, 6):  # warm-up, as for the store
        commit(batch(seq))
    batches = [batch(seq) for seq in range(6, 6 + per_writer)]
    machine = machine_busy_seconds()
    cpu = time.process_time()
    start = time.perf_counter()
    for rows in batches:
        commit(rows)
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    machine = machine_busy_seconds() - machine
    conn.close()
    events = writers * per_writer
    return {
        "events_per_s": events / seconds,
        "seconds": seconds,
        "commits": len(batches),
        "per_commit": writers,
        "cpu_util": cpu / seconds,
        "others_util": max(0.0, machine - cpu) / seconds,
    }


def filesystem(path: Path) -> str:
    try:
        out = (
            subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, check=True)
            .stdout.splitlines()[-1]
            .split()
        )
        return out[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "?"


def main_async_runs(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, list[Any]]]:
    results: dict[str, dict[str, list[Any]]] = {}
    counter = 0
    for synchronous in args.modes:
        per_writer = args.events // args.writers
        if synchronous != "FULL":
            per_writer *= args.normal_factor
        runs: dict[str, list[Any]] = {"halfpi": [], "raw": []}
        for index in range(args.rounds):  # alternate the order so drift hits both
            for side in ("halfpi", "raw") if index % 2 == 0 else ("raw", "halfpi"):
                counter += 1
                path = tmp / f"{side}-{synchronous}-{counter}.db"
                if side == "halfpi":
                    r = asyncio.run(store_run(path, synchronous, args.writers, per_writer))
                else:
                    r = raw_run(path, synchronous, args.writers, per_writer)
                runs[side].append(r)
                if args.verbose:
                    print(
                        f"{synchronous} {side}: {r['events_per_s']:,.0f} events/s, "
                        f"{r['per_commit']:.1f} per commit, {r['seconds']:.2f} s",
                        file=sys.stderr,
                    )
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
        results[synchronous] = runs
    return results


def report(
    results: dict[str, dict[str, list[Any]]], args: argparse.Namespace, fs: str
) -> list[dict[str, Any]]:
    rows = []
    summary = []
    for synchronous, runs in results.items():
        ours, base = runs["halfpi"], runs["raw"]
        top, btop = best(ours, "events_per_s"), best(base, "events_per_s")
        ratio = top["events_per_s"] / btop["events_per_s"]
        median_ratio = median([r["events_per_s"] for r in ours]) / median(
            [r["events_per_s"] for r in base]
        )
        rows.append(
            [
                synchronous,
                args.writers,
                top["events_per_s"],
                spread([r["events_per_s"] for r in ours]),
                top["per_commit"],
                f"{top['cpu_util']:.0%}",
                btop["events_per_s"],
                spread([r["events_per_s"] for r in base]),
                f"{btop['cpu_util']:.0%}",
                ratio,
                median_ratio,
                f"{top['others_util']:.0%}/{btop['others_util']:.0%}",
            ]
        )
        full = synchronous == "FULL"
        summary.append(
            summary_row(
                "append",
                f"durable append, synchronous={synchronous}",
                "events/s",
                top["events_per_s"],
                btop["events_per_s"],
                target="≥ 0.5x raw" if full else "",
                met=(ratio >= 0.5) if full else None,
                note=f"median ratio {median_ratio:.2f}; {args.writers} writers, "
                f"{top['per_commit']:.0f} events/commit",
            )
        )
    print(
        table(
            [
                "synchronous",
                "writers",
                "halfpi ev/s",
                "spread",
                "ev/commit",
                "CPU",
                "raw ev/s",
                "spread",
                "CPU",
                "ratio",
                "med. ratio",
                "rest",
            ],
            rows,
            f"Durable append (best of {args.rounds}; WAL; database on {fs}; "
            f"CPU = this process, share of one core; rest = the rest of the machine)",
        )
    )
    print()
    print(summary_table(summary, "Append summary"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument(
        "--events", type=int, default=60_000, help="events per measured run with synchronous=FULL"
    )
    parser.add_argument(
        "--normal-factor",
        type=int,
        default=2,
        help="synchronous=NORMAL runs write this many times more",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["FULL", "NORMAL"])
    parser.add_argument("--dir", default=None, help="where to create the databases")
    parser.add_argument("--quick", action="store_true", help="a third of the work")
    parser.add_argument("--verbose", action="store_true", help="print every round")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.events //= 3
    if args.dir:
        os.environ["TMPDIR"] = args.dir
    with workdir("halfpi-append-") as tmp:
        fs = filesystem(tmp)
        results = main_async_runs(args, tmp)
    rows = report(results, args, fs)
    write_json(args.json, rows, {"bench": "append"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
