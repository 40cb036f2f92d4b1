"""Memory: per idle connection, per conversation, per subscribed conversation.

Per idle connection, for each server (a Mind; the raw baseline
``_raw_server.py``, the leanest server of the same process model; and a
default ``websockets.asyncio.server``, what a typical Python WebSocket
server holds), each answering a hello of the same size with a reply the
size of ``face.welcome`` and keeping the connection, in a fresh process
(with ``--servers asgi``, the default: also ``halfpi mind --server asgi``
and its baseline ``_raw_asgi.py``, a Starlette endpoint under uvicorn):

1. open 50 warm-up connections (so code paths and allocator pools exist);
2. read VmRSS from ``/proc/<pid>/status`` (before);
3. open 1,000 more connections, 100 at a time, each completing its hello;
4. let the server settle, read VmRSS again (after);

and report ``(after - before) / 1000`` in KiB. RLIMIT_NOFILE is raised for
this process and the servers it starts.

Per conversation, in a fresh Mind: one Face creates 50 conversations
(warm-up), then 1,000 more (``face.conversation.create``); per subscribed
conversation: the same Face then subscribes to those 1,000 (which loads one
actor and one journal window each, and a subscription); then runs one
one-word chat in each (4 events in each journal window). A subscribed
conversation is at work: its actor and journal window stay loaded while
anyone follows it (idle ones are unloaded: ``benchmarks/conversations.py``
shows RSS flat across 10,000 → 50,000 conversations served). No baseline: a
raw server has no conversations.

``--against BASE_SRC`` adds, in each round, the same measurement of a Mind
running another tree's ``src`` (e.g. the commit before a change): the
per-connection figure against it is paired round by round.

    python benchmarks/memory.py [--connections N] [--rounds R] [--json PATH]
                                [--against BASE_SRC]
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
    RawAsgiServer,
    RawServer,
    Server,
    WsServer,
    figure,
    median,
    python_of,
    raise_nofile,
    rss_kib,
    spread,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import (
    HELLO_CLIENT,
    WsClient,
    chat_to_end,
    close_all,
    create_conversation,
    face,
    is_reply,
    many,
    rid,
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


async def against_round(tmp: Path, index: int, n: int, src: str) -> dict[str, Any]:
    """The same idle connections on a Mind running the tree at ``src``."""
    mind = MindServer(tmp / f"mind-against-{index}", delta_ms=0, python=python_of(src)).start()
    try:
        token = mind.token
        return await measure(mind, lambda: face(mind.url, token), n)
    finally:
        await stop_all(mind)


async def one_round(tmp: Path, index: int, n: int, sizes: dict[str, int],
                    asgi: bool) -> dict[str, Any]:
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
    out = {"halfpi": ours}
    if asgi:  # the same Mind under uvicorn: halfpi mind --server asgi
        mind = MindServer(tmp / f"mind-asgi-{index}", delta_ms=0, server="asgi").start()
        try:
            token = mind.token

            async def hello_asgi() -> WsClient:
                return await face(mind.url, token)

            out["halfpi-asgi"] = await measure(mind, hello_asgi, n)
        finally:
            await stop_all(mind)

    pad = "p" * max(0, sizes["hello"] - 50)
    baselines: list[tuple[str, Server]] = [("raw", RawServer(tmp / f"raw-{index}")),
                                           ("websockets", WsServer(tmp / f"ws-{index}"))]
    if asgi:
        baselines.append(("raw-asgi", RawAsgiServer(tmp / f"raw-asgi-{index}")))
    for name, server in baselines:
        server.start()
        try:

            async def raw_hello(url: str = server.url) -> WsClient:
                client = await WsClient.connect(url)
                client.send_json({"cmd": "hello", "reply_size": sizes["welcome"], "pad": pad})
                await client.expect(lambda m: m["type"] == "face.welcome")
                return client

            out[name] = await measure(server, raw_hello, n)
        finally:
            await stop_all(server)
    return out


async def conversations(tmp: Path, index: int, m: int) -> dict[str, Any]:
    """RSS per created conversation, then per subscribed one, in a fresh Mind."""
    mind = MindServer(tmp / f"mind-conv-{index}", delta_ms=0).start()
    try:
        client = await face(mind.url, mind.token)
        for i in range(WARM):
            await create_conversation(client, f"warm-{i}")
        before = await settled_rss(mind.pid)
        ids = [await create_conversation(client, f"c-{i}") for i in range(m)]
        created = await settled_rss(mind.pid)
        for start in range(0, m, 100):
            request_id = rid("sub")
            client.send("face.subscribe", {"request_id": request_id,
                                           "conversation_ids": ids[start:start + 100]})
            reply = await client.expect(is_reply(request_id, "face.accepted", "face.error"), 60)
            if reply["type"] != "face.accepted":
                raise RuntimeError(f"subscribe failed: {reply}")
        subscribed = await settled_rss(mind.pid)
        for cid in ids:  # one short chat each: 4 events in each journal window
            await chat_to_end(client, cid, "hello")
        chatted = await settled_rss(mind.pid)
        await close_all([client])
    finally:
        await stop_all(mind)
    return {"created_kib": (created - before) / m, "subscribed_kib": (subscribed - created) / m,
            "chatted_kib": (chatted - subscribed) / m}


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    raise_nofile(args.connections * 2 + 1024)
    sizes: dict[str, int] = {}
    rounds = []
    convs = []
    with workdir("halfpi-memory-") as tmp:
        for index in range(args.rounds):
            rounds.append(await one_round(tmp, index, args.connections, sizes,
                                          "asgi" in args.servers))
            if args.against:
                rounds[-1]["against"] = await against_round(tmp, index, args.connections,
                                                            args.against)
            convs.append(await conversations(tmp, index, args.conversations))
    return report(rounds, convs, args, sizes)


def report(rounds: list[dict[str, Any]], convs: list[dict[str, Any]], args: argparse.Namespace,
           sizes: dict[str, int]) -> list[dict[str, Any]]:
    n = args.connections
    rows = []
    for side, label in (("halfpi", "halfpi Mind"), ("raw", "raw (lean Protocol) server"),
                        ("websockets", "websockets.asyncio.server, defaults"),
                        ("halfpi-asgi", "halfpi Mind --server asgi (uvicorn)"),
                        ("raw-asgi", "Starlette endpoint under uvicorn")):
        if side not in rounds[0]:
            continue
        runs = [r[side] for r in rounds]
        rows.append([label, median([r["before_kib"] for r in runs]) / 1024,
                     median([r["after_kib"] for r in runs]) / 1024,
                     median([r["per_conn_kib"] for r in runs]),
                     spread([r["per_conn_kib"] for r in runs])])
    for key, label in (("created_kib", "halfpi, per created conversation"),
                       ("subscribed_kib", "halfpi, per subscribed conversation"),
                       ("chatted_kib", "halfpi, per conversation's first chat")):
        rows.append([label, "", "", median([c[key] for c in convs]),
                     spread([c[key] for c in convs])])
    print(table(
        ["server", "RSS before MiB", "RSS after MiB", "KiB each", "spread"],
        rows,
        f"Memory ({n:,} connections after hello, {args.conversations:,} conversations; median "
        f"of {len(rounds)}; hello {sizes['hello']} B, welcome {sizes['welcome']} B)",
    ))
    ws = median([r["websockets"]["per_conn_kib"] for r in rounds])
    summary = [
        figure("memory", f"RSS per idle connection ({n:,})", "KiB",
               [r["halfpi"] for r in rounds], [r["raw"] for r in rounds], "per_conn_kib",
               lower_is_better=True, target=f"≤ {TARGET_KIB:g} KiB",
               judge=lambda m, _r: m <= TARGET_KIB,
               note=f"baseline: the lean raw server; websockets.asyncio.server {ws:.1f} KiB"),
        figure("memory", f"RSS per conversation created ({args.conversations:,})", "KiB",
               convs, None, "created_kib", lower_is_better=True,
               note="request record, SQLite page cache"),
        figure("memory", f"RSS per subscribed conversation ({args.conversations:,})", "KiB",
               convs, None, "subscribed_kib", lower_is_better=True,
               note="actor + journal window + subscription, loaded while followed"),
        figure("memory", "RSS per conversation's first chat", "KiB",
               convs, None, "chatted_kib", lower_is_better=True,
               note="a one-word chat: 4 events kept in the journal window, request record"),
    ]
    if args.against:
        summary.insert(1, figure(
            "memory", f"RSS per idle connection ({n:,}), vs {args.against}", "KiB",
            [r["halfpi"] for r in rounds], [r["against"] for r in rounds], "per_conn_kib",
            lower_is_better=True, target="≤ 7 KiB", judge=lambda m, _r: m <= 7.0,
            note="the same measurement on a Mind running the other tree, each round",
        ))
    for row in summary:
        row["adapter"] = "native"
    if "halfpi-asgi" in rounds[0]:
        asgi = [r["halfpi-asgi"] for r in rounds]
        summary.append({**figure(
            "memory", f"ASGI: RSS per idle connection ({n:,})", "KiB",
            asgi, [r["raw-asgi"] for r in rounds], "per_conn_kib",
            lower_is_better=True, target=f"≤ {TARGET_KIB:g} KiB",
            judge=lambda m, _r: m <= TARGET_KIB,
            note="baseline: a Starlette WebSocket endpoint under uvicorn (_raw_asgi.py)",
        ), "adapter": "asgi"})
        summary.append({**figure(
            "memory", f"ASGI Mind / native Mind: RSS per idle connection ({n:,})", "KiB",
            asgi, [r["halfpi"] for r in rounds], "per_conn_kib", lower_is_better=True,
            note="the adapter's cost: halfpi --server asgi against halfpi's own server",
        ), "adapter": "asgi"})
    print()
    print(summary_table(summary, "Memory summary"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--servers", nargs="+", choices=("native", "asgi"),
                        default=["native", "asgi"],
                        help="asgi: also halfpi --server asgi and the raw ASGI server")
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--against", metavar="BASE_SRC",
                        help="also a Mind running the tree in BASE_SRC, paired per round")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "memory"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
