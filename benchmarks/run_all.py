"""Run every benchmark, one after the other, and print one combined table
per adapter.

Each script runs in its own process (they start their own servers) and
writes its summary rows to a JSON file; its full output is shown as it runs.
For each figure the tables give halfpi's median, the baseline's, the median
of the per-round ratios with its spread, the number of rounds, both sides'
CPU (server / load processes) and which side saturated: first halfpi's own
server (``--server native``, and the figures no server takes part in), then
the ASGI adapter (``--server asgi`` against a Starlette endpoint under
uvicorn, and against the native server). After each benchmark, and in a
table at the end, the machine's load while it ran: the load average (1 min)
before and after, and **rest**, the CPU the rest of the machine used
(``/proc/stat`` minus the benchmark's own process tree), in cores: a large
value means other work competed and the figures deserve a re-run.

``--quick`` passes ``--quick`` to each script: fewer rounds and sizes, each
round's work as in the full run (so the figures are the full run's, with a
wider spread); a ratio a quick run cannot measure honestly is printed
"not judged (quick)". For ``conversations`` (no ``--quick``) a quick run
does the first step only (its figure is the first step's); for ``idle``,
counts up to 3,000 with the heartbeat phase (at 3,000).

Exit status: 1 when a target is missed by the median (or a targeted ratio
had to be refused because the load generator saturated), 2 when a
benchmark failed to run (exited non-zero without writing its rows, or
could not start). A ratio not judged in a quick run is listed, not failed.

    python benchmarks/run_all.py [--quick] [--only fanout resume ...] [--servers native asgi]
                                 [--cluster] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import (
    PYTHON,
    machine_busy_seconds,
    summary_table,
    table,
)

HERE = Path(__file__).resolve().parent
BENCHES = ("fanout", "resume", "append", "memory", "idle", "model_stream", "sse_fanout",
           "door_cpu", "loops", "startup", "conversations")
# Cluster mode (throw-away PostgreSQL and redis-server needed): run with --cluster.
CLUSTER_BENCHES = ("pg_append", "cluster_fanout")
# the benchmarks that also run the ASGI adapter
WITH_ASGI = ("fanout", "memory", "sse_fanout", "door_cpu")
SERVERS = ("native", "asgi")
# --quick for the scripts that have no --quick of their own, or whose
# --quick leaves out a figure of the table: the arguments instead.
QUICK_ARGS = {
    # the figure is the first step's (10,000 conversations): the same in both
    "conversations": ["--steps", "10000"],
    # idle's own --quick skips the heartbeat phase: up to 3,000, heartbeats at 3,000
    "idle": ["--counts", "50", "1000", "3000", "--windows", "2"],
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def skipped(name: str, servers: list[str]) -> str:
    """Why ``name`` does not run here ("" when it does)."""
    if name not in WITH_ASGI and "native" not in servers:
        return "native only"
    if name == "loops" and importlib.util.find_spec("uvloop") is None:
        return "uvloop is not installed"
    return ""


class Machine:
    """The machine's load over one benchmark: the load average before and
    after, and the CPU the rest of the machine used (every core's busy time
    from /proc/stat minus the CPU of the benchmark's process tree, which
    ``RUSAGE_CHILDREN`` gives once it was waited for), in cores."""

    def __enter__(self) -> Machine:
        self.load_before = os.getloadavg()[0]
        self._busy = machine_busy_seconds()
        self._children = self._children_cpu()
        self._wall = time.perf_counter()
        return self

    @staticmethod
    def _children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.load_after = os.getloadavg()[0]
        self.bench_cpu = self._children_cpu() - self._children
        busy = machine_busy_seconds() - self._busy
        self.rest = max(0.0, busy - self.bench_cpu) / self.wall if self.wall else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": self.wall, "loadavg_before": self.load_before,
                "loadavg_after": self.load_after, "bench_cores": self.bench_cpu / self.wall,
                "rest_cores": self.rest, "cores": os.cpu_count() or 0}

    def text(self) -> str:
        return (f"load average {self.load_before:.2f} -> {self.load_after:.2f} (1 min, "
                f"{os.cpu_count()} cores); this benchmark {self.bench_cpu / self.wall:.2f} "
                f"cores, rest of the machine {self.rest:.2f} cores over {self.wall:.0f} s")


def run(name: str, quick: bool, out: Path,
        servers: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """Run one benchmark: its summary rows (each carrying the machine's load
    while it ran), the machine's load, its exit status."""
    argv = [PYTHON, str(HERE / f"{name}.py"), "--json", str(out)]
    if quick:
        argv += QUICK_ARGS.get(name, ["--quick"])
    if name in WITH_ASGI:
        argv += ["--servers", *servers]
    print(f"\n=== {name} ===", flush=True)
    with Machine() as machine:
        code = subprocess.call(argv)
    print(f"--- {name}: exit {code}; {machine.text()}", flush=True)
    rows: list[dict[str, Any]] = []
    if out.exists():  # written at the end: a script that exits 1 on a missed target keeps them
        got = json.loads(out.read_text())
        rows = got.get("rows") or got.get("summary") or []  # conversations: "summary"
    load = {"bench": name, **machine.as_dict()}
    for row in rows:
        row["machine"] = load
    return rows, load, code


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
    loads: list[dict[str, Any]] = []
    failed = []
    with tempfile.TemporaryDirectory(prefix="halfpi-bench-") as tmp:
        for name in args.only:
            why = skipped(name, args.servers)
            if why:
                print(f"\n=== {name}: skipped ({why}) ===", flush=True)
                continue
            got, load, code = run(name, args.quick, Path(tmp) / f"{name}.json", args.servers)
            rows.extend(got)
            loads.append(load)
            # Failed: no rows written (crashed, or could not start), or an
            # exit status other than 0 and 1 (1: a script's own missed target).
            if (code != 0 and not got) or code not in (0, 1):
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
            "ASGI adapter (--server asgi, uvicorn): against Starlette endpoints under "
            "uvicorn doing the raw servers' work (_raw_asgi.py, _raw_asgi_sse.py), and "
            "against halfpi's own server, same run",
        ))
    print()
    print(table(
        ["benchmark", "wall s", "load avg before", "after", "benchmark cores", "rest cores"],
        [[x["bench"], x["wall_s"], x["loadavg_before"], x["loadavg_after"], x["bench_cores"],
          x["rest_cores"]] for x in loads],
        f"Machine load per benchmark ({os.cpu_count()} cores; rest = the CPU the rest of the "
        "machine used meanwhile, in cores: large means other work competed, re-run)",
    ))
    targets = [r for r in rows if r["target"]]
    met = [r for r in targets if r["met"] is True]
    missed = [r for r in targets if r["met"] is False]
    quick = [r for r in targets if r["met"] is None and r.get("not_judged")]
    unjudged = [r for r in targets if r["met"] is None and not r.get("not_judged")]
    print(f"\ntargets met: {len(met)}/{len(targets)}; took "
          f"{time.perf_counter() - began:.0f} s")
    for r in missed:
        print(f"MISSED: {r['metric']}: {r['halfpi']:.4g} {r['unit']} (target {r['target']}"
              + (f", ratio {r['ratio']:.2f}" if r["ratio"] is not None else "") + ")")
    for r in unjudged:
        print(f"NOT JUDGED: {r['metric']}: {r.get('refused') or 'no verdict'}")
    for r in quick:  # listed, not failed: the run chose not to measure it
        print(f"not judged ({r['not_judged']}): {r['metric']}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    sys.exit(2 if failed else 1 if missed or unjudged else 0)


if __name__ == "__main__":
    main()
