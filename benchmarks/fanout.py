"""Fan-out: one conversation's chat streamed to 1, 10 and 100 subscribed Faces.

Each round is one whole chat. A driver Face (in this process) sends
``face.chat`` with ``/repeat N x`` to a Mind whose scripted agent runs at
full speed (``HALFPI_SCRIPTED_DELTA_MS=0``); the subscribers live in
``--procs`` load processes (``_load.py``) and count the deltas they receive.
Two figures per round:

- **whole chat**: delivered deltas / time from ``face.chat`` sent to
  ``face.result`` received by the driver *and* ``chat.completed`` received by
  every subscriber: admission commit, agent, fan-out, completion commit;
- **delta stream**: delivered deltas / time from the first delta's arrival
  to the last one's (the display channel alone).

Baseline, same run, alternating round by round: ``_raw_server.py`` (the
leanest server we can write in the same process model: pre-framed bytes,
one ``transport.write`` per frame per subscriber) running the same chat: the
rows of the admission committed with plain ``sqlite3`` (same schema and
PRAGMAs, ``synchronous=FULL``), N frames of the same size broadcast yielding
to the loop between frames, the end's rows committed, ``chat.completed`` to
all, ``face.result`` to the caller.

ASGI (``--servers asgi``, on by default): the same rounds against
``halfpi mind --server asgi`` and ``_raw_asgi.py`` (a Starlette WebSocket
endpoint under uvicorn doing the raw server's work: same durable rows, same
pre-built frames, one ``await websocket.send`` per frame per subscriber).
All four servers run side by side, the order rotating round by round, so
the ASGI Mind is paired with its own baseline (target ≥ 0.7x) and with the
native Mind (the adapter's cost) seconds apart.

Latency (native only): 100 subscribers, a Mind streaming 200 deltas/s (20,000
deliveries/s) answering ``/stamp N``; each delta's text is the Mind's
``time.time_ns()`` at emission, compared with the arrival time in the load
process (same machine clock). The agent sleeps ``HALFPI_SCRIPTED_DELTA_MS``
*between* deltas, so the script calibrates the sleep until the rate is
close to 200 deltas/s (see paced_mind). The baseline broadcasts stamped
frames of the same size on a fixed schedule at the rate the Mind achieved.

For throughput the subscribers read each socket at most every few
milliseconds (READ_PAUSE_S) so that one ``recv()`` carries several frames;
no socket buffer fills (frames/s = events/s, nothing coalesced). If a load
process saturates during the warm-up, the load is spread over twice as many
processes (up to MAX_PROCS) for both sides.

Checkpoint cost: the reply's text so far is saved while it streams (DESIGN
§5: every ~1 s or 4 KiB, riding the group commit). One Face, two Minds side
by side, alternating: one saving as it does by default, one with the
checkpoints off (``checkpoint_s: null``, a Config field no command line
exposes); the ratio is what the saving costs (``--no-checkpoint-cost``
skips it).

Metrics cost (``--metrics-cost BASE_SRC``, alone): this Mind, its
``/metrics`` scraped every second, against the same Mind run from the
sources of BASE_SRC (a checkout from before the metrics, or this tree
with its counting lines removed), ``--faces`` each,
alternating; the ratio is what counting and scraping cost.

``--quick``: 3 rounds and 1 and 100 Faces (10 left out), each round the
same chat as in the full run, so that both measure the same thing.

    python benchmarks/fanout.py [--quick] [--rounds N] [--servers native asgi] [--json PATH]
    python benchmarks/fanout.py --metrics-cost /tmp/before/src --faces 1 10 --quick
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    SATURATED,
    CpuWindow,
    MindServer,
    RawAsgiServer,
    RawServer,
    figure,
    median,
    percentile,
    python_of,
    raise_nofile,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import (
    WsClient,
    close_all,
    create_conversation,
    face,
    is_reply,
    rid,
)
from _load import LoadPool

# Deltas per round, per subscriber count: about 0.3-1.5 s of streaming each.
DELTAS = {1: 40_000, 10: 10_000, 100: 3_000}
READ_PAUSE_S = {1: 0.002, 10: 0.01, 100: 0.02}
PROCS = {1: 1, 10: 2, 100: 4}  # load processes to start with
MAX_PROCS = 8
LATENCY_SUBSCRIBERS = 100
LATENCY_PROCS = 4
LATENCY_PACE_MS = 5.0
LATENCY_RATE = 200.0  # deltas/s
LATENCY_DELTAS = 600  # per round: 3 s at 200 deltas/s
P99_TARGET_MS = 5.0


class Side:
    """The driver and the load pool attached to one server."""

    def __init__(self, name: str, server: Any, driver: WsClient, conversation_id: str | None,
                 pool: LoadPool) -> None:
        self.name = name
        self.server = server
        self.driver = driver
        self.conversation_id = conversation_id
        self.pool = pool

    def start(self, request_id: str, count: int, *, size: int, stamp: bool,
              period_ms: float) -> None:
        if self.conversation_id is not None:  # a Mind
            content = f"/stamp {count}" if stamp else f"/repeat {count} x"
            self.driver.send(
                "face.chat",
                {"request_id": request_id, "conversation_id": self.conversation_id,
                 "content": content},
            )
            return
        self.driver.send_json(
            {"cmd": "chat", "request_id": request_id, "count": count, "size": size,
             "period_ms": period_ms, "stamp": stamp, "durable": True,
             "content": "/stamp" if stamp else f"/repeat {count} x"}
        )

    async def close(self) -> None:
        await self.pool.close()
        await close_all([self.driver])


async def connect_mind(mind: MindServer, n: int, procs: int, read_pause: float) -> Side:
    token = mind.token
    driver = await face(mind.url, token)
    conversation_id = await create_conversation(driver, f"fanout-{n}")
    pool = await LoadPool(procs).connect(
        "mind", mind.url, n, token=token, conversation_id=conversation_id, read_pause=read_pause
    )
    return Side("halfpi", mind, driver, conversation_id, pool)


async def connect_raw(raw: RawServer, n: int, procs: int, read_pause: float) -> Side:
    driver = await WsClient.connect(raw.url)
    pool = await LoadPool(procs).connect("raw", raw.url, n, read_pause=read_pause)
    return Side("raw", raw, driver, None, pool)


async def chat_round(side: Side, count: int, *, size: int = 0, stamp: bool = False,
                     period_ms: float = 0.0) -> dict[str, Any]:
    """One measured chat: start it, wait for the result and every subscriber's end."""
    request_id = rid("chat")
    await side.pool.arm(request_id, stamp)
    with CpuWindow(side.server.pid, side.pool.pids) as window:
        sent = time.time_ns()
        side.start(request_id, count, size=size, stamp=stamp, period_ms=period_ms)
        subs = await side.pool.collect()
        result = await side.driver.expect(is_reply(request_id, "face.result", "face.error"), 120)
    if result["type"] != "face.result" or result["payload"]["status"] != "succeeded":
        raise RuntimeError(f"{side.name}: chat failed: {result}")
    n = sum(side.pool.sizes)
    events, frames = subs["events"], subs["frames"]
    stream_s = max(1e-9, (subs["last_ns"] - subs["first_ns"]) / 1e9)
    chat_s = max(1e-9, (max(result["_at"], subs["end_ns"]) - sent) / 1e9)
    latencies = sorted(subs["latencies_us"])
    return {
        "events": events,
        "expected": count * n,
        "frames": frames,
        "coalesced": subs["coalesced"],
        "frame_bytes": subs["delta_bytes"] / max(1, frames),
        "stream_s": stream_s,
        "chat_s": chat_s,
        "stream_eps": events / stream_s,
        "chat_eps": events / chat_s,
        "rate": count / stream_s,
        "p50_ms": percentile(latencies, 50) / 1e3 if latencies else None,
        "p99_ms": percentile(latencies, 99) / 1e3 if latencies else None,
        "max_ms": latencies[-1] / 1e3 if latencies else None,
        "samples": len(latencies),
        **window.as_dict(),
    }


def _check(result: dict[str, Any], label: str) -> None:
    if result["events"] != result["expected"]:
        print(f"warning: {label}: {result['events']:,} events delivered, "
              f"{result['expected']:,} expected", file=sys.stderr)


# The servers a fan-out round can run on: the Mind under each adapter and the
# baseline in the same model (native: the lean raw server; asgi: a Starlette
# endpoint under uvicorn, _raw_asgi.py).
ADAPTERS = {"native": ("halfpi", "raw"), "asgi": ("halfpi-asgi", "raw-asgi")}
ASGI_TARGET = 0.7
NATIVE_TARGET_1 = 0.7
NATIVE_TARGET = 0.5


async def _sides(servers: dict[str, Any], n: int, procs: int) -> list[Side]:
    pause = READ_PAUSE_S[n]
    sides = []
    for name, server in servers.items():
        side = (await connect_mind(server, n, procs, pause) if isinstance(server, MindServer)
                else await connect_raw(server, n, procs, pause))
        side.name = name
        sides.append(side)
    return sides


async def throughput(servers: dict[str, Any], n: int, count: int,
                     rounds: int) -> dict[str, Any]:
    """Warm-up, then ``rounds`` rounds per server, the order rotating round by
    round so that drift hits every side alike."""
    procs = PROCS[n]
    sides = await _sides(servers, n, procs)
    try:
        while True:  # warm-up; spread the load further while a load process saturates
            size = 0
            busiest = 0.0
            for side in sorted(sides, key=lambda s: s.conversation_id is None):  # Minds first
                warm = await chat_round(side, max(200, count // 4), size=size)
                size = size or round(warm["frame_bytes"])  # the Mind's frame size
                busiest = max(busiest, warm["load_max"])
            if busiest < SATURATED or procs >= min(MAX_PROCS, n):
                break
            print(f"fan-out to {n}: a load process at {busiest:.0%} with {procs} processes; "
                  f"spreading over {procs * 2}", file=sys.stderr)
            for side in sides:
                await side.close()
            procs *= 2
            sides = await _sides(servers, n, procs)
        runs: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
        for index in range(rounds):
            shift = index % len(sides)
            for side in sides[shift:] + sides[:shift]:
                result = await chat_round(side, count, size=size)
                _check(result, f"{side.name} n={n}")
                runs[side.name].append(result)
    finally:
        for side in sides:
            await side.close()
    return {"n": n, "count": count, "size": size, "procs": procs, **runs}


async def paced_mind(tmp: Path, n: int) -> tuple[MindServer, float]:
    """A Mind whose scripted agent streams about LATENCY_RATE deltas/s to ``n``
    subscribers: the agent sleeps *between* deltas and the loop's timers wake
    on whole milliseconds, so start at 5 ms and correct the sleep by the
    measured error until the rate is within -3 %..+10 % (at most four Mind
    starts; else the closest)."""
    pace = LATENCY_PACE_MS
    target_ms = 1000 / LATENCY_RATE
    tried: list[tuple[float, float]] = []
    for attempt in range(4):
        mind = MindServer(tmp / f"mind-paced-{attempt}", delta_ms=pace).start()
        side = await connect_mind(mind, n, LATENCY_PROCS, 0.0)
        try:
            await chat_round(side, 20, stamp=True)
            probe = await chat_round(side, 200, stamp=True)
        finally:
            await side.close()
        period_ms = probe["stream_s"] * 1000 / 199
        if target_ms / 1.10 <= period_ms <= target_ms * 1.03:
            return mind, pace
        await stop_all(mind)
        tried.append((abs(period_ms - target_ms), pace))
        pace = max(0.5, pace + (target_ms - period_ms))
    pace = min(tried)[1]
    return MindServer(tmp / "mind-paced", delta_ms=pace).start(), pace


async def latency(mind: MindServer, pace_ms: float, raw: RawServer, n: int, count: int,
                  rounds: int) -> dict[str, Any]:
    ours = await connect_mind(mind, n, LATENCY_PROCS, 0.0)
    base = await connect_raw(raw, n, LATENCY_PROCS, 0.0)
    runs: dict[str, list[dict[str, Any]]] = {"halfpi": [], "raw": []}
    try:
        warm = await chat_round(ours, 20, stamp=True)
        size = round(warm["frame_bytes"])
        period_ms = 1000 / LATENCY_RATE
        for index in range(rounds):
            for side in (ours, base) if index % 2 == 0 else (base, ours):
                result = await chat_round(side, count, size=size, stamp=True,
                                          period_ms=period_ms)
                _check(result, f"{side.name} latency")
                runs[side.name].append(result)
                if side is ours:  # the baseline follows the rate the Mind achieved
                    period_ms = result["stream_s"] * 1000 / max(1, count - 1)
    finally:
        await ours.close()
        await base.close()
    return {"n": n, "count": count, "size": size, "pace_ms": pace_ms, **runs}


async def checkpoint_cost(tmp: Path, count: int, rounds: int) -> list[dict[str, Any]]:
    """One Face: a Mind saving the text so far (the default) against one
    that never does, the same chat, rounds alternating."""
    saving = MindServer(tmp / "mind-checkpoints", delta_ms=0,
                        overrides={"checkpoint_s": 1.0}).start()
    plain = MindServer(tmp / "mind-no-checkpoints", delta_ms=0,
                       overrides={"checkpoint_s": None}).start()
    runs: dict[str, list[dict[str, Any]]] = {"saving": [], "plain": []}
    try:
        on = await connect_mind(saving, 1, PROCS[1], READ_PAUSE_S[1])
        off = await connect_mind(plain, 1, PROCS[1], READ_PAUSE_S[1])
        on.name, off.name = "saving", "plain"
        try:
            for side in (on, off):
                await chat_round(side, max(200, count // 4))
            for index in range(rounds):
                for side in (on, off) if index % 2 == 0 else (off, on):
                    result = await chat_round(side, count)
                    _check(result, f"{side.name} checkpoints")
                    runs[side.name].append(result)
        finally:
            await on.close()
            await off.close()
    finally:
        await stop_all(saving, plain)
    note = f"1 Face, {count:,} deltas per round; baseline: the same Mind saving no checkpoint"
    return [
        figure("fanout", f"text checkpoints on, {what}", "events/s", runs["saving"],
               runs["plain"], key, note=note)
        for key, what in (("chat_eps", "whole chat"), ("stream_eps", "delta stream"))
    ]


async def _scrape_every(port: int, period_s: float, scrapes: list[int]) -> None:
    """GET /metrics every ``period_s`` (a Prometheus scraping 15x as often
    as its default), counting the scrapes that answered 200."""
    while True:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        if answer.startswith(b"HTTP/1.1 200"):
            scrapes[0] += 1
        await asyncio.sleep(period_s)


async def metrics_cost(tmp: Path, n: int, count: int, rounds: int,
                       base_src: str) -> list[dict[str, Any]]:
    """``n`` Faces: this tree's Mind, scraped every second, against the same
    Mind built from ``base_src`` (a checkout from before the metrics, put
    first on PYTHONPATH), the same chat, rounds alternating."""
    counted = MindServer(tmp / f"mind-metrics-{n}", delta_ms=0).start()
    plain = MindServer(tmp / f"mind-before-metrics-{n}", delta_ms=0,
                       python=python_of(base_src)).start()
    runs: dict[str, list[dict[str, Any]]] = {"metrics": [], "before": []}
    scrapes = [0]
    scraper = asyncio.create_task(_scrape_every(int(counted.ready["port"]), 1.0, scrapes))
    try:
        on = await connect_mind(counted, n, PROCS[n], READ_PAUSE_S[n])
        off = await connect_mind(plain, n, PROCS[n], READ_PAUSE_S[n])
        on.name, off.name = "metrics", "before"
        try:
            for side in (on, off):
                await chat_round(side, max(200, count // 4))
            for index in range(rounds):
                for side in (on, off) if index % 2 == 0 else (off, on):
                    result = await chat_round(side, count)
                    _check(result, f"{side.name} metrics")
                    runs[side.name].append(result)
        finally:
            await on.close()
            await off.close()
    finally:
        scraper.cancel()
        await stop_all(counted, plain)
    note = (f"{n} Faces, {count:,} deltas per round, {scrapes[0]} scrapes of /metrics; "
            "baseline: the same Mind before the metrics")
    return [
        figure("fanout", f"metrics on, {n} Faces, {what}", "events/s", runs["metrics"],
               runs["before"], key, note=note)
        for key, what in (("chat_eps", "whole chat"), ("stream_eps", "delta stream"))
    ]


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.metrics_cost:
        with workdir("halfpi-fanout-metrics-") as tmp:
            rows: list[dict[str, Any]] = []
            for n in args.faces:
                rows += await metrics_cost(tmp, n, DELTAS[n],
                                           args.rounds, args.metrics_cost)
        print(summary_table(rows, "Metrics: what counting and scraping cost "
                                  "(ratio = with / before, same run)"))
        return rows
    raise_nofile(8192)
    deltas = DELTAS
    sizes = [n for n in (1, 10, 100) if n in args.faces]
    with workdir("halfpi-fanout-") as tmp:
        servers: dict[str, Any] = {}
        lat = None
        try:
            if "native" in args.servers:
                servers["halfpi"] = MindServer(tmp / "mind-fast", delta_ms=0).start()
                servers["raw"] = RawServer(tmp / "raw", durable=True).start()
            if "asgi" in args.servers:
                servers["halfpi-asgi"] = MindServer(tmp / "mind-asgi", delta_ms=0,
                                                    server="asgi").start()
                servers["raw-asgi"] = RawAsgiServer(tmp / "raw-asgi", durable=True).start()
            results = [await throughput(servers, n, deltas[n], args.rounds) for n in sizes]
            await stop_all(*(s for s in servers.values() if isinstance(s, MindServer)))
            if not args.no_latency and "native" in args.servers:
                paced, pace_ms = await paced_mind(tmp, LATENCY_SUBSCRIBERS)
                try:
                    lat = await latency(paced, pace_ms, servers["raw"], LATENCY_SUBSCRIBERS,
                                        LATENCY_DELTAS, args.rounds)
                finally:
                    await stop_all(paced)
            cost = ([] if args.no_checkpoint_cost else
                    await checkpoint_cost(tmp, deltas[1], args.rounds))
        finally:
            await stop_all(*servers.values())
    return report(results, lat, args.rounds) + _show(cost)


def _show(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if rows:
        print()
        print(summary_table(rows, "Text checkpoints: what saving the reply's text costs "
                                  "(ratio = with / without, same run)"))
    return rows


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _coalesced(runs: list[dict[str, Any]]) -> str:
    frames = sum(x["coalesced"] for x in runs)
    return f"; coalesced frames {frames}" if frames else ""


def _fanout_figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary rows of one subscriber count: each adapter against its own
    baseline, and (both present) the ASGI Mind against the native one."""
    out = []
    label = f"{r['n']} Face{'s' if r['n'] > 1 else ''}"
    note = (f"{r['count']:,} deltas x {r['size']} B per round; "
            f"{r['procs']} load process{'es' if r['procs'] > 1 else ''}")
    if "halfpi" in r:
        # One Face: the whole chat path at 0.7x the raw server (the Mind's own
        # per-delta work shows most there); more Faces: 0.5x.
        bound = NATIVE_TARGET_1 if r["n"] == 1 else NATIVE_TARGET
        for key, what in (("chat_eps", "whole chat"), ("stream_eps", "delta stream")):
            row = figure(
                "fanout", f"fan-out to {label}, {what}", "events/s", r["halfpi"], r["raw"], key,
                target=f"≥ {bound:g}x raw" if key == "chat_eps" else "",
                judge=(lambda _m, ratio, bound=bound: None if ratio is None else ratio >= bound)
                if key == "chat_eps" else None,
                note=note + _coalesced(r["halfpi"]),
            )
            out.append({**row, "adapter": "native"})
    if "halfpi-asgi" in r:
        ours, base = r["halfpi-asgi"], r["raw-asgi"]
        for key, what in (("chat_eps", "whole chat"), ("stream_eps", "delta stream")):
            extra = ""
            if "raw" in r:  # what ASGI costs the baselines themselves
                pairs = [a[key] / b[key] for a, b in zip(base, r["raw"], strict=False)]
                extra = f"; raw ASGI / raw native {median(pairs):.2f}"
            row = figure(
                "fanout", f"ASGI: fan-out to {label}, {what}", "events/s", ours, base, key,
                target=f"≥ {ASGI_TARGET:g}x raw ASGI" if key == "chat_eps" else "",
                judge=(lambda _m, ratio: None if ratio is None else ratio >= ASGI_TARGET)
                if key == "chat_eps" else None,
                note=note + "; baseline: Starlette endpoint under uvicorn (_raw_asgi.py)"
                + extra + _coalesced(ours),
            )
            out.append({**row, "adapter": "asgi"})
        if "halfpi" in r:
            row = figure(
                "fanout", f"ASGI Mind / native Mind: fan-out to {label}, whole chat",
                "events/s", ours, r["halfpi"], "chat_eps",
                note="the adapter's cost: halfpi --server asgi against halfpi's own server",
            )
            out.append({**row, "adapter": "asgi"})
    return out


def report(results: list[dict[str, Any]], lat: dict[str, Any] | None,
           rounds: int) -> list[dict[str, Any]]:
    rows = []
    summary = []
    for r in results:
        for side in (*ADAPTERS["native"], *ADAPTERS["asgi"]):
            for i, x in enumerate(r.get(side, ())):
                rows.append([
                    f"{r['n']} Faces, {side} #{i + 1}", x["chat_eps"], x["stream_eps"],
                    x["chat_s"], x["coalesced"], _pct(x["server_util"]), _pct(x["load_util"]),
                    _pct(x["load_max"]), x["saturated"], _pct(x["others_util"]),
                ])
        summary.extend(_fanout_figures(r))
    print(table(
        ["round", "whole chat ev/s", "stream ev/s", "chat s", "coalesced", "server CPU",
         "load CPU", "busiest load", "saturated", "rest"],
        rows,
        f"Fan-out rounds per side (the order rotated round by round; CPU: share of one core; "
        f"load = all load processes and the driver; rest = the rest of the machine); "
        f"{rounds} rounds per side",
    ))
    if lat is not None:
        lrows = []
        for side in ("halfpi", "raw"):
            for i, x in enumerate(lat[side]):
                lrows.append([f"{side} #{i + 1}", x["rate"] * lat["n"], x["p50_ms"], x["p99_ms"],
                              x["max_ms"], x["samples"], _pct(x["server_util"]),
                              _pct(x["load_util"]), x["saturated"], _pct(x["others_util"])])
        print()
        print(table(
            ["round", "deliveries/s", "p50 ms", "p99 ms", "max ms", "samples", "server CPU",
             "load CPU", "saturated", "rest"],
            lrows,
            f"Delivery latency: {lat['n']} Faces over {LATENCY_PROCS} load processes, "
            f"{lat['count']:,} stamped deltas per round, {lat['size']}-byte frames "
            f"(HALFPI_SCRIPTED_DELTA_MS={lat['pace_ms']:.2f})",
        ))
        rate = sum(x["rate"] for x in lat["halfpi"]) / len(lat["halfpi"]) * lat["n"]
        for key, what in (("p50_ms", "p50"), ("p99_ms", "p99")):
            row = figure(
                "fanout", f"delta latency {what} @ {lat['n']} Faces", "ms",
                lat["halfpi"], lat["raw"], key, lower_is_better=True,
                target=f"< {P99_TARGET_MS:g} ms" if key == "p99_ms" else "",
                judge=(lambda m, _r: m < P99_TARGET_MS) if key == "p99_ms" else None,
                note=f"{rate:,.0f} deliveries/s",
            )
            summary.append({**row, "adapter": "native"})
    print()
    print(summary_table(summary, "Fan-out summary (medians; ratio = median of per-round "
                                 "ratios, halfpi / baseline)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, 1 and 100 Faces; each round's work as in the full run")
    parser.add_argument("--faces", type=int, nargs="+")
    parser.add_argument("--servers", nargs="+", choices=tuple(ADAPTERS),
                        default=list(ADAPTERS),
                        help="native: halfpi against _raw_server.py (and the latency rounds); "
                        "asgi: halfpi --server asgi against _raw_asgi.py")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--no-checkpoint-cost", action="store_true",
                        help="skip the Minds with and without text checkpoints")
    parser.add_argument("--metrics-cost", metavar="BASE_SRC",
                        help="only compare this Mind (scraped every second) with the one whose "
                        "sources are BASE_SRC (a checkout from before the metrics), --faces each")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    # --quick keeps each round's work (the chat's length): a chat a third as
    # long measured the socket buffers more than the servers (0.24x quick
    # against 0.49x full for 1 Face). It cuts rounds and Face counts only.
    if args.faces is None:
        args.faces = [1, 100] if args.quick and not args.metrics_cost else [1, 10, 100]
    if args.quick:
        args.rounds = min(args.rounds, 3)
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "fanout"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
