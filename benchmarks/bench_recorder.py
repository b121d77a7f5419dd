"""CPU per recorded phase: training thread plus background thread, against today's recorder
and ml-goodput-measurement 0.2.3's, and the training thread's cost next to a bare SDK span.

Part 1, total CPU per recorded phase (the target: at most 10 µs). Each recorder runs in
its own process, in interleaved rounds (``--rounds``): ``--n`` phases in a tight loop,
then a flush that writes everything. ``time.thread_time()`` of the loop is the training
thread's cost; ``time.process_time()`` of loop plus flush is the total (the recorder's
background thread, which encodes and writes the spans, included). Recorders:

- ``this``: ``with goodput.step(n):`` of this checkout (spool written, default settings);
- ``baseline``: the same loop with another checkout's recorder (``--baseline-src
  /tmp/old/src``, e.g. ``git worktree add /tmp/old <commit>``);
- ``mgm memory``: ml-goodput-measurement 0.2.3's ``GoodputRecorder.record_step_start_time``
  (one call per step) with an in-memory logger, as the project's tests drive it;
- ``mgm logging``: the same with its own ``_CloudLogger`` write path (``CloudLoggingHandler``
  and ``BackgroundThreadTransport``, batching and encoding entries on a background thread)
  against a Cloud Logging client whose ``write_entries`` discards them: the incumbent's
  cost without the network.

For ``this`` and ``baseline`` part 1 also prints the spool's bytes per recorded phase once
the process has ended its attempt (``shutdown``): every file, the journal (``*.jsonl``), the
compacted segments (``*.jsonl.gz``) and what a report reads (a segment's ``.gz``, else its
journal; :func:`spool_bytes`), and how long that ``shutdown()`` took after a flush (the
exit must not wait for the compaction).

Part 2, in one process, interleaved (the figures of ``docs/benchmarks.md``): a clock read,
a bare SDK span (``BatchSpanProcessor``), a recorded phase, and the training thread alone
(background thread asleep, best of ``--best-of`` blocks of 20,000, gc off as timeit does).

    python benchmarks/bench_recorder.py [--n 200000] [--baseline-src /tmp/old/src]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# --- part 1: one recorder per process -------------------------------------------------


def spool_bytes(run_dir: str) -> dict:
    """Bytes of the spool files under ``run_dir``: ``all`` (every file), ``journal``
    (``*.jsonl``), ``compacted`` (``*.jsonl.gz``) and ``read`` (what a report reads: the
    compacted segments and the journals without one)."""
    out = dict.fromkeys(("all", "journal", "compacted", "read"), 0)
    names = set(os.listdir(run_dir))
    for name in names:
        size = os.path.getsize(os.path.join(run_dir, name))
        out["all"] += size
        if name.endswith(".jsonl"):
            out["journal"] += size
            if name + ".gz" not in names:
                out["read"] += size
        elif name.endswith(".jsonl.gz"):
            out["compacted"] += size
            out["read"] += size
    return out


def _ours(n: int) -> tuple[float, float, dict]:
    import goodput

    with tempfile.TemporaryDirectory() as tmp:
        goodput.configure("bench", run_dir=tmp, handle_signals=False)
        step = goodput.step
        for i in range(2000):  # warm up
            with step(i):
                pass
        goodput.flush(timeout_s=60)
        gc.collect()
        p0, t0 = time.process_time(), time.thread_time()
        for i in range(n):
            with step(i):
                pass
        t1 = time.thread_time()
        goodput.flush(timeout_s=600)
        p1 = time.process_time()
        stats = goodput.get_recorder().stats()
        t2 = time.perf_counter()
        goodput.shutdown()  # the attempt's end: its last segment compacted
        exit_ms = (time.perf_counter() - t2) * 1e3
        sizes = {f"{k}_b": v / (n + 2000) for k, v in spool_bytes(tmp).items()}
        sizes["exit_ms"] = exit_ms
    assert stats["errors"] == 0 and stats["dropped"] == 0, stats
    return t1 - t0, p1 - p0, sizes


class _Entries:
    """An in-memory stand-in for mgm's Cloud Logging client (as the project's tests use)."""

    def __init__(self):
        self.entries = []

    def write_cloud_logging_entry(self, entry):
        self.entries.append(entry)

    def flush(self):
        pass


def _mgm_logger():
    """mgm's own ``_CloudLogger`` on a client that discards the batches it commits."""
    from unittest import mock

    import google.cloud.logging
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.logging_v2.resource import Resource
    from ml_goodput_measurement.src import goodput as mgm

    class Discard:
        def write_entries(self, entries, **kwargs):
            pass

    real = google.cloud.logging.Client

    def client(*args, **kwargs):
        c = real(project="bench", credentials=AnonymousCredentials(), _use_grpc=False)
        c._logging_api = Discard()
        return c

    with mock.patch.object(google.cloud.logging, "Client", client), mock.patch(
            "google.cloud.logging_v2.handlers.handlers.detect_resource",
            lambda *a, **k: Resource(type="global", labels={})):
        return mgm._CloudLogger("bench", "bench")


def _mgm(n: int, logging_path: bool) -> tuple[float, float]:
    from ml_goodput_measurement.src import goodput as mgm

    logger = _mgm_logger() if logging_path else _Entries()
    rec = mgm.GoodputRecorder("bench", "bench", True, cloud_logger=logger)
    for i in range(2000):
        rec.record_step_start_time(i)
    logger.flush()
    gc.collect()
    p0, t0 = time.process_time(), time.thread_time()
    for i in range(n):
        rec.record_step_start_time(i)
    t1 = time.thread_time()
    logger.flush()
    return t1 - t0, time.process_time() - p0


def _worker(kind: str, n: int) -> None:
    sizes = {}
    if kind in ("this", "baseline"):
        loop, total, sizes = _ours(n)
    else:
        loop, total = _mgm(n, kind == "mgm logging")
    print(json.dumps({"train_us": loop / n * 1e6, "total_us": total / n * 1e6,
                      **sizes}))


def compare(n: int, rounds: int, baseline_src: str | None) -> dict[str, list[dict]]:
    """Each recorder in its own process, ``rounds`` interleaved rounds."""
    kinds = {"this": str(ROOT / "src")}
    if baseline_src:
        kinds["baseline"] = baseline_src
    try:
        import ml_goodput_measurement  # noqa: F401

        kinds["mgm memory"] = kinds["mgm logging"] = str(ROOT / "src")
    except ImportError:
        pass
    out: dict[str, list[dict]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for kind, src in kinds.items():
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(ROOT / "collectors")])}
            res = subprocess.run([sys.executable, __file__, "--worker", kind, "--n", str(n)],
                                 env=env, capture_output=True, text=True, check=True)
            out[kind].append(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


# --- part 2: the training thread next to a bare SDK span ------------------------------


def per_op_ns(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def in_process(n: int, repeat: int, best_of: int) -> tuple[dict, float, dict]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    import goodput

    class _Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

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
        for _ in range(repeat):
            results["clock read"].append(per_op_ns(clock, n))
            results["bare SDK span"].append(per_op_ns(sdk_span, n))
            results["recorded phase"].append(per_op_ns(phase, n))
            goodput.flush(timeout_s=60)
        stats = goodput.get_recorder().stats()
        goodput.shutdown()
        goodput.configure("bench-alone", run_dir=tmp, flush_interval_s=3600)
        gc.disable()
        try:
            best = min(per_op_ns(phase, 20_000) for _ in range(best_of))
        finally:
            gc.enable()
        goodput.shutdown()
    provider.shutdown()
    return {k: statistics.median(v) for k, v in results.items()}, best, stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="phases per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of part 1")
    ap.add_argument("--baseline-src", help="another checkout's src/ (today's recorder)")
    ap.add_argument("--repeat", type=int, default=5, help="repeats of part 2")
    ap.add_argument("--best-of", type=int, default=15)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.n)
        return 0

    res = compare(args.n, args.rounds, args.baseline_src)
    print(f"CPU per recorded phase, µs (median of {args.rounds} interleaved rounds of "
          f"{args.n:,} phases, each recorder in its own process)")
    print(f"{'recorder':<14} {'training thread':>16} {'total (all threads)':>20} "
          f"{'background':>11}")
    med = {}
    for kind, runs in res.items():
        train = statistics.median(r["train_us"] for r in runs)
        total = statistics.median(r["total_us"] for r in runs)
        med[kind] = total
        print(f"{kind:<14} {train:>16.2f} {total:>20.2f} {total - train:>11.2f}")
    print(f"target: total <= 10 µs per phase: {'met' if med['this'] <= 10 else 'NOT met'}")
    print("\nspool bytes per recorded phase (after the exit; last round): all files, journal "
          "(*.jsonl), compacted (*.jsonl.gz), read by a report (the .gz, else the journal)")
    for kind, runs in res.items():
        if "all_b" in runs[-1]:
            r = runs[-1]
            print(f"{kind:<14} all {r['all_b']:>7.1f}  journal {r['journal_b']:>7.1f}  "
                  f"compacted {r['compacted_b']:>6.1f}  read {r['read_b']:>7.1f}  "
                  f"(shutdown after a flush: {r['exit_ms']:.1f} ms)")
    for other in ("baseline", "mgm memory", "mgm logging"):
        if other in med:
            print(f"this / {other} = {med['this'] / med[other]:.3f}")

    med2, best, stats = in_process(args.n, args.repeat, args.best_of)
    print(f"\n{'operation':<16} {'ns/op (median of ' + str(args.repeat) + ')':>24}")
    for k, v in med2.items():
        print(f"{k:<16} {v:>24.0f}")
    print(f"recorded phase / bare SDK span = "
          f"{med2['recorded phase'] / med2['bare SDK span']:.3f} (target <= 0.200)")
    print(f"recorded phase, training thread alone (best of {args.best_of} blocks of 20,000): "
          f"{best:.0f} ns")
    print(f"recorder: {stats['recorded']:,} phases recorded, {stats['errors']} errors, "
          f"{stats['dropped']} dropped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
