"""CPU cost of a live poll, in the polling thread only (``time.thread_time``, ms), so that a
loaded machine's waits for a CPU do not count: one poll after 60 s of new data, then the
min and median of 15 polls with nothing new (a later now each).

The job is bench_live's (``bench_live.prepare``: recorded by the real recorder unless it
is already under ``--keep``, the last attempt running). Surfaces: ``serve``
(``SpoolTailer.poll`` + ``LiveStore.results``), ``compat`` (``goodput.mgm``'s
``GoodputCalculator.get_job_goodput``), ``monitor`` (``GoodputMonitor.run_once``).
Prints one JSON line per surface. To compare two trees, run it with ``PYTHONPATH`` on each
tree's ``collectors`` and ``src``, in turn, on the same ``--keep`` directory::

    python benchmarks/bench_poll_cpu.py --keep /tmp/live --steps 100000 \\
        --restarts 200 --shape incumbent --surfaces serve compat monitor
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_live  # noqa: E402
import recorded_job  # noqa: E402

POLLS = 15


def _poller(surface: str, run: Path):
    """A function that polls ``surface`` on the spool ``run`` and returns the goodput (%)."""
    if surface == "compat":
        from goodput.mgm.goodput import GoodputCalculator

        calc = GoodputCalculator(bench_live.JOB, run_dir=run, definitions="goodput")
        return lambda: calc.get_job_goodput(include_badput_breakdown=True)[0]
    if surface == "serve":
        from goodput_processor.serve.store import LiveStore
        from goodput_processor.serve.tail import SpoolTailer

        store = LiveStore(min_interval_s=0)
        tailer = SpoolTailer(store, [run])

        def poll():
            tailer.poll()
            return store.results(job=bench_live.JOB)[0].goodput * 100
        return poll
    from goodput_processor.serve.monitor import GoodputMonitor

    mon = GoodputMonitor(run, interval_s=3600)

    def poll():
        if not mon.run_once():
            raise RuntimeError(f"the monitor found no job in {run}")
        return mon.snapshots[0].result.goodput * 100
    return poll


def measure(job: dict, surface: str) -> dict:
    """One surface on one prepared job (``bench_live.prepare``'s dict): CPU ms of the poll
    after 60 s of new data (``new_ms``) and of the polls with nothing new (min, median)."""
    run, meta = job["run_dir"], job["meta"]
    half = bench_live.SEC // 2
    bench_live.truncate(run, meta)
    clock = bench_live.install_clock()
    clock.anchor(meta["t_kept"] + half)
    try:
        poll = _poller(surface, run)
        poll()
        bench_live.append_new(run, meta, job["new_path"])
        last = meta["t_last"] + half
        clock.anchor(last)
        t0 = time.thread_time()
        poll()
        new_s = time.thread_time() - t0
        ts = []
        for i in range(POLLS):
            clock.anchor(last + half + i * 1000)
            t0 = time.thread_time()
            goodput = poll()
            ts.append(time.thread_time() - t0)
    finally:
        bench_live.truncate(run, meta)
    ts.sort()
    return {"surface": surface, "new_ms": round(new_s * 1e3, 1),
            "none_min_ms": round(ts[0] * 1e3, 1), "none_med_ms": round(ts[POLLS // 2] * 1e3, 1),
            "goodput": round(goodput, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, required=True,
                    help="directory of the recorded jobs (made if missing, reused after)")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--surfaces", nargs="+", default=["serve", "compat", "monitor"],
                    choices=["serve", "compat", "monitor"])
    recorded_job.add_job_options(ap)
    args = ap.parse_args()
    import goodput_processor

    tree = str(Path(goodput_processor.__file__).parents[2])
    for restarts in args.restarts:
        job = bench_live.prepare(args.keep, args.steps, restarts=restarts, shape=args.shape)
        for surface in args.surfaces:
            print(json.dumps({"tree": tree, "restarts": restarts, **measure(job, surface)}),
                  flush=True)


if __name__ == "__main__":
    main()
