"""Memory that follows the work: RSS of a Mind across 10,000 → 50,000 conversations.

Each conversation is created, has one short chat (``face.chat`` "hello",
to its ``face.result``) and goes idle: nobody subscribes to it. The Mind
runs with a short idle window (``unload_idle_s``, default 1 s here; the
production default is the journal's 5 minutes), so the maintenance unloads
each actor and drops its journal window soon after its chat. After each
step (10,000, 20,000, 50,000 conversations in all) the script waits for
the idle window to pass and reads the Mind's settled VmRSS. It prints RSS
per step and the growth per conversation between steps: flat means the
Mind's memory follows the conversations at work, not every conversation it
has ever served. The first reading comes after ``--warm`` conversations
(5,000), once the SQLite page caches (about 2 MiB per connection) and the
allocator's pools have filled: what grows before that is bounded, not per
conversation.

**Memory given back.** The Mind's RSS is also read before any
conversation (its Faces connected: the *empty Mind*); the figure is the
RSS after the first step — ``--warm`` plus 10,000 conversations served,
every one unloaded (no actor loaded) — against that: target within 10 %
(``≤ 1.10x``). What stays is the allocator's and the SQLite page caches'
(bounded), not the conversations' (``mind/trim.py`` returns the pages
unloading freed).

``--without-unloading`` runs the same first two steps against a Mind that
never unloads (an idle window of a day), for comparison: there every
conversation keeps its actor and journal window for the life of the
process.

Several Face connections (``--faces``) share the work, each running its
conversations one after the other, so the Store's group commit is used as
a real Mind's would be.

    python benchmarks/conversations.py [--steps 10000 20000 50000] [--idle-s 1]
                                       [--faces 32] [--warm 5000] [--without-unloading]
                                       [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    MindServer,
    figure,
    rss_kib,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import chat_to_end, close_all, create_conversation, face

SETTLE_S = 1.0
# RSS after the first step's conversations were all unloaded, against the
# empty Mind: at most this (memory follows the work, not the history).
GIVEN_BACK_TARGET = 1.10


async def settled_rss(pid: int) -> int:
    """VmRSS (KiB) once it stopped moving (or after a few tries)."""
    await asyncio.sleep(SETTLE_S)
    last = rss_kib(pid)
    for _ in range(10):
        await asyncio.sleep(0.3)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


async def serve(clients: list[Any], start: int, count: int) -> None:
    """Conversations ``start`` … ``start + count - 1``, shared by the clients:
    each creates its share one after the other, with one chat each."""

    async def one_client(client: Any, mine: range) -> None:
        for n in mine:
            cid = await create_conversation(client, f"c-{n}")
            await chat_to_end(client, cid, "hello")
            # Every Face hears of every new conversation and title
            # (face.conversation.changed): what no one waits for goes.
            client.messages.clear()

    faces = len(clients)
    await asyncio.gather(
        *(
            one_client(client, range(start + i, start + count, faces))
            for i, client in enumerate(clients)
        )
    )


async def run(
    tmp: Path, name: str, steps: list[int], idle_s: float, faces: int, warm: int
) -> list[dict[str, Any]]:
    mind = MindServer(tmp / name, delta_ms=0, overrides={"unload_idle_s": idle_s}).start()
    rows: list[dict[str, Any]] = []
    try:
        clients = [await face(mind.url, mind.token) for _ in range(faces)]
        rows.append({"conversations": -1, "rss_kib": await settled_rss(mind.pid),
                     "seconds": 0.0})  # the empty Mind (not a step: see given_back)
        await serve(clients, 0, warm)
        await asyncio.sleep(min(idle_s, 30.0) + 0.5)
        done = 0
        before = await settled_rss(mind.pid)
        rows.append({"conversations": 0, "rss_kib": before, "seconds": 0.0})
        for total in steps:
            started = time.perf_counter()
            await serve(clients, warm + done, total - done)
            seconds = time.perf_counter() - started
            done = total
            # Past the idle window (when there is one to wait for): unloading has run.
            await asyncio.sleep(min(idle_s, 30.0) + 0.5)
            rows.append(
                {"conversations": total, "rss_kib": await settled_rss(mind.pid),
                 "seconds": seconds}
            )
            print(f"  {name}: {total:,} conversations, RSS {rows[-1]['rss_kib'] / 1024:.1f} MiB"
                  f" ({seconds:.0f} s)", file=sys.stderr)
        await close_all(clients)
    finally:
        await stop_all(mind)
    return rows


def given_back(runs: list[dict[str, Any]], warm: int) -> dict[str, Any]:
    """The figure: RSS after the first step (all unloaded) / the empty Mind's."""
    empty, after = runs[0]["rss_kib"], runs[2]["rss_kib"]
    served = warm + runs[2]["conversations"]
    row = figure(
        "conversations", f"RSS after {runs[2]['conversations']:,} conversations unloaded "
        "vs the empty Mind", "MiB", [{"mib": after / 1024}], [{"mib": empty / 1024}], "mib",
        lower_is_better=True, target=f"≤ {GIVEN_BACK_TARGET:.2f}x",
        judge=lambda _m, ratio: ratio is not None and ratio <= GIVEN_BACK_TARGET,
        note=f"{(after - empty) * 1024 / served:.0f} B kept per conversation served "
        f"({served:,}, warm-up included); baseline: the same Mind before any conversation",
    )
    return row


def report(name: str, rows: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    rows = [r for r in rows if r["conversations"] >= 0]  # the steps
    for prev, row in itertools.pairwise(rows):
        added = row["conversations"] - prev["conversations"]
        growth = row["rss_kib"] - prev["rss_kib"]
        out.append([
            name,
            f"{row['conversations']:,}",
            row["rss_kib"] / 1024,
            growth / 1024,
            growth * 1024 / added,
            added / row["seconds"] if row["seconds"] else 0.0,
        ])
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with workdir("halfpi-conversations-") as tmp:
        results["unloading"] = await run(
            tmp, "unloading", args.steps, args.idle_s, args.faces, args.warm
        )
        if args.without_unloading:
            results["never unloading"] = await run(
                tmp, "never", args.steps[:2], 86_400.0, args.faces, args.warm
            )
    rows = []
    for name, runs in results.items():
        rows += report(name, runs)
    print(table(
        ["Mind", "conversations", "RSS MiB", "growth MiB", "B per conversation",
         "conversations/s"],
        rows,
        f"RSS of a Mind after N conversations with one chat each, gone idle "
        f"(idle window {args.idle_s:g} s; {args.warm:,} warm-up conversations first)",
    ))
    summary = [given_back(results["unloading"], args.warm)]
    print()
    print(summary_table(summary, "Memory given back (lower is better)"))
    results["summary"] = summary
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 20_000, 50_000])
    parser.add_argument("--idle-s", type=float, default=1.0)
    parser.add_argument("--faces", type=int, default=32)
    parser.add_argument("--warm", type=int, default=5_000,
                        help="conversations before the first reading (caches fill)")
    parser.add_argument("--without-unloading", action="store_true",
                        help="also the first two steps on a Mind that never unloads")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    write_json(args.json, [], {"bench": "conversations", **results})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
