"""Memory `goodput serve`'s store holds for one job: after taking a spool in, after a poll.

A :class:`~goodput_processor.serve.store.LiveStore` takes a run directory in through the
spool tailer (as ``goodput serve --spool-dir`` does), then accounts its job once (a poll
of ``GET /v1/report``), then collects its metrics (the rolling windows of ``GET /metrics``).
Printed: resident memory added at each point (``/proc/self/statm``,
after a garbage collection), the store's span rows (:meth:`LiveStore.memory_bytes`) and the
bytes per kept step. The accounting's memo (``goodput_processor.memo``) is what the poll
adds beyond the rows.

    python benchmarks/recorded_job.py /tmp/job1m --steps 1000000   # the recorder's spool
    python benchmarks/bench_store_memory.py /tmp/job1m
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectors"))


def rss_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv=None) -> int:
    """Measure and print one line; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    args = ap.parse_args(argv)
    from goodput_processor.metrics import DEFAULT_WINDOWS_S
    from goodput_processor.serve.store import LiveStore
    from goodput_processor.serve.tail import SpoolTailer

    gc.collect()
    r0 = rss_mb()
    store = LiveStore(min_interval_s=0)
    SpoolTailer(store, [args.run_dir]).poll()
    name = store.jobs()[0]
    gc.collect()
    r1, rows1 = rss_mb(), store.memory_bytes()[name]
    result = store.results(job=name)[0]
    gc.collect()
    r2, rows2 = rss_mb(), store.memory_bytes()[name]
    store.snapshot_windows(name, DEFAULT_WINDOWS_S)
    gc.collect()
    r3 = rss_mb()
    steps = result.step_time.count
    print(f"job {name!r}: {steps:,} kept steps; taken in: RSS +{r1 - r0:.0f} MiB (rows "
          f"{rows1 / 2**20:.0f} MiB); after a poll: RSS +{r2 - r0:.0f} MiB (rows "
          f"{rows2 / 2**20:.0f} MiB), {(r2 - r0) * 2**20 / max(steps, 1):.0f} bytes per step; "
          f"after a metrics collection too (rolling windows): RSS +{r3 - r0:.0f} MiB, "
          f"{(r3 - r0) * 2**20 / max(steps, 1):.0f} bytes per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
