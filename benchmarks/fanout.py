"""Fan-out: one conversation streaming deltas to 1, 10 and 100 subscribed Faces.

Throughput: a driver Face sends ``/repeat N x`` to a Mind whose scripted agent
runs at full speed (``HALFPI_SCRIPTED_DELTA_MS=0``); every subscriber counts
the deltas it receives (a coalesced delta counts ``seq - first_seq + 1``
events) from the first delta's arrival to the last one's. The baseline, in
the same run: a plain ``websockets`` server ``broadcast()``-ing frames of the
same size to the same number of clients, yielding to its loop between frames
as the scripted agent does.

Latency: 100 subscribers, a Mind streaming 200 deltas/s (20,000 deliveries/s)
answering ``/stamp N``; each delta's text is the Mind's ``time.time_ns()`` at
emission, compared with the arrival time at the client (same machine clock).
The scripted agent sleeps ``HALFPI_SCRIPTED_DELTA_MS`` *between* deltas, so
the period is that sleep (rounded up to the loop's millisecond timer) plus
the work of one fan-out: the script starts at 5 ms, measures the rate it
gets and restarts the Mind with a corrected sleep until the rate is close to
200 deltas/s (see paced_mind). The baseline broadcasts stamped frames of the
same size on a fixed schedule at the rate the Mind actually achieved.

The clients run in this process, the servers in their own; the two share the
machine's cores, so the CPU time of both sides is reported with the side
that saturated. For throughput the clients read each socket at most every
few milliseconds (see READ_PAUSE_S) so that the load generator stays well
under a core.

    python benchmarks/fanout.py [--quick] [--rounds N] [--json PATH]
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
    best,
    median,
    percentile,
    raise_nofile,
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
    chat,
    close_all,
    create_conversation,
    face,
    is_chat_end,
    is_reply,
    many,
    rid,
    subscribe,
)

# Deltas per round, per subscriber count: about 0.5-1.5 s of streaming each.
DELTAS = {1: 40_000, 10: 10_000, 100: 1_500}
# The load generator stops reading each socket for this long after every
# read, so one recv() carries several frames: it then needs well under a
# core, and the server is what saturates (reading every frame as it comes
# costs the client about as much CPU as the server spends sending it). Short
# enough that no socket buffer fills up. Not used for latency.
READ_PAUSE_S = {1: 0.002, 10: 0.005, 100: 0.005}
LATENCY_SUBSCRIBERS = 100
LATENCY_PACE_MS = 5.0
LATENCY_RATE = 200.0  # deltas/s
LATENCY_DELTAS = 600  # per round: 3 s at 200 deltas/s
LATENCY_ROUNDS = 2


class Side:
    """The subscribers and the driver connected to one server."""

    def __init__(
        self,
        name: str,
        server: Any,
        subs: list[WsClient],
        driver: WsClient,
        conversation_id: str | None,
    ) -> None:
        self.name = name
        self.server = server
        self.subs = subs
        self.driver = driver
        self.conversation_id = conversation_id

    def start(
        self, count: int, *, size: int = 0, stamp: bool = False, period_ms: float = 0.0
    ) -> str:
        if self.conversation_id is not None:  # a Mind
            command = f"/stamp {count}" if stamp else f"/repeat {count} x"
            return chat(self.driver, self.conversation_id, command)
        request_id = rid("bcast")
        self.driver.send_json(
            {
                "cmd": "broadcast",
                "request_id": request_id,
                "count": count,
                "size": size,
                "period_ms": period_ms,
                "stamp": stamp,
            }
        )
        return request_id

    async def close(self) -> None:
        await close_all([*self.subs, self.driver])


async def connect_mind(mind: MindServer, n: int) -> Side:
    token = mind.token
    driver = await face(mind.url, token)
    conversation_id = await create_conversation(driver, f"fanout-{n}")
    subs = await many(lambda: face(mind.url, token), n)
    await asyncio.gather(*(subscribe(s, conversation_id) for s in subs))
    return Side("halfpi", mind, subs, driver, conversation_id)


async def connect_raw(raw: RawServer, n: int) -> Side:
    async def sub() -> WsClient:
        client = await WsClient.connect(raw.url)
        request_id = rid("sub")
        client.send_json({"cmd": "subscribe", "request_id": request_id})
        await client.expect(is_reply(request_id, "face.accepted"))
        return client

    driver = await WsClient.connect(raw.url)
    subs = await many(sub, n)
    return Side("raw", raw, subs, driver, None)


async def stream(
    side: Side, count: int, *, size: int = 0, stamp: bool = False, period_ms: float = 0.0
) -> dict[str, Any]:
    """One measured round: start the stream, wait until every subscriber saw it end."""
    latencies: list[int] = []
    for s in side.subs:
        s.reset_counters()
        s.latencies = latencies if stamp else None
    with CpuWindow(side.server.pid) as window:
        request_id = side.start(count, size=size, stamp=stamp, period_ms=period_ms)
        await asyncio.gather(*(s.expect(is_chat_end(request_id), 300) for s in side.subs))
    await side.driver.expect(is_reply(request_id, "face.result"), 60)
    events = sum(s.events for s in side.subs)
    frames = sum(s.frames for s in side.subs)
    first = min(s.first_ns for s in side.subs)
    last = max(s.last_ns for s in side.subs)
    seconds = max(1e-9, (last - first) / 1e9)
    latencies.sort()
    return {
        "events": events,
        "expected": count * len(side.subs),
        "frames": frames,
        "coalesced": sum(s.coalesced for s in side.subs),
        "frame_bytes": sum(s.delta_bytes for s in side.subs) / max(1, frames),
        "seconds": seconds,
        "events_per_s": events / seconds,
        "frames_per_s": frames / seconds,
        "server_util": window.server_util,
        "load_util": window.load_util,
        "others_util": window.others_util,
        "saturated": window.saturated(),
        "p50_ms": percentile(latencies, 50) / 1e6 if latencies else None,
        "p99_ms": percentile(latencies, 99) / 1e6 if latencies else None,
        "max_ms": latencies[-1] / 1e6 if latencies else None,
        "samples": len(latencies),
    }


def _check(result: dict[str, Any], label: str) -> None:
    if result["events"] != result["expected"]:
        print(
            f"warning: {label}: {result['events']:,} events delivered, "
            f"{result['expected']:,} expected",
            file=sys.stderr,
        )


async def throughput(
    mind: MindServer, raw: RawServer, n: int, count: int, rounds: int
) -> dict[str, Any]:
    ours = await connect_mind(mind, n)
    base = await connect_raw(raw, n)
    for s in (*ours.subs, *base.subs):
        s.read_pause = READ_PAUSE_S[n]
    try:
        warm = await stream(ours, min(count, 500))  # loads the actor, sizes the frames
        size = round(warm["frame_bytes"])
        await stream(base, min(count, 500), size=size)
        runs: dict[str, list[dict[str, Any]]] = {"halfpi": [], "raw": []}
        for index in range(rounds):  # alternate the order so drift hits both sides
            order = (ours, base) if index % 2 == 0 else (base, ours)
            for side in order:
                result = await stream(side, count, size=size)
                _check(result, f"{side.name} n={n}")
                runs[side.name].append(result)
    finally:
        await ours.close()
        await base.close()
    return {"n": n, "count": count, "size": size, **runs}


async def paced_mind(tmp: Path, n: int) -> tuple[MindServer, float]:
    """A Mind whose scripted agent streams about LATENCY_RATE deltas/s to
    ``n`` subscribers. The agent sleeps *between* deltas and the event loop's
    timers wake at whole milliseconds, so the period is the sleep rounded up
    plus the fan-out work: start at 5 ms and correct the sleep by the measured
    error until the rate is within -3 %..+10 % of the target (at most four
    Mind starts; else the closest one)."""
    pace = LATENCY_PACE_MS
    target_ms = 1000 / LATENCY_RATE
    tried: list[tuple[float, float]] = []  # (|error|, pace)
    for attempt in range(4):
        mind = MindServer(tmp / f"mind-paced-{attempt}", delta_ms=pace).start()
        side = await connect_mind(mind, n)
        try:
            await stream(side, 20, stamp=True)
            probe = await stream(side, 200, stamp=True)
        finally:
            await side.close()
        period_ms = probe["seconds"] * 1000 / 199
        if target_ms / 1.10 <= period_ms <= target_ms * 1.03:
            return mind, pace
        await stop_all(mind)
        tried.append((abs(period_ms - target_ms), pace))
        pace = max(0.5, pace + (target_ms - period_ms))
    pace = min(tried)[1]
    return MindServer(tmp / "mind-paced", delta_ms=pace).start(), pace


async def latency(
    mind: MindServer, pace_ms: float, raw: RawServer, n: int, count: int, rounds: int
) -> dict[str, Any]:
    ours = await connect_mind(mind, n)
    base = await connect_raw(raw, n)
    runs: dict[str, list[dict[str, Any]]] = {"halfpi": [], "raw": []}
    try:
        warm = await stream(ours, 20, stamp=True)
        size = round(warm["frame_bytes"])
        for _ in range(rounds):
            result = await stream(ours, count, stamp=True)
            _check(result, "halfpi latency")
            runs["halfpi"].append(result)
            # The baseline runs at the rate the Mind achieved, on a fixed schedule.
            period_ms = result["seconds"] * 1000 / max(1, count - 1)
            runs["raw"].append(
                await stream(base, count, size=size, stamp=True, period_ms=period_ms)
            )
    finally:
        await ours.close()
        await base.close()
    return {"n": n, "count": count, "size": size, "pace_ms": pace_ms, **runs}


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return median([r[key] for r in runs])


def _cpu(run: dict[str, Any]) -> str:
    return f"{run['server_util']:.0%}/{run['load_util']:.0%}"


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    raise_nofile(4096)
    deltas = {n: max(200, int(c * args.scale)) for n, c in DELTAS.items()}
    with workdir("halfpi-fanout-") as tmp:
        mind = MindServer(tmp / "mind-fast", delta_ms=0).start()
        raw = RawServer(tmp / "raw").start()
        try:
            results = [await throughput(mind, raw, n, deltas[n], args.rounds) for n in (1, 10, 100)]
            await stop_all(mind)
            paced, pace_ms = await paced_mind(tmp, LATENCY_SUBSCRIBERS)
            try:
                lat = await latency(
                    paced,
                    pace_ms,
                    raw,
                    LATENCY_SUBSCRIBERS,
                    max(200, int(LATENCY_DELTAS * args.scale)),
                    LATENCY_ROUNDS,
                )
            finally:
                await stop_all(paced)
        finally:
            await stop_all(mind, raw)
    return report(results, lat, args.rounds)


def report(results: list[dict[str, Any]], lat: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
    rows = []
    summary = []
    for r in results:
        ours, base = r["halfpi"], r["raw"]
        top, btop = best(ours, "events_per_s"), best(base, "events_per_s")
        ratio = top["events_per_s"] / btop["events_per_s"]
        median_ratio = _med(ours, "events_per_s") / _med(base, "events_per_s")
        rows.append(
            [
                r["n"],
                f"{r['count']:,}x{r['size']}B",
                top["events_per_s"],
                top["frames_per_s"],
                spread([x["events_per_s"] for x in ours]),
                btop["events_per_s"],
                spread([x["events_per_s"] for x in base]),
                ratio,
                median_ratio,
                _cpu(top),
                top["saturated"],
                _cpu(btop),
                btop["saturated"],
                f"{top['others_util']:.0%}/{btop['others_util']:.0%}",
            ]
        )
        summary.append(
            summary_row(
                "fanout",
                f"fan-out to {r['n']} Faces",
                "events/s",
                top["events_per_s"],
                btop["events_per_s"],
                target="≥ 0.5x raw",
                met=ratio >= 0.5,
                note=f"median ratio {median_ratio:.2f}; saturated: {top['saturated']} "
                f"(raw: {btop['saturated']})",
            )
        )
    print(
        table(
            [
                "Faces",
                "deltas x frame",
                "halfpi ev/s",
                "fr/s",
                "spread",
                "raw ev/s",
                "spread",
                "ratio",
                "med. ratio",
                "halfpi srv/load",
                "sat.",
                "raw srv/load",
                "sat.",
                "rest",
            ],
            rows,
            f"Fan-out throughput (best of {rounds} rounds; srv/load = CPU of the server "
            f"and of the load process as a share of one core; rest = CPU the rest of the "
            f"machine used)",
        )
    )
    ours, base = best(lat["halfpi"], "p99_ms", lowest=True), best(lat["raw"], "p99_ms", lowest=True)
    print()
    print(
        table(
            [
                "",
                "deliveries/s",
                "p50 ms",
                "p99 ms",
                "p99 spread",
                "max ms",
                "samples",
                "srv/load",
                "sat.",
                "rest",
            ],
            [
                [
                    side,
                    x["events_per_s"],
                    x["p50_ms"],
                    x["p99_ms"],
                    spread([y["p99_ms"] for y in lat[key]]),
                    x["max_ms"],
                    x["samples"],
                    _cpu(x),
                    x["saturated"],
                    f"{x['others_util']:.0%}",
                ]
                for side, key, x in (("halfpi", "halfpi", ours), ("raw broadcast", "raw", base))
            ],
            f"Delivery latency: {lat['n']} Faces, {lat['count']:,} stamped deltas per round, "
            f"round with the lowest p99 of {len(lat['halfpi'])}, {lat['size']}-byte frames "
            f"(HALFPI_SCRIPTED_DELTA_MS={lat['pace_ms']:.2f})",
        )
    )
    summary.append(
        summary_row(
            "fanout",
            f"delta latency p50 @ {lat['n']} Faces",
            "ms",
            ours["p50_ms"],
            base["p50_ms"],
            note=f"{ours['events_per_s']:,.0f} deliveries/s",
        )
    )
    summary.append(
        summary_row(
            "fanout",
            f"delta latency p99 @ {lat['n']} Faces",
            "ms",
            ours["p99_ms"],
            base["p99_ms"],
            target="< 5 ms",
            met=ours["p99_ms"] < 5.0,
            note=f"{ours['events_per_s']:,.0f} deliveries/s; p99 of rounds "
            f"{spread([y['p99_ms'] for y in lat['halfpi']])}",
        )
    )
    print()
    print(summary_table(summary, "Fan-out summary"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per size")
    parser.add_argument("--quick", action="store_true", help="a third of the work")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    args.scale = 1 / 3 if args.quick else 1.0
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "fanout"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
