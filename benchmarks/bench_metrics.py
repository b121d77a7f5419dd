"""Cost of the in-process GoodputMonitor on a training loop, and of one metrics collection.

    python benchmarks/bench_metrics.py [--steps 3000] [--interval 1.0]

Runs a loop of ``--steps`` steps of ~1 ms of numpy work each, recorded with
``goodput.step``, once without and once with a :class:`GoodputMonitor` (in-memory
metric reader + TensorBoard) following the spool every ``--interval`` seconds, and
prints the mean per-step time of both, the monitor's cycle time and the time of one
collection of all gauges. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import goodput
from goodput_processor.serve.monitor import GoodputMonitor

_A = np.random.default_rng(0).standard_normal((160, 160))


def _loop(steps: int, first: int) -> float:
    t0 = time.perf_counter()
    for n in range(first, first + steps):
        with goodput.step(n):
            _A @ _A  # noqa: B018 - the "training" work
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        goodput.configure("bench", run_dir=run, handle_signals=False, start_time=time.time())
        _loop(200, 0)  # warm up
        base = _loop(args.steps, 200)
        reader = InMemoryMetricReader()
        mon = GoodputMonitor(run, interval_s=args.interval,
                             meter_provider=MeterProvider(metric_readers=[reader]),
                             tensorboard_dir=Path(d) / "tb").start()
        with_mon = _loop(args.steps, 200 + args.steps)
        t0 = time.perf_counter()
        reader.get_metrics_data()
        collect = time.perf_counter() - t0
        goodput.shutdown()
        t0 = time.perf_counter()
        ok = mon.stop(timeout_s=10)
        stop_s = time.perf_counter() - t0
        print(f"steps per run: {args.steps}, monitor interval {args.interval} s")
        print(f"per step without monitor: {base * 1e6:.1f} us")
        print(f"per step with monitor:    {with_mon * 1e6:.1f} us "
              f"({(with_mon / base - 1) * 100:+.1f} %)")
        print(f"monitor cycles: {mon.cycles}, errors {mon.errors}, "
              f"last cycle {mon.last_cycle_s * 1e3:.1f} ms "
              f"(spool of up to {2 * args.steps + 200} steps)")
        print(f"one collection of all gauges (cached snapshot): {collect * 1e3:.2f} ms")
        print(f"stop (final cycle + flush): {stop_s * 1e3:.1f} ms, ok={ok}")


if __name__ == "__main__":
    main()
