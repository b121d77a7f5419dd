"""How `goodput report` and a live poll grow with the job: measured at several sizes, fitted.

Issue 17, target 5: a 10^7-step job (a four-month job of 1 s steps, with restarts and
checkpoints) gets ``goodput report`` under 30 s and under 2 GB, and ``goodput serve`` live
polls under 100 ms; measured once and extrapolated with the fitted growth law.

For each ``--steps`` size:

- **report**: the spool of ``benchmarks/recorded_job.py`` recorded by the real recorder
  (``bench_report.py``'s job and its ``measure``: ``goodput report --format json
  --no-cache`` in its own process, wall seconds and peak RSS), both definitions;
- **live** (``--live``): ``bench_live.py``'s ``serve-report`` surface on its job of the same
  size (last attempt running; ``GET /v1/report`` after 60 s of new data and with nothing
  new, ms, and the serving process's peak RSS).

Each series is fitted with a power law ``y = a * steps^b`` (least squares in log-log,
``numpy.polyfit``) over all sizes, and over the two largest only (where fixed costs no
longer flatten it: the law to extrapolate with); printed: ``b`` and the laws' values at
10^7 and 10^8 steps next to the targets. Spools are kept under ``--keep`` (reused by
later runs, as ``bench_report.py --keep`` and ``bench_live.py --keep`` do: the same
directories can be shared).

    python benchmarks/bench_growth.py --keep /tmp/growth --steps 100000 1000000 10000000
    python benchmarks/bench_growth.py --keep /tmp/growth --steps 100000 1000000 --live
    python benchmarks/bench_growth.py --keep /tmp/growth --steps 100000 1000000 --live \
        --restarts 3 200 --shape incumbent     # a series per restarts (" R200": the second)

A run at 10^7 steps records about 700 MB per spool (about 2.5 minutes each) and needs about
6 GB of memory. It is a benchmark, never a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_live  # noqa: E402
import bench_report  # noqa: E402
import recorded_job  # noqa: E402

#: (series, unit, target at 10^7 steps)
TARGETS = {"report goodput s": 30.0, "report goodput MB": 2000.0, "report mgm s": 30.0,
           "report mgm MB": 2000.0, "live 60 s new ms": 100.0, "live nothing new ms": 100.0}


def report_point(keep: Path, steps: int, restarts: int = 3, shape: str = "own") -> dict:
    """Report wall seconds and peak MB for both definitions on the recorded spool of
    ``steps`` steps with ``restarts`` restarts in ``shape`` (``recorded_job.SHAPES``),
    recorded under ``keep`` unless already there (as ``bench_report.py --keep`` names it)."""
    d = keep / f"this-{recorded_job.job_name(steps, restarts, shape)}"
    done = Path(str(d) + bench_report._DONE)
    if not done.is_file():
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(HERE.parent / "src"), str(HERE.parent / "collectors")])}
        done.write_text(json.dumps(recorded_job.write_job(str(d), steps, restarts, env=env,
                                                          shape=shape)))
    out = {}
    for defs in ("goodput", "mgm"):
        wall, peak = bench_report.measure(str(d), defs)
        out[f"report {defs} s"], out[f"report {defs} MB"] = wall, peak
    return out


def live_point(keep: Path, steps: int, restarts: int = 3, shape: str = "own") -> dict:
    """``serve-report`` live poll figures of ``bench_live.py`` on its job of ``steps``
    with ``restarts`` restarts in ``shape``."""
    job = bench_live.prepare(keep / "live", steps, restarts=restarts, shape=shape)
    work = Path(tempfile.mkdtemp(prefix="bench_growth_", dir="/tmp"))
    try:
        res = bench_live.run_child("serve-report", "goodput", job, work)
    finally:
        bench_live.truncate(job["run_dir"], job["meta"])
        bench_live.append_new(job["run_dir"], job["meta"], job["new_path"])
    return {"live 60 s new ms": res["new"], "live nothing new ms": res["none"],
            "live peak MB": res["rss"]}


def fit(xs, ys) -> tuple[float, float] | None:
    """``(a, b)`` of ``y = a * x^b`` by least squares in log-log; None with < 2 points."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and y > 0]
    if len(pts) < 2:
        return None
    b, log_a = np.polyfit([math.log10(x) for x, _ in pts], [math.log10(y) for _, y in pts], 1)
    return 10 ** log_a, b


def main(argv=None) -> int:
    """Measure every size, print the points and the fitted laws; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--keep", required=True, help="directory of the spools (kept, reused)")
    ap.add_argument("--live", action="store_true", help="also measure serve's live polls")
    recorded_job.add_job_options(ap)  # --restarts R [R ...] (a series each), --shape
    args = ap.parse_args(argv)
    keep = Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    points: dict[int, dict] = {}
    for steps in sorted(args.steps):
        points[steps] = {}
        for n in args.restarts:  # side by side: each size with every restarts in turn
            sfx = "" if n == args.restarts[0] else f" R{n}"
            got = report_point(keep, steps, n, args.shape)
            if args.live:
                got.update(live_point(keep, steps, n, args.shape))
            points[steps].update({k + sfx: v for k, v in got.items()})
        print(f"{steps:>11,} steps: " + ", ".join(f"{k} {v:,.1f}" for k, v in
                                                   points[steps].items()), flush=True)
    series = sorted({k for p in points.values() for k in p})
    print(f"\n{'series':<22} {'b, all sizes':>13} {'at 10^7':>10} {'at 10^8':>10} "
          f"{'b, 2 largest':>13} {'at 10^8':>10} {'target at 10^7':>15}")
    sizes = sorted(points)
    for name in series:
        law = fit(sizes, [points[s].get(name) for s in sizes])
        top = fit(sizes[-2:], [points[s].get(name) for s in sizes[-2:]])
        target = TARGETS.get(name.split(" R")[0])
        tgt = "-" if target is None else f"< {target:,.0f}"
        cols = []
        for f, at in ((law, (1e7, 1e8)), (top, (1e8,))):
            if f is None:
                cols += ["-"] * (1 + len(at))
            else:
                cols += [f"{f[1]:.2f}"] + [f"{f[0] * x ** f[1]:,.1f}" for x in at]
        print(f"{name:<22} {cols[0]:>13} {cols[1]:>10} {cols[2]:>10} {cols[3]:>13} "
              f"{cols[4]:>10} {tgt:>15}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
