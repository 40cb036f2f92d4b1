"""The event loop: asyncio's own against uvloop, for halfpi and for the raw
baseline, in one run.

Four servers side by side: ``halfpi mind`` with ``HALFPI_LOOP=asyncio`` and
with ``HALFPI_LOOP=uvloop``, and the lean raw server (``_raw_server.py``,
which runs on the same loop choice) both ways. Each round runs the same
fan-out chat on each (``fanout.throughput``: order rotating round by round,
load processes as in ``fanout.py``). Reported per Face count: events/s and
the **server's CPU per delivered event** (from ``/proc``, all threads: what a
busy machine bends least), uvloop against asyncio for each server (median
of per-round ratios, spread), and halfpi against the raw server on each
loop. This is the figure behind the choice of loop (``halfpi.loop``,
docs/performance.md: uvloop is opt-in).

``--quick``: 3 rounds, 1 Face; each chat as long as in the full run.

    python benchmarks/loops.py [--faces 1 10] [--rounds 5] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fanout
from _bench import (
    MindServer,
    RawServer,
    figure,
    stop_all,
    summary_table,
    workdir,
    write_json,
)

LOOPS = ("asyncio", "uvloop")


@contextmanager
def loop_env(name: str) -> Iterator[None]:
    """Servers started inside inherit ``HALFPI_LOOP=name``."""
    before = os.environ.get("HALFPI_LOOP")
    os.environ["HALFPI_LOOP"] = name
    try:
        yield
    finally:
        if before is None:
            del os.environ["HALFPI_LOOP"]
        else:
            os.environ["HALFPI_LOOP"] = before


def per_event(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for r in runs:
        r["cpu_us_per_event"] = r["server_cpu_s"] * 1e6 / max(1, r["events"])
    return runs


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with workdir("halfpi-loops-") as tmp:
        servers: dict[str, Any] = {}
        for name in LOOPS:
            with loop_env(name):
                servers[f"halfpi {name}"] = MindServer(tmp / f"mind-{name}", delta_ms=0).start()
                servers[f"raw {name}"] = RawServer(tmp / f"raw-{name}", durable=True).start()
        try:
            for n in args.faces:
                count = fanout.DELTAS[n]
                result = await fanout.throughput(servers, n, count, args.rounds)
                runs = {key: per_event(result[key]) for key in servers}
                note = f"{n} Face(s), {count:,} deltas per chat"
                for kind in ("halfpi", "raw"):
                    for key, what, unit, lower in (
                            ("chat_eps", "whole chat", "events/s", False),
                            ("cpu_us_per_event", "CPU per event", "µs", True)):
                        rows.append(figure(
                            "loops", f"{kind}: uvloop vs asyncio, {n} Face(s), {what}", unit,
                            runs[f"{kind} uvloop"], runs[f"{kind} asyncio"], key,
                            lower_is_better=lower, note=note,
                            refuse_when_load_bound=key != "chat_eps"))
                for name in LOOPS:
                    rows.append(figure(
                        "loops", f"halfpi vs raw on {name}, {n} Face(s), whole chat", "events/s",
                        runs[f"halfpi {name}"], runs[f"raw {name}"], "chat_eps", note=note))
                    rows.append(figure(
                        "loops", f"halfpi vs raw on {name}, {n} Face(s), CPU per event", "µs",
                        runs[f"halfpi {name}"], runs[f"raw {name}"], "cpu_us_per_event",
                        lower_is_better=True, note=note, refuse_when_load_bound=False))
        finally:
            await stop_all(*servers.values())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faces", type=int, nargs="+", help="default 1 10 (--quick: 1)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, 1 Face; each chat as long as in the full run")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.faces is None:
        args.faces = [1] if args.quick else [1, 10]
    if args.quick:  # fewer rounds and Face counts; each round's chat as in the full run
        args.rounds = min(args.rounds, 3)
    try:
        import uvloop  # noqa: F401
    except ImportError:
        sys.exit("uvloop is not installed: nothing to compare")
    rows = asyncio.run(main_async(args))
    print(summary_table(rows, "Event loops: uvloop against asyncio's own, same run"))
    if args.json:
        write_json(args.json, rows, {})


if __name__ == "__main__":
    main()
