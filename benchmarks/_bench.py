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
    """``halfpi mind --port 0`` with its own data directory."""

    def __init__(self, home: Path, *, delta_ms: float, python: Sequence[str] = (PYTHON,)) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            HALFPI_HOME=str(home),
            HALFPI_SCRIPTED_DELTA_MS=str(delta_ms),
            PYTHONUNBUFFERED="1",
        )
        argv = [*python, "-m", "halfpi.cli", "mind", "--port", "0", "--log-level", "warning",
                "--max-connections-per-principal", "0"]  # benchmarks open 1,000 with one token
        super().__init__(argv, env, home / "mind.log")
        self.home = home

    @property
    def token(self) -> str:
        return (self.home / "face.token").read_text().strip()


class RawServer(Server):
    """The baseline: a plain ``websockets.asyncio.server`` (``_raw_server.py``)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [PYTHON, str(BENCH_DIR / "_raw_server.py")]
        super().__init__(argv, dict(os.environ, PYTHONUNBUFFERED="1"), workdir / "raw.log")


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


class CpuWindow:
    """Wall time, server CPU and load-process CPU over one measured window,
    and what the rest of the machine used meanwhile (other processes, plus
    kernel work not charged to either side): the noise indicator."""

    def __init__(self, server_pid: int) -> None:
        self.pid = server_pid
        self.wall = self.server = self.load = self.others = 0.0

    def __enter__(self) -> CpuWindow:
        self._wall = time.perf_counter()
        self._server = cpu_seconds(self.pid)
        self._load = time.process_time()
        self._machine = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.server = cpu_seconds(self.pid) - self._server
        self.load = time.process_time() - self._load
        machine = machine_busy_seconds() - self._machine
        self.others = max(0.0, machine - self.server - self.load)

    @property
    def others_util(self) -> float:
        return self.others / self.wall if self.wall else 0.0

    @property
    def server_util(self) -> float:
        return self.server / self.wall if self.wall else 0.0

    @property
    def load_util(self) -> float:
        return self.load / self.wall if self.wall else 0.0

    def saturated(self) -> str:
        return saturation(self.server_util, self.load_util)


def saturation(server_util: float, load_util: float) -> str:
    """Which side ran out of CPU: one core is 100 % (the Mind's event loop and
    the load generator are each one thread), 85 % counts as saturated."""
    s, c = server_util, load_util
    if s < 0.85 and c < 0.85:
        return "neither"
    if s >= 0.85 and c >= 0.85:
        return "both"
    return "server" if s >= c else "load"


# -- statistics and output -----------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return float(sorted_values[index])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def best(runs: Sequence[dict[str, Any]], key: str, *, lowest: bool = False) -> dict[str, Any]:
    """The run with the highest (or lowest) ``key``. Interference from the rest
    of a shared machine only ever slows a run down, so the best of a few
    rounds is the closest estimate of what each side can do; the spread and
    the median ratio are printed beside it."""
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


def summary_row(
    bench: str,
    metric: str,
    unit: str,
    halfpi: float,
    baseline: float | None,
    *,
    ratio: float | None = None,
    target: str = "",
    met: bool | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One line of the combined table (see run_all.py)."""
    if ratio is None and baseline:
        ratio = halfpi / baseline
    return {
        "bench": bench,
        "metric": metric,
        "unit": unit,
        "halfpi": halfpi,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "met": met,
        "note": note,
    }


SUMMARY_HEADERS = ("metric", "unit", "halfpi", "baseline", "ratio", "target", "met", "note")


def summary_table(rows: Sequence[dict[str, Any]], title: str = "") -> str:
    return table(
        SUMMARY_HEADERS,
        [
            [
                r["metric"],
                r["unit"],
                r["halfpi"],
                r["baseline"],
                r["ratio"],
                r["target"],
                "" if r["met"] is None else r["met"],
                r["note"],
            ]
            for r in rows
        ],
        title,
    )


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
