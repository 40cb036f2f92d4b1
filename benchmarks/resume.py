"""Resume: a Face that missed 10,000 events reconnects with ``since`` = its cursor.

A Face subscribes, sees one short chat (its last cursor is that chat's
``chat.completed``), and disconnects. While it is away a driver runs
``/repeat 9997 x``: ``chat.message`` + ``chat.started`` + 9,997 deltas +
``chat.completed`` = 10,000 events, all inside the journal's window. The Face
reconnects, completes ``face.hello`` and sends ``face.subscribe{since}``; the
figure is the time from that send until the last missed event arrived.

Baselines in the same run:

- *raw send*: a plain ``websockets`` server ``send()``-ing the same 10,000
  frame sizes over one connection, timed from the request to the last frame;
- *live*: the same 10,000 events received live by a subscribed Face while
  the chat streamed (paced by the scripted agent, so informative only).

    python benchmarks/resume.py [--rounds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    CpuWindow,
    MindServer,
    RawServer,
    best,
    median,
    spread,
    stop_all,
    summary_row,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import (
    WsClient,
    chat_to_end,
    close_all,
    create_conversation,
    face,
    is_chat_end,
    rid,
    subscribe,
)

MISSED = 10_000
TARGET_S = 0.25


def seq_of(cursor: str) -> int:
    return int(cursor.rpartition(".")[2])


async def prepare(mind: MindServer) -> dict[str, Any]:
    """Returns the conversation, the Face's last cursor and the head after the gap."""
    token = mind.token
    driver = await face(mind.url, token)
    conversation_id = await create_conversation(driver, "resume")
    away = await face(mind.url, token)
    await subscribe(away, conversation_id)
    first = await chat_to_end(driver, conversation_id, "hello there")
    end = await away.expect(is_chat_end(first["payload"]["request_id"]))
    cursor = end["payload"]["cursor"]
    await close_all([away])

    live = await face(mind.url, token)  # the live baseline watches the whole gap
    await subscribe(live, conversation_id)
    live.raw_sizes = []
    live.reset_counters()
    result = await chat_to_end(driver, conversation_id, f"/repeat {MISSED - 3} x")
    end = await live.expect(is_chat_end(result["payload"]["request_id"]))
    head = seq_of(result["payload"]["data"]["cursor"])
    begin = next(
        m
        for m in live.messages
        if m["type"] == "face.event" and m["payload"]["type"] == "chat.message"
    )
    live_seconds = (end["_at"] - begin["_at"]) / 1e9
    sizes = live.raw_sizes[-MISSED:]
    await close_all([live, driver])
    if head - seq_of(cursor) != MISSED:
        raise RuntimeError(f"expected {MISSED} missed events, got {head - seq_of(cursor)}")
    return {
        "conversation_id": conversation_id,
        "cursor": cursor,
        "head": head,
        "sizes": sizes,
        "live_seconds": live_seconds,
    }


async def resume_once(mind: MindServer, prep: dict[str, Any]) -> dict[str, Any]:
    client = await face(mind.url, mind.token)
    conversation_id = prep["conversation_id"]
    client.reset_counters()
    request_id = rid("sub")
    with CpuWindow(mind.pid) as window:
        sent = time.time_ns()
        client.send(
            "face.subscribe",
            {
                "request_id": request_id,
                "conversation_ids": [conversation_id],
                "since": {conversation_id: prep["cursor"]},
            },
        )
        end = await client.expect(
            lambda m: m["type"] == "face.event" and m["payload"]["seq"] == prep["head"], 30
        )
    accepted = await client.expect(
        lambda m: m["type"] == "face.accepted" and m["payload"].get("request_id") == request_id
    )
    events = (
        client.events + sum(1 for m in client.messages if m["type"] == "face.event") + 1
    )  # + the last one
    await close_all([client])
    return {
        "seconds": (end["_at"] - sent) / 1e9,
        "replay": accepted["payload"]["replay"],
        "events": events,
        "deltas": client.events,
        "frames": client.frames + 3,
        "server_util": window.server_util,
        "load_util": window.load_util,
        "others_util": window.others_util,
        "saturated": window.saturated(),
    }


async def raw_once(raw: RawServer, sizes: list[int], cmd: str) -> dict[str, Any]:
    client = await WsClient.connect(raw.url)
    request_id = rid(cmd)
    with CpuWindow(raw.pid) as window:
        sent = time.time_ns()
        client.send_json({"cmd": cmd, "request_id": request_id, "sizes": sizes})
        end = await client.expect(is_chat_end(request_id), 30)
    frames = client.frames
    await close_all([client])
    return {
        "seconds": (end["_at"] - sent) / 1e9,
        "frames": frames,
        "server_util": window.server_util,
        "load_util": window.load_util,
        "others_util": window.others_util,
        "saturated": window.saturated(),
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    with workdir("halfpi-resume-") as tmp:
        mind = MindServer(tmp / "mind", delta_ms=0).start()
        raw = RawServer(tmp / "raw").start()
        try:
            prep = await prepare(mind)
            ours: list[dict[str, Any]] = []
            sends: list[dict[str, Any]] = []
            blasts: list[dict[str, Any]] = []
            await resume_once(mind, prep)  # warm-up
            await raw_once(raw, prep["sizes"], "send")
            await raw_once(raw, prep["sizes"], "blast")
            for _ in range(args.rounds):
                ours.append(await resume_once(mind, prep))
                sends.append(await raw_once(raw, prep["sizes"], "send"))
                blasts.append(await raw_once(raw, prep["sizes"], "blast"))
        finally:
            await stop_all(mind, raw)
    return report(prep, ours, sends, blasts)


def _row(label: str, runs: list[dict[str, Any]]) -> list[Any]:
    top = best(runs, "seconds", lowest=True)
    return [
        label,
        top["seconds"],
        median([r["seconds"] for r in runs]),
        spread([r["seconds"] for r in runs]),
        MISSED / top["seconds"],
        top["frames"],
        f"{top['server_util']:.0%}/{top['load_util']:.0%}",
        top["saturated"],
        f"{top['others_util']:.0%}",
    ]


def report(
    prep: dict[str, Any],
    ours: list[dict[str, Any]],
    sends: list[dict[str, Any]],
    blasts: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    for r in ours:
        if r["replay"] != "exact" or r["events"] != MISSED:
            print(f"warning: resume replay={r['replay']} events={r['events']}", file=sys.stderr)
    t_ours = best(ours, "seconds", lowest=True)["seconds"]
    t_send = best(sends, "seconds", lowest=True)["seconds"]
    t_blast = best(blasts, "seconds", lowest=True)["seconds"]
    median_ratio = median([r["seconds"] for r in ours]) / median([r["seconds"] for r in blasts])
    sizes = prep["sizes"]
    rows = [
        _row("halfpi resume (subscribe since)", ours),
        _row("raw websockets: await send() each", sends),
        _row("raw websockets: broadcast(), no yield", blasts),
        [
            "live stream (agent-paced)",
            prep["live_seconds"],
            "",
            "",
            MISSED / prep["live_seconds"],
            len(sizes),
            "",
            "",
            "",
        ],
    ]
    print(
        table(
            [
                "10,000 missed events",
                "best s",
                "median s",
                "spread",
                "events/s",
                "frames",
                "srv/load",
                "sat.",
                "rest",
            ],
            rows,
            f"Resume of {MISSED:,} events (best of {len(ours)}; "
            f"{sum(sizes):,} bytes, mean frame {sum(sizes) / len(sizes):.0f} B)",
        )
    )
    summary = [
        summary_row(
            "resume",
            f"resume {MISSED:,} missed events",
            "s",
            t_ours,
            t_blast,
            target=f"< {TARGET_S} s",
            met=t_ours < TARGET_S,
            note=f"median ratio {median_ratio:.2f}; baseline: raw broadcast() "
            f"loop; raw send() {t_send:.3f} s; live {prep['live_seconds']:.2f} s",
        ),
    ]
    print()
    print(summary_table(summary, "Resume summary (time: lower is better)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "resume"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
