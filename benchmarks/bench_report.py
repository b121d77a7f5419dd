"""`goodput report` wall time and peak memory for synthetic jobs of 10^4, 10^5, 10^6 steps.

Each job has 3 restarts (with redone steps), a blocking checkpoint save every
1,000 steps, an `eval` custom badput every 5,000 steps and a data-loading span
per step. The report runs as its own OS process (`python -m
goodput_processor.cli report DIR --format json`); peak memory is that process's
maximum resident set size (`wait4`).

    python benchmarks/bench_report.py [--sizes 10000 100000 1000000]

Targets: 10^6 steps in under 5 s and 500 MB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth  # noqa: E402


def measure(run_dir: str) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one `goodput report --format json` process."""
    cmd = [sys.executable, "-m", "goodput_processor.cli", "report", run_dir, "--format", "json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"report failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=3, help="runs per size")
    args = ap.parse_args(argv)
    print(f"{'steps':>10} {'spans':>10} {'spool MB':>9} {'wall s best':>12} {'worst':>6} "
          f"{'peak MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for steps in args.sizes:
            d = os.path.join(tmp, f"job{steps}")
            synth.write_job(d, steps)
            size = sum(p.stat().st_size for p in Path(d).glob("*.jsonl")) / 2**20
            spans = sum(line.count('"spanId"') for p in Path(d).glob("*.jsonl")
                        for line in open(p, encoding="utf-8"))
            runs = [measure(d) for _ in range(args.repeat)]
            best, worst = min(r[0] for r in runs), max(r[0] for r in runs)
            peak = max(r[1] for r in runs)
            print(f"{steps:>10,} {spans:>10,} {size:>9.1f} {best:>12.2f} {worst:>6.2f} "
                  f"{peak:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
