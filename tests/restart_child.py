"""A small real training process for tests that kill and restart a job (no framework).

    python tests/restart_child.py JOB RUN_DIR [--first N] [--restore] [--steps K]

It configures goodput for JOB with its spool in RUN_DIR, records training prep, with
``--restore`` a checkpoint restore of step N-1, then steps N, N+1, ... with data loading,
and a checkpoint save every 10 steps, after which it flushes and prints ``checkpoint S``.
With ``--steps K`` it ends cleanly after K steps; without, it trains until it is killed
(at most ``--max-seconds``, so a test that dies leaves no process behind for long).
``--step-seconds S``: each step sleeps S seconds (default 0.02).
"""

from __future__ import annotations

import argparse
import time

import goodput

STEP_S = 0.02


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("job")
    p.add_argument("run_dir")
    p.add_argument("--first", type=int, default=1)
    p.add_argument("--restore", action="store_true")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--step-seconds", type=float, default=STEP_S)
    a = p.parse_args()
    goodput.configure(a.job, run_dir=a.run_dir, flush_interval_s=0.2)
    deadline = time.monotonic() + a.max_seconds
    with goodput.training_prep():
        time.sleep(0.05)
    if a.restore:
        with goodput.checkpoint_restore(step=a.first - 1):
            time.sleep(0.02)
    n = a.first
    while (a.steps is None or n < a.first + a.steps) and time.monotonic() < deadline:
        with goodput.data_loading():
            time.sleep(0.002)
        with goodput.step(n):
            time.sleep(a.step_seconds)
        if n % 10 == 0:
            with goodput.checkpoint_save(step=n):
                time.sleep(0.005)
            goodput.flush()
            print(f"checkpoint {n}", flush=True)
        n += 1
    goodput.shutdown()


if __name__ == "__main__":
    main()
