"""Run every benchmark, one after the other, and print one combined table.

Each script runs in its own process (they start their own servers) and
writes its summary rows to a JSON file; its full output is shown as it runs.

    python benchmarks/run_all.py [--quick] [--only fanout resume ...] [--json PATH]
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
BENCHES = ("fanout", "resume", "append", "memory")


def run(name: str, quick: bool, out: Path) -> tuple[list[dict[str, Any]], float, int]:
    argv = [PYTHON, str(HERE / f"{name}.py"), "--json", str(out)]
    if quick:
        argv.append("--quick")
    print(f"\n=== {name} ===", flush=True)
    start = time.perf_counter()
    code = subprocess.call(argv)
    seconds = time.perf_counter() - start
    rows = json.loads(out.read_text())["rows"] if code == 0 and out.exists() else []
    return rows, seconds, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="less work per benchmark")
    parser.add_argument("--only", nargs="+", choices=BENCHES, default=list(BENCHES))
    parser.add_argument("--json", help="write all summary rows to this file")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    timings = []
    failed = []
    with tempfile.TemporaryDirectory(prefix="halfpi-bench-") as tmp:
        for name in args.only:
            got, seconds, code = run(name, args.quick, Path(tmp) / f"{name}.json")
            rows.extend(got)
            timings.append(f"{name} {seconds:.0f} s")
            if code != 0:
                failed.append(f"{name} (exit {code})")
    print()
    print(
        summary_table(
            rows, "halfpi benchmarks: figures and ratios against baselines measured in the same run"
        )
    )
    targets = [r for r in rows if r["met"] is not None]
    met = sum(1 for r in targets if r["met"])
    print(f"\ntargets met: {met}/{len(targets)}; took {', '.join(timings)}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
