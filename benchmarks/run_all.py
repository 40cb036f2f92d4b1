"""Run every benchmark, one after the other, and print one combined table
per adapter.

Each script runs in its own process (they start their own servers) and
writes its summary rows to a JSON file; its full output is shown as it runs.
For each figure the tables give halfpi's median, the baseline's, the median
of the per-round ratios with its spread, the number of rounds, both sides'
CPU (server / load processes) and which side saturated: first halfpi's own
server (``--server native``, and the figures no server takes part in), then
the ASGI adapter (``--server asgi`` against a Starlette endpoint under
uvicorn, and against the native server). Exit status: 1 when a target is
missed by the median (or a targeted ratio had to be refused because the
load generator saturated), 2 when a benchmark failed to run.

    python benchmarks/run_all.py [--quick] [--only fanout resume ...] [--servers native asgi]
                                 [--cluster] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import (
    PYTHON,
    summary_table,
)

HERE = Path(__file__).resolve().parent
BENCHES = ("fanout", "resume", "append", "memory", "idle", "model_stream", "sse_fanout",
           "door_cpu")
# Cluster mode (throw-away PostgreSQL and redis-server needed): run with --cluster.
CLUSTER_BENCHES = ("pg_append", "cluster_fanout")
# the benchmarks that also run the ASGI adapter
WITH_ASGI = ("fanout", "memory", "sse_fanout", "door_cpu")
SERVERS = ("native", "asgi")


def run(name: str, quick: bool, out: Path,
        servers: list[str]) -> tuple[list[dict[str, Any]], float, int]:
    argv = [PYTHON, str(HERE / f"{name}.py"), "--json", str(out)]
    if quick:
        argv.append("--quick")
    if name in WITH_ASGI:
        argv += ["--servers", *servers]
    elif "native" not in servers:
        return [], 0.0, 0  # a native-only benchmark: skipped
    print(f"\n=== {name} ===", flush=True)
    start = time.perf_counter()
    code = subprocess.call(argv)
    seconds = time.perf_counter() - start
    rows = json.loads(out.read_text())["rows"] if code == 0 and out.exists() else []
    return rows, seconds, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="less work per benchmark")
    parser.add_argument("--only", nargs="+", choices=BENCHES + CLUSTER_BENCHES,
                        default=list(BENCHES))
    parser.add_argument("--cluster", action="store_true",
                        help="also the cluster-mode benchmarks (pg_append, cluster_fanout: "
                        "they start PostgreSQL and redis-server)")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS),
                        help="the adapters to measure (fanout and memory run both)")
    parser.add_argument("--json", help="write all summary rows to this file")
    args = parser.parse_args()
    if args.cluster:
        args.only += [name for name in CLUSTER_BENCHES if name not in args.only]
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    timings = []
    failed = []
    with tempfile.TemporaryDirectory(prefix="halfpi-bench-") as tmp:
        for name in args.only:
            got, seconds, code = run(name, args.quick, Path(tmp) / f"{name}.json", args.servers)
            rows.extend(got)
            timings.append(f"{name} {seconds:.0f} s")
            if code != 0:
                failed.append(f"{name} (exit {code})")
    native = [r for r in rows if r.get("adapter", "native") == "native"]
    asgi = [r for r in rows if r.get("adapter") == "asgi"]
    if native:
        print()
        print(summary_table(
            native,
            "halfpi's own server (--server native): medians, and the median of per-round "
            "ratios against baselines measured in the same run (halfpi / baseline)",
        ))
    if asgi:
        print()
        print(summary_table(
            asgi,
            "ASGI adapter (--server asgi, uvicorn): against a Starlette WebSocket endpoint "
            "under uvicorn (_raw_asgi.py), and against halfpi's own server, same run",
        ))
    targets = [r for r in rows if r["target"]]
    met = [r for r in targets if r["met"] is True]
    missed = [r for r in targets if r["met"] is False]
    unjudged = [r for r in targets if r["met"] is None]
    print(f"\ntargets met: {len(met)}/{len(targets)}; took "
          f"{time.perf_counter() - began:.0f} s ({', '.join(timings)})")
    for r in missed:
        print(f"MISSED: {r['metric']}: {r['halfpi']:.4g} {r['unit']} (target {r['target']}"
              + (f", ratio {r['ratio']:.2f}" if r["ratio"] is not None else "") + ")")
    for r in unjudged:
        print(f"NOT JUDGED: {r['metric']}: {r.get('refused') or 'no verdict'}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    sys.exit(2 if failed else 1 if missed or unjudged else 0)


if __name__ == "__main__":
    main()
