"""Durable event appends through the PostgreSQL Store (cluster mode), against
raw asyncpg writing the same rows into the same table, same run.

**halfpi**: W concurrent writers (one conversation each, as the Mind's
conversations write) each awaiting ``PostgresStore.write(WriteTx(events=[e]))``
in a loop: the Store's group commit merges everything queued while the last
commit was in flight into one ``INSERT … SELECT FROM unnest(…)``, a statement
of its own (no ``BEGIN``/``COMMIT`` round trips). **halfpi, fenced**: the
same with ``WriteTx.fence`` set (cluster mode: each write carries its
owner's fencing token); the same single statement reads the batch's fence
rows ``FOR SHARE`` and inserts only if every token holds (a claim or a stale
token goes through ``halfpi_fence`` in a transaction instead).

Baselines, one connection, the rows built before the clock starts, W rows
per transaction (the batch the group commit reaches with W writers):

- **executemany**: ``BEGIN; executemany(INSERT … VALUES ($1…$6), W rows); COMMIT``
  (asyncpg pipelines the binds of one prepared statement);
- **executemany, fenced**: the same, with the W fences checked and raised
  by the database's ``halfpi_fence`` in one statement first (what a fenced
  batch must do in the database, whoever writes it);
- **COPY**: ``BEGIN; copy_records_to_table('events', W rows); COMMIT``.

Same schema (the Store's own, ``init_schema``), a fresh database per round,
rounds rotating the order of the sides. The server is a throw-away
PostgreSQL (``tests/support/postgres.py``) on this machine's disk, with
PostgreSQL's **defaults** (``fsync``, ``full_page_writes``,
``synchronous_commit`` on: every commit waits for its WAL flush); with
``--modes on off`` a second server with ``fsync=off`` shows the CPU cost
alone. CPU: this process (the Store's or the baseline's Python side) and
every PostgreSQL process (backends, WAL writer, checkpointer), each as a
share of one core.

    python benchmarks/pg_append.py [--writers W] [--events N] [--rounds R] [--modes on off]
                                   [--sides halfpi halfpi-fenced executemany …]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    figure,
    machine_busy_seconds,
    saturation,
    summary_table,
    table,
    write_json,
)
from _cluster import (
    PgCpu,
    PostgresServer,
    create_database,
    missing,
    start_postgres,
    stop_cleanly_on_sigterm,
)

from halfpi.store.base import Fence, StoredEvent, WriteTx
from halfpi.store.postgres import PostgresStore
from halfpi.store.postgres_schema import init_schema

# The event append.py writes: one that ends no run, ~120 B of JSON.
TYPE = "chat.message"
DATA = (
    b'{"request_id":"chat-000123","role":"user","client_hint":"r_0000000000000000",'
    b'"content":"a short message of a few words"}'
)
COLUMNS = ("conversation_id", "seq", "type", "data", "ts", "terminal_of")
INSERT = "INSERT INTO events (conversation_id, seq, type, data, ts, terminal_of) " \
         "VALUES ($1, $2, $3, $4, $5, $6)"
SIDES = ("halfpi", "halfpi-fenced", "executemany", "executemany-fenced", "copy")
FENCE = ("SELECT halfpi_fence(c, t) FROM unnest($1::text[], $2::bigint[])"
         " WITH ORDINALITY AS f(c, t, n) ORDER BY n")
WARM = 5  # writes per writer before the clock


class Window:
    """Wall time, this process's CPU, PostgreSQL's and the rest of the machine's."""

    def __init__(self, pg: PgCpu) -> None:
        self.pg = pg

    def __enter__(self) -> Window:
        self._pg = self.pg.snapshot()
        self._machine = machine_busy_seconds()
        self._cpu = time.process_time()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        self.cpu = time.process_time() - self._cpu
        self.pg_cpu = PgCpu.used(self._pg, self.pg.snapshot())
        self.machine = machine_busy_seconds() - self._machine

    def as_dict(self, work: int, commits: int) -> dict[str, Any]:
        util = self.cpu / self.seconds
        pg_util = self.pg_cpu / self.seconds
        return {
            "per_s": work / self.seconds,
            "seconds": self.seconds,
            "commits": commits,
            "per_commit": work / max(1, commits),
            "server_util": util,  # the side under test: this process
            "pg_util": pg_util,
            "cpu_us": (self.cpu + self.pg_cpu) / work * 1e6,
            "load_util": 0.0,
            "load_max": 0.0,
            "others_util": max(0.0, self.machine - self.cpu - self.pg_cpu) / self.seconds,
            "saturated": saturation(util, 0.0),
        }


async def fresh_database(server: PostgresServer, name: str) -> str:
    import asyncpg

    url = await create_database(server, name)
    conn = await asyncpg.connect(url)
    try:
        await init_schema(conn)
    finally:
        await conn.close()
    return url


async def drop_database(server: PostgresServer, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(server.url)
    try:
        await conn.execute(f'DROP DATABASE "{name}"')
    finally:
        await conn.close()


async def count_rows(url: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM events"))
    finally:
        await conn.close()


async def halfpi_side(url: str, pg: PgCpu, writers: int, per_writer: int,
                      fenced: bool) -> dict[str, Any]:
    store = PostgresStore(url)
    await store.open()
    now = time.time()

    async def writer(index: int, first: int, count: int) -> None:
        conversation_id = f"c{index:04d}"
        fence = Fence(conversation_id, 1) if fenced else None
        for seq in range(first, first + count):
            event = StoredEvent(conversation_id, seq, TYPE, DATA, now)
            await store.write(WriteTx(events=[event], fence=fence))

    try:
        await asyncio.gather(*(writer(w, 1, WARM) for w in range(writers)))
        batches = store.batches
        with Window(pg) as window:
            await asyncio.gather(*(writer(w, 1 + WARM, per_writer) for w in range(writers)))
        commits = store.batches - batches
    finally:
        await store.close()
    return window.as_dict(writers * per_writer, commits)


async def raw_side(url: str, pg: PgCpu, writers: int, per_writer: int,
                   how: str) -> dict[str, Any]:
    import asyncpg

    conn = await asyncpg.connect(url)
    now = time.time()
    data = DATA.decode()

    conversations = [f"c{w:04d}" for w in range(writers)]
    tokens = [1] * writers

    def batch(seq: int) -> list[tuple[Any, ...]]:
        return [(c, seq, TYPE, data, now, None) for c in conversations]

    async def commit(rows: list[tuple[Any, ...]]) -> None:
        async with conn.transaction():
            if how == "executemany-fenced":
                await conn.execute(FENCE, conversations, tokens)
            if how == "copy":
                await conn.copy_records_to_table("events", records=rows, columns=COLUMNS)
            else:
                await conn.executemany(INSERT, rows)

    try:
        for seq in range(1, 1 + WARM):
            await commit(batch(seq))
        batches = [batch(seq) for seq in range(1 + WARM, 1 + WARM + per_writer)]
        with Window(pg) as window:
            for rows in batches:
                await commit(rows)
    finally:
        await conn.close()
    return window.as_dict(writers * per_writer, len(batches))


async def run_mode(mode: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    server = start_postgres(durable=mode == "on")
    try:
        pg = PgCpu(server)
        per = args.events // args.writers
        sides = tuple(side for side in SIDES if side in args.sides)
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        counter = 0
        for index in range(args.rounds):
            shift = index % len(sides)
            for side in sides[shift:] + sides[:shift]:
                counter += 1
                name = f"bench_{side.replace('-', '_')}_{counter}"
                url = await fresh_database(server, name)
                if side.startswith("halfpi"):
                    r = await halfpi_side(url, pg, args.writers, per, side == "halfpi-fenced")
                else:
                    r = await raw_side(url, pg, args.writers, per, side)
                stored = await count_rows(url)
                expected = args.writers * (per + WARM)
                if stored != expected:
                    raise RuntimeError(f"{side}: {stored} rows stored, {expected} expected")
                await drop_database(server, name)
                runs[side].append(r)
                if args.verbose:
                    print(f"fsync={mode} {side}: {r['per_s']:,.0f}/s, "
                          f"{r['per_commit']:.1f} per commit", file=sys.stderr)
        return runs
    finally:
        server.stop()


def _pct(x: float) -> str:
    return f"{x:.0%}"


def report(results: dict[str, dict[str, list[dict[str, Any]]]],
           args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    summary = []
    for mode, runs in results.items():
        for side in runs:
            for i, r in enumerate(runs[side]):
                rows.append([f"fsync={mode} {side} #{i + 1}", r["per_s"], r["commits"],
                             r["per_commit"], _pct(r["server_util"]), _pct(r["pg_util"]),
                             r["cpu_us"], _pct(r["others_util"])])
        durable = mode == "on"
        settings = ("PostgreSQL defaults: fsync, synchronous_commit on" if durable
                    else "fsync=off, full_page_writes=off")
        pairs = (
            ("halfpi", "Store append", "executemany", "raw executemany"),
            ("halfpi", "Store append", "copy", "raw COPY"),
            ("halfpi-fenced", "Store append, fenced", "executemany", "raw executemany"),
            ("halfpi-fenced", "Store append, fenced", "executemany-fenced",
             "raw executemany, fenced"),
        )
        for side, what, base, how in pairs:
            if side not in runs or base not in runs:
                continue
            targeted = durable and base == "executemany"
            # issue 26: a fenced append at least 0.7x the raw batch; a plain one 0.5x
            bar = 0.7 if side == "halfpi-fenced" else 0.5
            ours = runs[side]
            note = (f"{args.writers} writers; {settings}; halfpi "
                    f"{sum(r['per_commit'] for r in ours) / len(ours):.0f} events/commit; "
                    f"CPU per event (this process + PostgreSQL) halfpi "
                    f"{sum(r['cpu_us'] for r in ours) / len(ours):.1f} µs, {how} "
                    f"{sum(r['cpu_us'] for r in runs[base]) / len(runs[base]):.1f} µs; "
                    f"PostgreSQL CPU halfpi "
                    f"{_pct(sum(r['pg_util'] for r in ours) / len(ours))}, {how} "
                    f"{_pct(sum(r['pg_util'] for r in runs[base]) / len(runs[base]))}")
            summary.append(figure(
                "pg_append", f"PG {what} vs {how}, fsync={mode}", "events/s",
                ours, runs[base], "per_s",
                target=f"≥ {bar:g}x raw executemany" if targeted else "",
                judge=(lambda _m, ratio, bar=bar: None if ratio is None else ratio >= bar)
                if targeted else None,
                note=note,
            ))
            if base.startswith("executemany"):
                summary.append(figure(
                    "pg_append", f"CPU per event, {what} vs {how}, fsync={mode}", "µs",
                    ours, runs[base], "cpu_us", lower_is_better=True,
                    note="this process (the Store, or the baseline) and every PostgreSQL "
                         "process, per event",
                ))
    print(table(["round", "events/s", "commits", "per commit", "CPU here", "CPU PostgreSQL",
                 "CPU µs/event", "rest"], rows,
                "Durable appends on PostgreSQL (CPU: share of one core; here = this process, "
                "the Store or the baseline; rest = the rest of the machine)"))
    print()
    print(summary_table(summary, "PostgreSQL append summary (medians; ratio = median of "
                                 "per-round ratios)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--events", type=int, default=30_000, help="events per round and side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=("on", "off"), default=["on", "off"],
                        help="fsync of the server: on (PostgreSQL's defaults), off")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                        help="run only these sides (a figure needs both of its sides)")
    parser.add_argument("--quick", action="store_true", help="a third of the work, 3 rounds")
    parser.add_argument("--verbose", action="store_true", help="print every round")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.events //= 3
        args.rounds = min(args.rounds, 3)
    stop_cleanly_on_sigterm()
    why = missing()
    if why is not None:
        sys.exit(f"pg_append: no PostgreSQL: {why}")
    results = {mode: asyncio.run(run_mode(mode, args)) for mode in args.modes}
    rows = report(results, args)
    write_json(args.json, rows, {"bench": "pg_append"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
