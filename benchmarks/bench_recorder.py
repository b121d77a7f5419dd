"""Training-thread cost of one recorded phase, next to a bare SDK span and a bare clock read.

All three run in one process, interleaved, so they share the machine's state:

- clock read: `time.time_ns()`;
- bare SDK span: `with tracer.start_as_current_span("step"):` on an SDK
  `TracerProvider` with a `BatchSpanProcessor` (the usual setup);
- recorded phase: `with goodput.step(n):` with the recorder's background
  thread writing the spool.

    python benchmarks/bench_recorder.py [--n 200000]

To compare two versions of the recorder side by side, run this same script with
``PYTHONPATH`` pointing at each version's ``src`` (it uses only the public API).

Target: a recorded phase costs at most a fifth of a bare SDK span.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import goodput


class _Discard(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def per_op_ns(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="operations per measurement")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--best-of", type=int, default=15,
                    help="blocks of recorded phases, background thread asleep: the fastest "
                         "is printed")
    args = ap.parse_args(argv)

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(_Discard()))
    tracer = provider.get_tracer("bench")
    with tempfile.TemporaryDirectory() as tmp:
        goodput.configure("bench", run_dir=tmp, handle_signals=False)

        def clock(n):
            f = time.time_ns
            for _ in range(n):
                f()

        def sdk_span(n):
            for i in range(n):
                with tracer.start_as_current_span("step", attributes={"goodput.step": i}):
                    pass

        def phase(n):
            step = goodput.step
            for i in range(n):
                with step(i):
                    pass

        results = {"clock read": [], "bare SDK span": [], "recorded phase": []}
        for _ in range(args.repeat):
            results["clock read"].append(per_op_ns(clock, args.n))
            results["bare SDK span"].append(per_op_ns(sdk_span, args.n))
            results["recorded phase"].append(per_op_ns(phase, args.n))
            goodput.flush(timeout_s=60)
        stats = goodput.get_recorder().stats()
        goodput.shutdown()
        # The training thread's own cost: the background thread asleep (a flush interval
        # of an hour), the best of many short blocks (one no other process interrupted).
        # As timeit does, the cyclic garbage collector is off while timing.
        goodput.configure("bench-alone", run_dir=tmp, flush_interval_s=3600)
        gc.disable()
        try:
            best = min(per_op_ns(phase, 20_000) for _ in range(args.best_of))
        finally:
            gc.enable()
        goodput.shutdown()
    provider.shutdown()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{'operation':<16} {'ns/op (median of ' + str(args.repeat) + ')':>24}")
    for k, v in med.items():
        print(f"{k:<16} {v:>24.0f}")
    ratio = med["recorded phase"] / med["bare SDK span"]
    print(f"recorded phase / bare SDK span = {ratio:.3f} (target <= 0.200)")
    print(f"recorded phase, training thread alone (best of {args.best_of} blocks of 20,000): "
          f"{best:.0f} ns")
    print(f"recorder: {stats['recorded']:,} phases recorded, {stats['errors']} errors, "
          f"{stats['dropped']} dropped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
