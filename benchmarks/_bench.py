"""Shared pieces of the benchmark scripts (the client side is ``_client.py``).

- child processes that print one JSON ready line (a Mind, or the raw
  ``websockets`` baseline server in ``_raw_server.py``);
- CPU and memory probes read from ``/proc``;
- table printing and the JSON summary rows that ``run_all.py`` combines.

Every figure is printed next to a baseline measured in the same run: the
absolute numbers drift with the machine, the ratios are what we report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import selectors
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
PYTHON = sys.executable
HOST = "127.0.0.1"


# -- child processes ----------------------------------------------------------


class Server:
    """A child process serving WebSockets on 127.0.0.1; it prints a JSON line
    with its ``url`` once it listens."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}

    def start(self, timeout: float = 30.0) -> Server:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=subprocess.PIPE, stderr=log, cwd=ROOT
            )
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while True:  # a profiler wrapping the server may print lines of its own first
            if not sel.select(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise RuntimeError(f"server did not start: {self.argv}\n{self.log_tail()}")
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"server exited: {self.argv}\n{self.log_tail()}")
            if line.startswith(b"{"):
                break
        sel.close()
        self.ready = json.loads(line)
        return self

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return str(self.ready["url"])

    def stop(self, timeout: float = 15.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MindServer(Server):
    """``halfpi mind --port 0`` with its own data directory. With ``overrides``
    (Config fields the command line does not expose, e.g. ``heartbeat_s``)
    the same ``serve()`` runs through ``_mind.py``. ``server="asgi"``: the
    ASGI adapter under uvicorn (``halfpi mind --server asgi``)."""

    def __init__(
        self,
        home: Path,
        *,
        delta_ms: float,
        python: Sequence[str] = (PYTHON,),
        overrides: dict[str, Any] | None = None,
        server: str = "native",
    ) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            HALFPI_HOME=str(home),
            HALFPI_SCRIPTED_DELTA_MS=str(delta_ms),
            PYTHONUNBUFFERED="1",
        )
        if overrides:
            argv = [*python, str(BENCH_DIR / "_mind.py"),
                    json.dumps({**overrides, "server": server})]
        else:
            argv = [*python, "-m", "halfpi.cli", "mind", "--port", "0", "--log-level", "warning",
                    "--server", server,
                    "--max-connections-per-principal", "0"]  # benchmarks open 1,000 with one token
        super().__init__(argv, env, home / "mind.log")
        self.home = home
        self.server = server

    @property
    def token(self) -> str:
        return (self.home / "face.token").read_text().strip()


def python_of(src: str) -> tuple[str, ...]:
    """A Python that imports halfpi from ``src`` (another tree's src folder,
    first on PYTHONPATH): ``MindServer(python=…)`` for a baseline Mind."""
    if not Path(src, "halfpi").is_dir():
        raise SystemExit(f"{src} holds no halfpi package")
    return ("env", f"PYTHONPATH={src}", PYTHON)


class RawServer(Server):
    """The baseline: the leanest server we can write in the same process model
    (``_raw_server.py``)."""

    def __init__(self, workdir: Path, *, ping_interval: float = 0.0, durable: bool = False) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [PYTHON, str(BENCH_DIR / "_raw_server.py")]
        if ping_interval:
            argv += ["--ping-interval", str(ping_interval)]
        if durable:
            argv += ["--db", str(workdir / "raw.db")]
        super().__init__(argv, dict(os.environ, PYTHONUNBUFFERED="1"), workdir / "raw.log")


class RawAsgiServer(Server):
    """The ASGI baseline: a Starlette WebSocket endpoint under uvicorn doing
    the raw server's work (``_raw_asgi.py``)."""

    def __init__(self, workdir: Path, *, durable: bool = False) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [PYTHON, str(BENCH_DIR / "_raw_asgi.py")]
        if durable:
            argv += ["--db", str(workdir / "raw.db")]
        super().__init__(argv, dict(os.environ, PYTHONUNBUFFERED="1"), workdir / "raw-asgi.log")


class WsServer(Server):
    """A default ``websockets.asyncio.server`` (``_ws_server.py``)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [PYTHON, str(BENCH_DIR / "_ws_server.py")]
        super().__init__(argv, dict(os.environ, PYTHONUNBUFFERED="1"), workdir / "ws.log")


async def stop_all(*servers: Server) -> None:
    """Stop servers without blocking the loop (clients may still be closing)."""
    await asyncio.gather(*(asyncio.to_thread(s.stop) for s in servers))


def raise_nofile(want: int = 8192) -> int:
    """Raise RLIMIT_NOFILE (inherited by children started afterwards)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- /proc probes -------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (ns precision from schedstat)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def machine_busy_seconds() -> float:
    """CPU time all cores spent busy since boot (/proc/stat, every process)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


SATURATED = 0.85  # of one core: the server's loop and every load process are one thread


class CpuWindow:
    """Wall time and CPU over one measured window: the server process (every
    thread, from /proc), each load process (/proc) and this process (the
    driver, ``time.process_time()``), and what the rest of the machine used
    meanwhile (``/proc/stat`` minus all of those): the noise indicator."""

    def __init__(self, server_pid: int, load_pids: Sequence[int] = ()) -> None:
        self.pid = server_pid
        self.load_pids = list(load_pids)
        self.wall = self.server = self.others = 0.0
        self.loads: list[float] = []  # CPU seconds per load process, this one last

    def __enter__(self) -> CpuWindow:
        self._wall = time.perf_counter()
        self._server = cpu_seconds(self.pid)
        self._loads = [cpu_seconds(p) for p in self.load_pids]
        self._self = time.process_time()
        self._machine = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.server = cpu_seconds(self.pid) - self._server
        self.loads = [cpu_seconds(p) - c for p, c in zip(self.load_pids, self._loads, strict=True)]
        self.loads.append(time.process_time() - self._self)
        machine = machine_busy_seconds() - self._machine
        self.others = max(0.0, machine - self.server - sum(self.loads))

    @property
    def load(self) -> float:
        return sum(self.loads)

    @property
    def others_util(self) -> float:
        return self.others / self.wall if self.wall else 0.0

    @property
    def server_util(self) -> float:
        return self.server / self.wall if self.wall else 0.0

    @property
    def load_util(self) -> float:
        """All load processes together, as a share of one core."""
        return self.load / self.wall if self.wall else 0.0

    @property
    def load_max(self) -> float:
        """The busiest load process: the one that would saturate first."""
        return max(self.loads) / self.wall if self.wall and self.loads else 0.0

    def saturated(self) -> str:
        return saturation(self.server_util, self.load_max, self.load_util)

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall,
            "server_cpu_s": self.server,
            "server_util": self.server_util,
            "load_util": self.load_util,
            "load_max": self.load_max,
            "load_procs": len(self.loads),
            "others_util": self.others_util,
            "saturated": self.saturated(),
        }


def saturation(server_util: float, load_max: float, load_util: float = 0.0) -> str:
    """Which side ran out of CPU: one core is 100 % (the Mind's event loop and
    each load process are one thread each); 85 % counts as saturated. The
    load side also counts as saturated when its processes together held
    85 % of a core while the server had less: on two cores the clients then
    took the core the server needed."""
    s, c = server_util, load_max
    load = c >= SATURATED or (load_util >= SATURATED and s < SATURATED)
    if s < SATURATED and not load:
        return "neither"
    if s >= SATURATED and load:
        return "both"
    return "server" if s >= SATURATED else "load"


# -- statistics and output -----------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return float(sorted_values[index])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def best(runs: Sequence[dict[str, Any]], key: str, *, lowest: bool = False) -> dict[str, Any]:
    """The run with the highest (or lowest) ``key``: only a footnote now, the
    headline is the median of paired ratios (see :func:`figure`)."""
    pick = min if lowest else max
    return pick(runs, key=lambda r: r[key])


def spread(values: Sequence[float]) -> str:
    """``min-max`` of repeated measurements, for the noise column."""
    if len(values) < 2:
        return ""
    return f"{fmt(min(values))}..{fmt(max(values))}"


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int):
        return f"{value:,}"
    if value != value:  # NaN
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines)


def _cpu_text(runs: Sequence[dict[str, Any]]) -> str:
    """Median server CPU / median CPU of all load processes (busiest one), % of a core."""
    if not runs or "server_util" not in runs[0]:
        return ""
    srv = median([r["server_util"] for r in runs])
    load = median([r["load_util"] for r in runs])
    top = median([r["load_max"] for r in runs])
    procs = runs[0].get("load_procs", 1)
    return f"{srv:.0%}/{load:.0%}" + (f" ({procs} procs, max {top:.0%})" if procs > 1 else "")


def _saturated_text(runs: Sequence[dict[str, Any]]) -> str:
    labels = [r.get("saturated", "") for r in runs]
    if not labels:
        return ""
    top = max(set(labels), key=labels.count)
    return top if labels.count(top) == len(labels) else f"{top} {labels.count(top)}/{len(labels)}"


def figure(
    bench: str,
    metric: str,
    unit: str,
    ours: Sequence[dict[str, Any]],
    base: Sequence[dict[str, Any]] | None,
    key: str,
    *,
    lower_is_better: bool = False,
    target: str = "",
    judge: Any = None,
    note: str = "",
    refuse_when_load_bound: bool = True,
    not_judged: str = "",
) -> dict[str, Any]:
    """One figure: medians of both sides, the median of the per-round ratios
    (round i of halfpi against round i of the baseline, run next to each
    other) with its spread, the best-of ratio as a footnote, both sides' CPU
    and which side saturated. A ratio is refused when a load process
    saturated in any round of either side: the load generator, not the
    server, would then set the pace. ``judge(halfpi_median, ratio_median)``
    says whether the target is met (None: no target, or not judged). A
    figure of server CPU per unit of work is not bent by a saturated client
    (``refuse_when_load_bound=False``). ``not_judged`` (e.g. ``"quick"``):
    this run cannot measure the ratio honestly (a ``--quick`` run whose
    work differs from the full run's); both medians are kept, the ratio is
    printed as "not judged (…)" instead of a number (kept in the JSON as
    ``ratio_unjudged``) and no target is judged. run_all.py lists such
    rows but does not fail on them."""
    ours_v = [r[key] for r in ours]
    ours_med = median(ours_v)
    row: dict[str, Any] = {
        "bench": bench,
        "metric": metric,
        "unit": unit,
        "halfpi": ours_med,
        "halfpi_spread": spread(ours_v),
        "baseline": None,
        "ratio": None,
        "spread": "",
        "best_ratio": None,
        "rounds": len(ours),
        "cpu_halfpi": _cpu_text(ours),
        "cpu_baseline": "",
        "saturated": _saturated_text(ours),
        "target": target,
        "met": None,
        "refused": "",
        "lower_is_better": lower_is_better,
        "note": note,
    }
    if base:
        base_v = [r[key] for r in base]
        ratios = [a / b for a, b in zip(ours_v, base_v, strict=False) if b]
        row["baseline"] = median(base_v)
        row["cpu_baseline"] = _cpu_text(base)
        if _saturated_text(ours) or _saturated_text(base):
            row["saturated"] = f"{_saturated_text(ours)} | {_saturated_text(base)}"
        pick = min if lower_is_better else max
        if pick(base_v):
            row["best_ratio"] = pick(ours_v) / pick(base_v)
        load_bound = sum(
            1 for r in (*ours, *base) if r.get("saturated") in ("load", "both")
        )
        if load_bound and refuse_when_load_bound:
            row["refused"] = f"load saturated in {load_bound} of {len(ours) + len(base)} rounds"
        elif not_judged:
            row["ratio_unjudged"] = median(ratios)
        else:
            row["ratio"] = median(ratios)
            row["spread"] = spread(ratios)
    if not_judged:
        row["not_judged"] = not_judged
        row["best_ratio"] = None
        return row  # no verdict: the medians are shown, nothing is judged
    if judge is not None:
        verdict = judge(ours_med, row["ratio"])
        row["met"] = verdict
        if verdict is None and row["refused"]:
            row["met"] = None
    return row


SUMMARY_HEADERS = (
    "metric",
    "unit",
    "halfpi",
    "baseline",
    "ratio",
    "ratio spread",
    "n",
    "CPU halfpi srv/load",
    "CPU base srv/load",
    "saturated (h | b)",
    "target",
    "met",
)


def summary_table(rows: Sequence[dict[str, Any]], title: str = "") -> str:
    body = []
    notes = []
    for r in rows:
        ratio: Any = r["ratio"]
        if ratio is None and r.get("refused"):
            ratio = "refused"
        elif ratio is None and r.get("not_judged"):
            ratio = f"not judged ({r['not_judged']})"
        met = "" if r["met"] is None else r["met"]
        if (r.get("refused") or r.get("not_judged")) and r["met"] is None and r["target"]:
            met = "not judged"
        body.append(
            [
                r["metric"],
                r["unit"],
                r["halfpi"],
                r["baseline"],
                ratio,
                r["spread"],
                r["rounds"],
                r["cpu_halfpi"],
                r["cpu_baseline"],
                r["saturated"],
                r["target"],
                met,
            ]
        )
        extra = []
        if r.get("refused"):
            extra.append(f"ratio refused: {r['refused']}")
        if r.get("best_ratio") is not None:
            extra.append(f"best-of ratio {fmt(r['best_ratio'])}")
        if r.get("halfpi_spread"):
            extra.append(f"halfpi {r['halfpi_spread']}")
        if r.get("note"):
            extra.append(r["note"])
        if extra:
            notes.append(f"  {r['metric']}: " + "; ".join(extra))
    out = table(SUMMARY_HEADERS, body, title)
    if notes:
        out += "\n" + "\n".join(notes)
    return out


def write_json(path: str | None, rows: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps({"rows": rows, **extra}, indent=2))


@contextlib.contextmanager
def workdir(prefix: str) -> Any:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if not os.environ.get("HALFPI_BENCH_KEEP"):
            shutil.rmtree(path, ignore_errors=True)
