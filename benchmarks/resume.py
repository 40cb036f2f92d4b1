"""Resume: a Face that missed 10,000 events reconnects with ``since`` = its cursor.

A Face subscribes, sees one short chat (its last cursor is that chat's
``chat.completed``), and disconnects. While it is away a driver runs
``/repeat 9997 x``: ``chat.message`` + ``chat.started`` + 9,997 deltas +
``chat.completed`` = 10,000 events, all inside the journal's window. The Face
reconnects, completes ``face.hello`` and sends ``face.subscribe{since}``; the
figure is the time from that send until the last missed event arrived.

Baseline, same run, alternating round by round: ``_raw_server.py`` holding
the same 10,000 frame sizes *pre-encoded* (WebSocket headers included) and
writing them with one ``writelines`` when asked: the fastest raw way to send
those bytes from Python. The live stream of the same events is shown too.

Three clients, each against both servers:

- ``count``: the lean client that counts delta frames by their prefix and
  decodes nothing else (the server's figure);
- ``json``: the lean client decoding every frame with ``json.loads``, as a
  Face must (the target is judged on this one);
- ``websockets``: ``websockets.asyncio.client`` (the SDK's transport)
  receiving and ``json.loads``-ing every frame.

    python benchmarks/resume.py [--rounds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    CpuWindow,
    MindServer,
    RawServer,
    figure,
    median,
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
    is_chat_end,
    is_reply,
    rid,
    subscribe,
)
from websockets.asyncio.client import connect as ws_connect

MISSED = 10_000
TARGET_S = 0.25
CLIENTS = ("count", "json", "websockets")


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
        m for m in live.messages
        if m["type"] == "face.event" and m["payload"]["type"] == "chat.message"
    )
    live_seconds = (end["_at"] - begin["_at"]) / 1e9
    sizes = live.raw_sizes[-MISSED:]
    await close_all([live, driver])
    if head - seq_of(cursor) != MISSED:
        raise RuntimeError(f"expected {MISSED} missed events, got {head - seq_of(cursor)}")
    return {"conversation_id": conversation_id, "cursor": cursor, "head": head,
            "sizes": sizes, "live_seconds": live_seconds}


def _subscribe_frame(prep: dict[str, Any], request_id: str) -> dict[str, Any]:
    cid = prep["conversation_id"]
    return {"type": "face.subscribe",
            "payload": {"request_id": request_id, "conversation_ids": [cid],
                        "since": {cid: prep["cursor"]}}}


async def resume_lean(mind: MindServer, prep: dict[str, Any], decode: bool) -> dict[str, Any]:
    client = await face(mind.url, mind.token)
    client.decode_all = decode
    client.reset_counters()
    request_id = rid("sub")
    head = prep["head"]
    with CpuWindow(mind.pid) as window:
        sent = time.time_ns()
        client.send_json(_subscribe_frame(prep, request_id))
        end = await client.expect(
            lambda m: m["type"] == "face.event" and m["payload"]["seq"] == head, 30)
    accepted = await client.expect(is_reply(request_id, "face.accepted"))
    events = client.events + sum(1 for m in client.messages if m["type"] == "face.event") + 1
    await close_all([client])
    return {"seconds": (end["_at"] - sent) / 1e9, "replay": accepted["payload"]["replay"],
            "events": events, **window.as_dict()}


async def resume_websockets(mind: MindServer, prep: dict[str, Any]) -> dict[str, Any]:
    async with ws_connect(mind.url, max_size=None, compression=None, ping_interval=None) as ws:
        await ws.send(json.dumps({"type": "face.hello", "payload": {
            "token": mind.token, "client": HELLO_CLIENT, "protocol": 3}}))
        json.loads(await ws.recv())
        head = prep["head"]
        events = 0
        replay = ""
        with CpuWindow(mind.pid) as window:
            sent = time.time_ns()
            await ws.send(json.dumps(_subscribe_frame(prep, rid("sub"))))
            while True:
                m = json.loads(await ws.recv())
                t = m["type"]
                if t == "face.accepted":
                    replay = m["payload"].get("replay", "")
                elif t == "face.chat.delta" or t == "face.event":
                    events += 1
                    if m["payload"]["seq"] == head:
                        break
            arrived = time.time_ns()
    return {"seconds": (arrived - sent) / 1e9, "replay": replay, "events": events,
            **window.as_dict()}


async def raw_lean(raw: RawServer, sizes: list[int], decode: bool) -> dict[str, Any]:
    client = await WsClient.connect(raw.url)
    prep_id = rid("prep")
    client.send_json({"cmd": "prepare", "request_id": prep_id, "sizes": sizes})
    await client.expect(is_reply(prep_id, "face.result"))
    client.decode_all = decode
    client.reset_counters()
    request_id = rid("replay")
    with CpuWindow(raw.pid) as window:
        sent = time.time_ns()
        client.send_json({"cmd": "replay", "request_id": request_id})
        end = await client.expect(is_chat_end(request_id), 30)
    events = client.events + 1
    await close_all([client])
    return {"seconds": (end["_at"] - sent) / 1e9, "events": events, **window.as_dict()}


async def raw_websockets(raw: RawServer, sizes: list[int]) -> dict[str, Any]:
    async with ws_connect(raw.url, max_size=None, compression=None, ping_interval=None) as ws:
        prep_id = rid("prep")
        await ws.send(json.dumps({"cmd": "prepare", "request_id": prep_id, "sizes": sizes}))
        json.loads(await ws.recv())
        events = 0
        with CpuWindow(raw.pid) as window:
            sent = time.time_ns()
            await ws.send(json.dumps({"cmd": "replay", "request_id": rid("replay")}))
            while True:
                m = json.loads(await ws.recv())
                events += 1
                if m["type"] == "face.event":
                    break
            arrived = time.time_ns()
    return {"seconds": (arrived - sent) / 1e9, "events": events, **window.as_dict()}


async def one(side: str, client: str, mind: MindServer, raw: RawServer,
              prep: dict[str, Any]) -> dict[str, Any]:
    if side == "halfpi":
        if client == "websockets":
            return await resume_websockets(mind, prep)
        return await resume_lean(mind, prep, client == "json")
    if client == "websockets":
        return await raw_websockets(raw, prep["sizes"])
    return await raw_lean(raw, prep["sizes"], client == "json")


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    with workdir("halfpi-resume-") as tmp:
        mind = MindServer(tmp / "mind", delta_ms=0).start()
        raw = RawServer(tmp / "raw").start()
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        try:
            prep = await prepare(mind)
            for client in CLIENTS:
                for side in ("halfpi", "raw"):  # warm-up
                    await one(side, client, mind, raw, prep)
                for index in range(args.rounds):
                    for side in ("halfpi", "raw") if index % 2 == 0 else ("raw", "halfpi"):
                        runs.setdefault((side, client), []).append(
                            await one(side, client, mind, raw, prep))
        finally:
            await stop_all(mind, raw)
    return report(prep, runs, args.rounds)


def report(prep: dict[str, Any], runs: dict[tuple[str, str], list[dict[str, Any]]],
           rounds: int) -> list[dict[str, Any]]:
    for client in CLIENTS:
        for r in runs[("halfpi", client)]:
            if r["replay"] != "exact" or r["events"] != MISSED:
                print(f"warning: {client}: replay={r['replay']} events={r['events']}",
                      file=sys.stderr)
    rows = []
    for (side, client), rs in runs.items():
        secs = [r["seconds"] for r in rs]
        rows.append([f"{side}, {client} client", median(secs), min(secs), max(secs),
                     MISSED / median(secs),
                     f"{median([r['server_util'] for r in rs]):.0%}",
                     f"{median([r['load_util'] for r in rs]):.0%}",
                     max(set(r["saturated"] for r in rs), key=[r["saturated"] for r in rs].count),
                     f"{median([r['others_util'] for r in rs]):.0%}"])
    sizes = prep["sizes"]
    rows.append(["halfpi, live stream (agent-paced)", prep["live_seconds"], "", "",
                 MISSED / prep["live_seconds"], "", "", "", ""])
    print(table(
        ["10,000 missed events", "median s", "min s", "max s", "events/s", "server CPU",
         "client CPU", "saturated", "rest"],
        rows,
        f"Resume of {MISSED:,} events ({rounds} rounds per side and client; "
        f"{sum(sizes):,} bytes, mean frame {sum(sizes) / len(sizes):.0f} B)",
    ))
    summary = []
    notes = {
        "count": "client counts delta frames without decoding",
        "json": "client json.loads every frame",
        "websockets": "websockets.asyncio.client + json.loads per frame (the SDK's transport)",
    }
    for client in CLIENTS:
        judged = client == "json"
        summary.append(figure(
            "resume", f"resume {MISSED:,} missed events, {client} client", "s",
            runs[("halfpi", client)], runs[("raw", client)], "seconds",
            lower_is_better=True,
            target=f"< {TARGET_S} s" if judged else "",
            judge=(lambda m, _r: m < TARGET_S) if judged else None,
            note=notes[client] + "; baseline: pre-encoded frames, one writelines"
            + (f"; live stream {prep['live_seconds']:.2f} s" if client == "count" else ""),
        ))
    for client in ("count",):
        for side in ("halfpi", "raw"):
            for r in runs[(side, client)]:
                r["server_cpu_ms"] = r["server_cpu_s"] * 1000
        summary.append(figure(
            "resume", f"server CPU per resume of {MISSED:,} events", "ms",
            runs[("halfpi", client)], runs[("raw", client)], "server_cpu_ms",
            lower_is_better=True, refuse_when_load_bound=False,
            note="the server's CPU time in the window of the count client's resume; "
            "not bent by the client saturating",
        ))
    print()
    print(summary_table(summary, "Resume summary (time: lower is better; ratio < 1: halfpi "
                                 "faster)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds; each resume (10,000 events) as in the full run")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 3)
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "resume"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
