"""Memory per idle connection: a Mind holding 1,000 Faces that completed face.hello.

For each server (a Mind, then the baseline: a plain ``websockets`` server that
answers a hello of the same size with a reply the size of ``face.welcome``
and keeps the connection open), in a fresh process:

1. open 50 warm-up connections (so code paths and allocator pools exist);
2. read VmRSS from ``/proc/<pid>/status`` (before);
3. open 1,000 more connections, 100 at a time, each completing its hello;
4. let the server settle, read VmRSS again (after);

and report ``(after - before) / 1000`` in KiB. RLIMIT_NOFILE is raised for
this process and the servers it starts.

    python benchmarks/memory.py [--connections N] [--rounds R] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import msgspec
from _bench import (
    MindServer,
    RawServer,
    Server,
    median,
    raise_nofile,
    rss_kib,
    spread,
    stop_all,
    summary_row,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import (
    HELLO_CLIENT,
    WsClient,
    close_all,
    face,
    many,
)

WARM = 50
TARGET_KIB = 30.0
SETTLE_S = 1.0


async def settled_rss(pid: int) -> int:
    """VmRSS once it stopped moving (or after a few tries)."""
    await asyncio.sleep(SETTLE_S)
    last = rss_kib(pid)
    for _ in range(5):
        await asyncio.sleep(0.2)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


async def measure(server: Server, connect: Any, n: int) -> dict[str, Any]:
    warm = await many(connect, WARM)
    before = await settled_rss(server.pid)
    clients = await many(connect, n)
    after = await settled_rss(server.pid)
    await close_all([*warm, *clients])
    return {"before_kib": before, "after_kib": after, "per_conn_kib": (after - before) / n}


async def one_round(tmp: Path, index: int, n: int, sizes: dict[str, int]) -> dict[str, Any]:
    mind = MindServer(tmp / f"mind-{index}", delta_ms=0).start()
    try:
        token = mind.token

        async def hello() -> WsClient:
            return await face(mind.url, token)

        if not sizes:  # what a hello and a welcome weigh on the wire
            probe = await WsClient.connect(mind.url)
            probe.raw_sizes = []
            hello_frame = {
                "type": "face.hello",
                "payload": {"token": token, "client": HELLO_CLIENT, "protocol": 3},
            }
            probe.send_json(hello_frame)
            await probe.expect(lambda m: m["type"] == "face.welcome")
            sizes["hello"] = len(msgspec.json.encode(hello_frame))
            sizes["welcome"] = probe.raw_sizes[0]
            await close_all([probe])
        ours = await measure(mind, hello, n)
    finally:
        await stop_all(mind)

    raw = RawServer(tmp / f"raw-{index}").start()
    try:
        pad = "p" * max(0, sizes["hello"] - 50)

        async def raw_hello() -> WsClient:
            client = await WsClient.connect(raw.url)
            client.send_json({"cmd": "hello", "reply_size": sizes["welcome"], "pad": pad})
            await client.expect(lambda m: m["type"] == "face.welcome")
            return client

        base = await measure(raw, raw_hello, n)
    finally:
        await stop_all(raw)
    return {"halfpi": ours, "raw": base}


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    raise_nofile(args.connections * 2 + 1024)
    sizes: dict[str, int] = {}
    rounds = []
    with workdir("halfpi-memory-") as tmp:
        for index in range(args.rounds):
            rounds.append(await one_round(tmp, index, args.connections, sizes))
    return report(rounds, args.connections, sizes)


def report(rounds: list[dict[str, Any]], n: int, sizes: dict[str, int]) -> list[dict[str, Any]]:
    rows = []
    per: dict[str, float] = {}
    for side, label in (("halfpi", "halfpi Mind"), ("raw", "raw websockets server")):
        runs = [r[side] for r in rounds]
        per[side] = median([r["per_conn_kib"] for r in runs])
        rows.append(
            [
                label,
                median([r["before_kib"] for r in runs]) / 1024,
                median([r["after_kib"] for r in runs]) / 1024,
                per[side],
                spread([r["per_conn_kib"] for r in runs]),
            ]
        )
    print(
        table(
            ["server", "RSS before MiB", "RSS after MiB", "KiB/connection", "spread"],
            rows,
            f"Memory per idle connection ({n:,} connections after face.hello, median of "
            f"{len(rounds)}; hello {sizes['hello']} B, welcome {sizes['welcome']} B)",
        )
    )
    summary = [
        summary_row(
            "memory",
            f"RSS per idle connection ({n:,})",
            "KiB",
            per["halfpi"],
            per["raw"],
            target=f"≤ {TARGET_KIB:g} KiB",
            met=per["halfpi"] <= TARGET_KIB,
            note="baseline: websockets.asyncio.server, default settings",
        )
    ]
    print()
    print(summary_table(summary, "Memory summary"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "memory"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
