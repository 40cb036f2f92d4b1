"""Idle CPU: what a server spends holding connections that do nothing.

Two phases, each a Mind against the raw baseline (``_raw_server.py``) in
the same run:

1. **Between heartbeats** (the maintenance cost): a Mind whose heartbeat is
   held off (``heartbeat_s`` = 1 h through ``_mind.py``) and a raw server
   without pings. Connections are added in steps up to 10,000, each
   completing its hello; after each step the server's CPU is read over
   ``--window`` seconds, ``--windows`` times (median). The Mind still runs
   its 0.25 s maintenance round (credential re-read, sessions whose
   deadline came); this shows it does not grow with idle connections.
2. **With heartbeats** (the whole idle cost): a Mind with the default
   heartbeat (15 s: a ``face.ping`` to each connection) and a raw server
   sending a WebSocket ping every 15 s on every connection; one window of
   15 s with the largest count, i.e. exactly one heartbeat per connection.

Clients are the lean client in this process (it answers WebSocket pings
with pongs and ignores ``face.ping``).

``--against BASE_SRC`` (another tree's ``src``, e.g. the commit before a
change) measures this tree's Mind against that one instead, paired: both
Minds run at once, each holding ``max(--counts)`` connections, and every
window reads both servers' CPU over the same seconds (so the machine's load
falls on both alike); ``--rounds`` windows between heartbeats, then as many
of 15 s with the default heartbeat. The ratio of each window's pair is the
figure (median and spread).

    python benchmarks/idle.py [--counts 50 1000 3000 10000] [--window S]
    python benchmarks/idle.py --against /tmp/before/src --counts 3000 [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from _bench import (
    CpuWindow,
    MindServer,
    RawServer,
    Server,
    figure,
    median,
    python_of,
    raise_nofile,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import WsClient, close_all, face, many

HEARTBEAT_S = 15.0
QUIET = {"heartbeat_s": 3600.0, "dead_after_s": 10_800.0}


async def raw_client(url: str) -> WsClient:
    client = await WsClient.connect(url)
    client.send_json({"cmd": "hello", "reply_size": 900})
    await client.expect(lambda m: m["type"] == "face.welcome")
    return client


async def windows(server: Server, seconds: float, count: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(count):
        with CpuWindow(server.pid) as window:
            await asyncio.sleep(seconds)
        out.append(window.as_dict())
    return out


async def steps(server: Server, connect: Any, counts: list[int], seconds: float,
                count: int) -> dict[int, list[dict[str, Any]]]:
    clients: list[WsClient] = []
    out = {}
    try:
        for n in counts:
            clients += await many(connect, n - len(clients), batch=200)
            await asyncio.sleep(0.5)  # let the connects' own work settle
            out[n] = await windows(server, seconds, count)
    finally:
        await close_all(clients, timeout=30)
    return out


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    raise_nofile(max(args.counts) * 2 + 1024)
    with workdir("halfpi-idle-") as tmp:
        mind = MindServer(tmp / "mind-quiet", delta_ms=0, overrides=QUIET).start()
        try:
            token = mind.token
            ours = await steps(mind, lambda: face(mind.url, token), args.counts, args.window,
                               args.windows)
        finally:
            await stop_all(mind)
        raw = RawServer(tmp / "raw-quiet").start()
        try:
            base = await steps(raw, lambda: raw_client(raw.url), args.counts, args.window,
                               args.windows)
        finally:
            await stop_all(raw)
        beat: dict[str, list[dict[str, Any]]] = {}
        if not args.no_heartbeat:
            top = max(args.counts)
            mind = MindServer(tmp / "mind-beat", delta_ms=0).start()
            try:
                token = mind.token
                beat["halfpi"] = (await steps(mind, lambda: face(mind.url, token), [top],
                                              HEARTBEAT_S, 1))[top]
            finally:
                await stop_all(mind)
            raw = RawServer(tmp / "raw-beat", ping_interval=HEARTBEAT_S).start()
            try:
                beat["raw"] = (await steps(raw, lambda: raw_client(raw.url), [top],
                                           HEARTBEAT_S, 1))[top]
            finally:
                await stop_all(raw)
    return report(ours, base, beat, args)


async def paired(args: argparse.Namespace) -> list[dict[str, Any]]:
    """This tree's Mind and the one at ``--against``, at once, window by window."""
    n = max(args.counts)
    raise_nofile(n * 4 + 1024)
    summary = []
    with workdir("halfpi-idle-against-") as tmp:
        for phase, overrides, seconds in (("between heartbeats", QUIET, args.window),
                                          ("with heartbeats", {}, HEARTBEAT_S)):
            if phase == "with heartbeats" and args.no_heartbeat:
                continue
            tag = "beat" if overrides == {} else "quiet"
            this = MindServer(tmp / f"this-{tag}", delta_ms=0, overrides=overrides).start()
            base = MindServer(tmp / f"base-{tag}", delta_ms=0, overrides=overrides,
                              python=python_of(args.against)).start()
            clients: list[WsClient] = []
            ours: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            try:
                for server in (this, base):
                    token = server.token
                    clients += await many(lambda s=server, t=token: face(s.url, t), n,
                                          batch=200)
                await asyncio.sleep(0.5)
                for _ in range(args.rounds):
                    with CpuWindow(this.pid) as a, CpuWindow(base.pid) as b:
                        await asyncio.sleep(seconds)
                    for side, window in ((ours, a), (theirs, b)):
                        row = window.as_dict()
                        row["cpu_pct"] = row["server_util"] * 100
                        row["us_per_conn_s"] = window.server / n / window.wall * 1e6
                        side.append(row)
            finally:
                await close_all(clients, timeout=30)
                await stop_all(this, base)
            summary.append(figure(
                "idle", f"idle CPU, {n:,} connections, {phase}, vs {args.against}", "% core",
                ours, theirs, "cpu_pct", lower_is_better=True,
                note=f"both Minds at once, {args.rounds} windows of {seconds:g} s; "
                f"rest of the machine {median([r['others_util'] for r in ours]):.0%}",
            ))
    print(summary_table(summary, "Idle CPU against another tree (lower is better)"))
    return summary


def report(ours: dict[int, list[dict[str, Any]]], base: dict[int, list[dict[str, Any]]],
           beat: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for n in args.counts:
        h = median([w["server_util"] for w in ours[n]])
        b = median([w["server_util"] for w in base[n]])
        rows.append([f"{n:,}", f"{h:.2%}", f"{b:.2%}",
                     f"{median([w['others_util'] for w in ours[n]]):.0%}"])
    print(table(["idle connections", "halfpi CPU", "raw CPU", "rest"], rows,
                f"Idle CPU between heartbeats (share of one core, median of {args.windows} "
                f"windows of {args.window:g} s)"))
    summary = []
    for n in args.counts:
        for w in (*ours[n], *base[n]):
            w["cpu_pct"] = w["server_util"] * 100
        summary.append(figure(
            "idle", f"idle CPU, {n:,} connections, between heartbeats", "% core",
            ours[n], base[n], "cpu_pct", lower_is_better=True,
            note="maintenance round every 0.25 s; heartbeat held off",
        ))
    if beat:
        top = max(args.counts)
        for w in (*beat["halfpi"], *beat["raw"]):
            w["cpu_pct"] = w["server_util"] * 100
            w["us_per_beat"] = w["server_cpu_s"] / top * 1e6
        summary.append(figure(
            "idle", f"idle CPU, {top:,} connections, with heartbeats", "% core",
            beat["halfpi"], beat["raw"], "cpu_pct", lower_is_better=True,
            note=f"one {HEARTBEAT_S:g} s window: one face.ping (raw: a WebSocket ping) per "
            f"connection; per connection and heartbeat: halfpi "
            f"{beat['halfpi'][0]['us_per_beat']:.1f} µs, "
            f"raw {beat['raw'][0]['us_per_beat']:.1f} µs",
        ))
    # Flat: the largest count costs no more than the smallest, give or take noise.
    small, large = ours[min(args.counts)], ours[max(args.counts)]
    growth = median([w["cpu_pct"] for w in large]) - median([w["cpu_pct"] for w in small])
    summary[len(args.counts) - 1]["target"] = "flat (≤ +0.1 % core)"
    summary[len(args.counts) - 1]["met"] = growth <= 0.1
    summary[len(args.counts) - 1]["note"] += f"; {growth:+.2f} % core against {min(args.counts)}"
    print()
    print(summary_table(summary, "Idle summary (lower is better)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[50, 1000, 3000, 10_000])
    parser.add_argument("--window", type=float, default=2.5, help="seconds per window")
    parser.add_argument("--windows", type=int, default=3, help="windows per count")
    parser.add_argument("--no-heartbeat", action="store_true", help="skip phase 2")
    parser.add_argument("--quick", action="store_true", help="up to 3,000, no phase 2")
    parser.add_argument("--json", help="write the summary rows to this file")
    parser.add_argument("--against", metavar="BASE_SRC",
                        help="pair this tree's Mind with the one in BASE_SRC (see above)")
    parser.add_argument("--rounds", type=int, default=3, help="paired windows (--against)")
    args = parser.parse_args()
    if args.quick:
        args.counts = [c for c in args.counts if c <= 3000]
        args.no_heartbeat = True
        args.windows = 2
    rows = asyncio.run(paired(args) if args.against else main_async(args))
    write_json(args.json, rows, {"bench": "idle"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
