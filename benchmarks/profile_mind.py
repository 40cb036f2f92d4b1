"""Where a Mind spends its CPU under a benchmark load.

Starts ``halfpi mind`` in its own process under a profiler, drives one of
the benchmark loads at it from this process, stops it gracefully and prints
the hottest functions by own time and by inclusive time.

Profilers: ``cprofile`` (the standard library: deterministic, slows the Mind
down roughly twofold, so read its figures as shares) or ``py-spy`` (sampling,
low overhead; used only if a ``py-spy`` executable is on PATH or beside this
Python).

    python benchmarks/profile_mind.py [--load fanout1|fanout100|resume|latency|sse1|ws1|sse-resume]
                                      [--profiler cprofile|py-spy] [--seconds S] [--top N]
                                      [--server native|asgi]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pstats
import shutil
import signal
import sys
import time
from pathlib import Path

import fanout
import resume
from _bench import (
    PYTHON,
    MindServer,
    workdir,
)


def py_spy() -> str | None:
    beside = Path(PYTHON).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


async def drive(mind: MindServer, load: str, seconds: float) -> str:
    """Run the load repeatedly for about ``seconds``; returns a one-line summary."""
    deadline = time.perf_counter() + seconds
    done = 0
    if load == "resume":
        prep = await resume.prepare(mind)
        while time.perf_counter() < deadline:
            await resume.resume_lean(mind, prep, decode=False)
            done += 1
        return f"{done} resumes of {resume.MISSED:,} events"
    if load == "sse-resume":  # door_cpu.py's SSE resume, over and over
        import door_cpu
        from _client import face

        driver = await face(mind.url, mind.token)
        try:
            while time.perf_counter() < deadline:
                await door_cpu.resume_sse(mind, driver)
                done += 1
        finally:
            driver.close()
        return f"{done} SSE resumes of {door_cpu.MISSED:,} events"
    if load in ("sse1", "ws1"):  # one reader through one door (door_cpu.py's rounds)
        import door_cpu
        from _client import face

        driver = await face(mind.url, mind.token)
        doors = await door_cpu.open_doors(mind, driver, 1, 1)
        door = doors[1] if load == "sse1" else doors[0]
        delivered = 0
        try:
            while time.perf_counter() < deadline:
                delivered += (await door.round(20_000))["delivered"]
                done += 1
        finally:
            for each in doors:
                await each.close()
            driver.close()
        return f"{done} chats, {delivered:,} deliveries to 1 {load[:-1]} reader"
    n = {"fanout1": 1, "fanout100": 100, "latency": 100}[load]
    pause = 0.0 if load == "latency" else fanout.READ_PAUSE_S[n]
    side = await fanout.connect_mind(mind, n, fanout.PROCS[n], pause)
    count = {"fanout1": 20_000, "fanout100": 1_000, "latency": 400}[load]
    events = 0
    try:
        while time.perf_counter() < deadline:
            result = await fanout.chat_round(side, count, stamp=load == "latency")
            events += result["events"]
            done += 1
    finally:
        await side.close()
    return f"{done} chats, {events:,} deliveries to {n} Faces"


def print_cprofile(path: Path, top: int) -> None:
    stats = pstats.Stats(str(path))
    stats.strip_dirs()
    print("\n-- by own time --")
    stats.sort_stats("tottime").print_stats(top)
    print("-- by inclusive time --")
    stats.sort_stats("cumulative").print_stats(top)


def print_collapsed(path: Path, top: int) -> None:
    """Summarise py-spy's raw (collapsed-stack) output."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    for title, counter in (("own", own), ("inclusive", inclusive)):
        print(f"\n-- by {title} samples ({total:,} samples in all) --")
        for frame, count in counter.most_common(top):
            print(f"{count / total:6.1%}  {frame}")


async def main_async(args: argparse.Namespace) -> None:
    with workdir("halfpi-profile-") as tmp:
        out = tmp / "profile.out"
        if args.profiler == "py-spy":
            spy = py_spy()
            if spy is None:
                raise SystemExit("py-spy is not installed; use --profiler cprofile")
            python = [
                spy,
                "record",
                "--rate",
                "250",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(out),
                "--",
                PYTHON,
            ]
        else:
            python = [PYTHON, "-m", "cProfile", "-o", str(out)]
        delta_ms = fanout.LATENCY_PACE_MS if args.load == "latency" else 0.0
        mind = MindServer(tmp / "mind", delta_ms=delta_ms, python=python,
                          server=args.server).start()
        try:
            summary = await drive(mind, args.load, args.seconds)
        finally:
            # Stop the Mind itself (not the profiler) so that it drains and
            # the profiler writes its report as the process exits.
            target = children(mind.pid)[0] if args.profiler == "py-spy" else mind.pid
            os.kill(target, signal.SIGTERM)
            assert mind.proc is not None
            await asyncio.to_thread(mind.proc.wait, 60.0)
        print(f"load: {args.load}: {summary}; server: {args.server}; "
              f"profiler: {args.profiler}")
        if args.profiler == "py-spy":
            print_collapsed(out, args.top)
        else:
            print_cprofile(out, args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--load",
        choices=("fanout1", "fanout100", "resume", "latency", "sse1", "ws1", "sse-resume"),
        default="fanout100"
    )
    parser.add_argument("--profiler", choices=("cprofile", "py-spy"), default="cprofile")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--server", choices=("native", "asgi"), default="native",
                        help="asgi: halfpi mind --server asgi (uvicorn)")
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
