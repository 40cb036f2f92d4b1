"""Start-up: how long `halfpi mind` (the embedded default) takes to listen,
and what it holds in memory then.

Each round, alternating, measures

- **python** — ``python -c pass``: the interpreter's own start;
- **websockets** — ``python -c "import websockets"``: the one library every
  Mind needs, the floor of any server built on it;
- **mind, new home** — ``halfpi mind --home NEW --port 0`` from spawn to its
  ``listening`` line (it creates the home, the database and the operator
  credential first), then its RSS, then SIGTERM;
- **mind, restart** — the same on the home the previous start left.

Reported: the medians, and each Mind figure as a ratio to the python and
websockets baselines of the same round; besides wall time, the CPU time
each child used to get there (``/proc`` for the Mind, ``getrusage`` for
the baselines), which a busy machine bends less.

Every child runs with its bytecode cached, as an installed halfpi does
(pip writes the ``.pyc`` files at install): ``PYTHONDONTWRITEBYTECODE`` is
dropped and the cache goes to the work folder (``PYTHONPYCACHEPREFIX``),
written by a warm-up start. With ``--source`` every start compiles
halfpi's sources again instead, as under ``PYTHONDONTWRITEBYTECODE=1``
with no ``__pycache__`` (an editable checkout on a machine that sets it). The target is < 0.4 s to
``listening`` for a restart (docs/performance.md, "Start-up"). With
``--imports`` it also prints the 15 heaviest imports of ``halfpi.process``
(``python -X importtime``, cumulative). With ``--against SRC`` each round
also restarts a Mind built from another tree's ``src`` (e.g. a checkout of
an earlier commit), and the restart is reported as a ratio to it.

    python benchmarks/startup.py [--rounds 9] [--imports] [--against SRC] [--source]
                                 [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    PYTHON,
    ROOT,
    Server,
    cpu_seconds,
    figure,
    median,
    python_of,
    rss_kib,
    summary_table,
    workdir,
    write_json,
)

TARGET_S = 0.4


def child_env(work: Path, source: bool) -> dict[str, str]:
    """The environment of every child: bytecode cached in ``work`` (as
    installed), or (``source``) compiled from the sources at every start."""
    env = dict(os.environ)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if source:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return env


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_python(code: str, env: dict[str, str]) -> dict[str, float]:
    """Seconds from spawn to exit of ``python -c code``, and its CPU time."""
    cpu = children_cpu()
    start = time.perf_counter()
    subprocess.run([PYTHON, "-c", code], check=True, env=env)
    return {"s": time.perf_counter() - start, "cpu_s": children_cpu() - cpu}


def run_mind(home: Path, log: Path, env: dict[str, str], python: tuple[str, ...] = (PYTHON,),
             strict: bool = True) -> dict[str, Any]:
    """Seconds from spawn to the ``listening`` line, the CPU time and RSS
    then, and the SIGTERM that follows (``strict``: the Mind must stop
    cleanly; a tree from before 9cb6cca could die of a SIGTERM this early)."""
    env = dict(env, HALFPI_HOME=str(home))
    server = Server([*python, "-m", "halfpi.cli", "mind", "--home", str(home), "--port", "0"],
                    env, log)
    start = time.perf_counter()
    server.start()
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(server.pid)
    rss = rss_kib(server.pid) / 1024
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    if server.proc.wait(30) != 0 and strict:
        raise RuntimeError(f"the Mind did not stop cleanly:\n{server.log_tail()}")
    return {"s": seconds, "cpu_s": cpu, "rss_mib": rss}


def heaviest_imports(env: dict[str, str], count: int = 15) -> str:
    """The ``count`` heaviest imports (cumulative µs) of ``halfpi.process``."""
    out = subprocess.run([PYTHON, "-X", "importtime", "-c", "import halfpi.process"],
                         capture_output=True, text=True, check=True, env=env).stderr
    rows = []
    for line in out.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        rows.append((int(cumulative), name.strip()))
    rows.sort(reverse=True)
    return "\n".join(f"{us / 1000:8.1f} ms  {name}" for us, name in rows[:count])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--imports", action="store_true", help="the heaviest imports too")
    parser.add_argument("--against", metavar="SRC",
                        help="also restart a Mind from this src folder, as a baseline")
    parser.add_argument("--source", action="store_true",
                        help="compile the sources at every start (no bytecode cache)")
    parser.add_argument("--json", help="write the summary rows here (run_all.py)")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    sys.path.insert(0, str(ROOT / "src"))

    py, ws, new, again, other = [], [], [], [], []
    other_python = python_of(args.against) if args.against else None
    with workdir("halfpi-startup-") as work:
        env = child_env(work, args.source)
        # Warm the page cache and write the bytecode: a whole start, so that
        # what is imported only on the way to ``listening`` is cached too.
        run_mind(work / "warm", work / "mind.log", env)
        if other_python is not None:
            run_mind(work / "warm-other", work / "other.log", env, other_python, strict=False)
        imports = heaviest_imports(env) if args.imports else ""
        for i in range(rounds):
            home = work / f"home{i}"
            py.append(run_python("pass", env))
            ws.append(run_python("import websockets", env))
            new.append(run_mind(home, work / "mind.log", env))
            again.append(run_mind(home, work / "mind.log", env))
            if other_python is not None:
                other_home = work / f"other{i}"
                run_mind(other_home, work / "other.log", env, other_python, strict=False)
                other.append(run_mind(other_home, work / "other.log", env, other_python,
                                      strict=False))
            print(f"round {i + 1}/{rounds}: python {py[-1]['s']:.3f} s, websockets "
                  f"{ws[-1]['s']:.3f} s, mind new home {new[-1]['s']:.3f} s, "
                  f"restart {again[-1]['s']:.3f} s ({again[-1]['cpu_s']:.3f} s CPU, "
                  f"{again[-1]['rss_mib']:.1f} MiB)", flush=True)

    def under_target(ours: float, _ratio: float | None) -> bool:
        return ours < TARGET_S

    rows = [
        figure("startup", "to listening, restart ÷ python -c pass", "s", again, py, "s",
               lower_is_better=True, target=f"< {TARGET_S} s", judge=under_target),
        figure("startup", "to listening, restart ÷ import websockets", "s", again, ws, "s",
               lower_is_better=True),
        figure("startup", "to listening, new home ÷ import websockets", "s", new, ws, "s",
               lower_is_better=True),
        figure("startup", "CPU to listening, restart ÷ import websockets", "s", again, ws,
               "cpu_s", lower_is_better=True),
        figure("startup", "RSS when listening (restart)", "MiB", again, None, "rss_mib",
               lower_is_better=True),
    ]
    if other:
        rows += [
            figure("startup", f"to listening, restart ÷ {args.against}", "s", again, other, "s",
                   lower_is_better=True),
            figure("startup", f"CPU to listening, restart ÷ {args.against}", "s", again, other,
                   "cpu_s", lower_is_better=True),
            figure("startup", f"RSS when listening ÷ {args.against}", "MiB", again, other,
                   "rss_mib", lower_is_better=True),
        ]
    print(summary_table(rows, "Start-up of `halfpi mind` (embedded default)"))
    print(f"medians: python {median([r['s'] for r in py]):.3f} s, "
          f"import websockets {median([r['s'] for r in ws]):.3f} s; bytecode "
          f"{'compiled at every start (--source)' if args.source else 'cached'}")
    if args.imports:
        print("\nheaviest imports of halfpi.process (cumulative):")
        print(imports)
    write_json(args.json, rows, {})
    return 0 if all(r["met"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
