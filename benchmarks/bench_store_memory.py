"""Memory `goodput serve`'s store holds for one job: after taking a spool in, after a poll.

A :class:`~goodput_processor.serve.store.LiveStore` takes a run directory in through the
spool tailer (as ``goodput serve --spool-dir`` does), then accounts its job once (a poll
of ``GET /v1/report``), then collects its metrics (the rolling windows of ``GET /metrics``).
Printed: resident memory added at each point (``/proc/self/statm``,
after a garbage collection), the store's span rows (:meth:`LiveStore.memory_bytes`) and the
bytes per kept step. The accounting's memo (``goodput_processor.model.memo``) is what the poll
adds beyond the rows. Then (unless ``--no-compact``) the store packs every process's rows
(:meth:`~goodput_processor.serve.store.LiveStore.compact`, what ``goodput serve``'s
maintenance does to processes quiet for ``--pack-after`` seconds), polls and collects the
metrics again, runs the next maintenance round (nothing left to pack; it gives the C heap's
free pages back, ``LiveStore.give_back_heap``, as ``GoodputServer.maintain`` does), and
prints what it holds then, and again after an unconditional heap trim: the packed rows
are kept on disk in a :class:`~goodput_processor.serve.spill.Spill` (``goodput serve``'s
default; ``--no-spill``: in memory, ``--spill-dir off``), and the kept steps of whole
attempts and the finished
ones' sorted step times are mapped from files there (``Spill.map``; the resident memory
counts the pages of them that were read, ``RssFile``). Its last line says what the
store's rows and the job's memos hold then, by kind (:func:`breakdown`).

    python benchmarks/recorded_job.py /tmp/job1m --steps 1000000   # the recorder's spool
    python benchmarks/bench_store_memory.py /tmp/job1m

With ``--steps N`` the positional argument is a directory of spools instead (as
``bench_report.py --keep`` keeps them: ``DIR/this-N[-restartsR][-incumbent]``, recorded by
``recorded_job.write_job`` unless there): each job of ``--restarts R [R ...]`` and
``--shape`` (``recorded_job.add_job_options``) is measured in its own child process, in
turn, side by side:

    python benchmarks/bench_store_memory.py /tmp/spools --steps 1000000 --restarts 3 200 \
        --shape incumbent
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectors"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorded_job  # noqa: E402


def rss_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_file_mb() -> float:
    """The part of the resident memory that is pages of mapped files, in MiB (Linux
    ``/proc/self/status`` ``RssFile``: the program's own code and libraries too)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) / 1024
    return 0.0


def array_bytes(obj, seen: set) -> int:
    """Bytes of the numpy arrays and ``bytes`` reachable from ``obj`` (through tuples,
    lists, dicts and objects' attributes), each buffer counted once across calls sharing
    ``seen``; broadcast views count nothing (their memory is one value), nor do views of a
    memory-mapped file (``Spill.map``: their pages are resident only where read, and
    counted in the RSS as the mapped files' share, :func:`rss_file_mb`)."""
    import numpy as np

    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (str, int, float, bool, type(None))):
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base is o or id(base) not in seen:
                seen.add(id(base))
                mapped = isinstance(base.base, memoryview) and isinstance(base.base.obj,
                                                                          mmap.mmap)
                total += 0 if 0 in base.strides or mapped else base.nbytes
        elif isinstance(o, (bytes, bytearray)):
            total += len(o)
        elif isinstance(o, dict):
            stack += [*o.keys(), *o.values()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack += list(o)
        elif hasattr(o, "__dict__"):
            stack.append(vars(o))
        elif hasattr(o, "__slots__"):
            stack += [getattr(o, a) for a in o.__slots__ if hasattr(o, a)]
    return total


def breakdown(store, name: str) -> str:
    """What the store's rows and the job's memos hold, in MiB by memo entry tag (the
    windows' painted parts split into their segments and the rest), shared arrays once."""
    seen: set = set()
    parts = [f"store rows {array_bytes(list(store._rows[name].values()), seen) / 2**20:.1f}"]
    _lock, memos = store._memos[name]
    for windows, memo in sorted(memos.items()):
        by: dict[str, float] = {}
        keys = [k for d in (memo._old, memo._new) for k in d]  # (every key it keeps)
        for tag in sorted({k[0] for k in keys if isinstance(k, tuple) and k
                           and isinstance(k[0], str)}):
            for _k, v in memo.entries(tag):
                if windows and tag in ("attempt", "piece"):  # (painting._part's tuple)
                    by["segments"] = by.get("segments", 0) + array_bytes(v[6], seen)
                    v = v[:6]
                by[tag] = by.get(tag, 0) + array_bytes(v, seen)
        parts.append(("windows memo: " if windows else "report memo: ") + ", ".join(
            f"{k} {v / 2**20:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])
            if v >= 2**17))
    return "; ".join(parts) + " (MiB)"


def print_traced(n: int, steps: int) -> None:
    """Print what the allocations traced since ``tracemalloc.start()`` still hold: in all,
    by file, and the ``n`` lines holding the most (MiB, and bytes per step of ``steps``)."""
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    total = sum(s.size for s in snap.statistics("filename"))
    print(f"traced, held: {total / 2**20:.1f} MiB, {total / steps:.1f} bytes per step")
    for kind, top in (("filename", 12), ("lineno", n)):
        for s in snap.statistics(kind)[:top]:
            f = s.traceback[0]
            where = f.filename.split("goodput_processor/")[-1] + (
                f":{f.lineno}" if kind == "lineno" else "")
            print(f"  {s.size / 2**20:8.2f} MiB {s.size / steps:6.2f} B/step "
                  f"{s.count:9,} blocks  {where}")


def each_job(base: Path, steps: int, restarts: list[int], shape: str,
             extra: list[str] = ()) -> int:
    """Record (unless there) and measure each job of ``restarts`` under ``base``, each in
    a child process running this script on its spool (with the options ``extra``);
    returns the first failing child's exit status, or 0."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"),
                                                         str(root / "collectors")])}
    for n in restarts:
        d = base / f"this-{recorded_job.job_name(steps, n, shape)}"
        done = Path(str(d) + ".recorded")  # (bench_report._DONE)
        if not done.is_file():
            done.write_text(json.dumps(recorded_job.write_job(str(d), steps, n, env=env,
                                                              shape=shape)))
        print(f"--- {steps:,} steps, {n} restarts ({shape}): {d}", flush=True)
        rc = subprocess.run([sys.executable, __file__, str(d), *extra], env=env).returncode
        if rc:
            return rc
    return 0


def main(argv=None) -> int:
    """Measure and print one line; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a spool; with --steps, a directory of spools")
    ap.add_argument("--steps", type=int, help="record/reuse jobs of this many steps under "
                    "run_dir, one per --restarts, and measure each in its own process")
    recorded_job.add_job_options(ap)
    ap.add_argument("--no-compact", action="store_true",
                    help="stop before packing the quiet processes' rows (LiveStore.compact)")
    ap.add_argument("--no-spill", action="store_true",
                    help="keep the packed rows in memory (goodput serve --spill-dir off)")
    ap.add_argument("--trace", type=int, default=0, metavar="N",
                    help="trace allocations (tracemalloc, from before the spool is taken "
                    "in; slower) and print the N sites that hold the most at the end")
    args = ap.parse_args(argv)
    if args.steps:
        Path(args.run_dir).mkdir(parents=True, exist_ok=True)
        return each_job(Path(args.run_dir), args.steps, args.restarts, args.shape,
                        ["--trace", str(args.trace)] if args.trace else [])
    from goodput_processor.exporters.metrics import DEFAULT_WINDOWS_S
    from goodput_processor.read.heap import trim_heap
    from goodput_processor.serve.rows import PackedProcessSpans
    from goodput_processor.serve.store import LiveStore
    from goodput_processor.serve.tail import SpoolTailer

    if args.trace:
        tracemalloc.start()
    gc.collect()
    r0, f0 = rss_mb(), rss_file_mb()
    from goodput_processor.serve.spill import Spill

    spill = None if args.no_spill else Spill()
    store = LiveStore(min_interval_s=0, spill=spill)
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
    steps = max(result.step_time.count, 1)
    del result  # (its arrays are the memo's: mapped to files by the compaction below)
    print(f"job {name!r}: {steps:,} kept steps; taken in: RSS +{r1 - r0:.0f} MiB (rows "
          f"{rows1 / 2**20:.0f} MiB); after a poll: RSS +{r2 - r0:.0f} MiB (rows "
          f"{rows2 / 2**20:.0f} MiB), {(r2 - r0) * 2**20 / steps:.0f} bytes per step; "
          f"after a metrics collection too (rolling windows): RSS +{r3 - r0:.0f} MiB, "
          f"{(r3 - r0) * 2**20 / steps:.0f} bytes per step")
    if args.no_compact:
        return 0
    # What a maintenance round of goodput serve does to processes quiet for a minute
    # (LiveStore.compact), then a poll and a metrics collection that find nothing new
    t0 = time.perf_counter()
    packed = store.compact(min_quiet_s=0)
    t1 = time.perf_counter()
    store.results(job=name)
    t2 = time.perf_counter()
    store.snapshot_windows(name, DEFAULT_WINDOWS_S)
    t3 = time.perf_counter()
    store.snapshot_windows(name, DEFAULT_WINDOWS_S)  # (the first may read the last attempt
    t4 = time.perf_counter()  # once: its pieces looked at again with the same rows)
    gc.collect()
    r4, rows4 = rss_mb(), store.memory_bytes()[name]
    t5 = time.perf_counter()
    store.compact(min_quiet_s=0)  # the next maintenance round (GoodputServer.maintain):
    store.give_back_heap()  # nothing left to pack; the heap the poll left behind given back
    t6 = time.perf_counter()
    gc.collect()
    r5, f5 = rss_mb(), rss_file_mb()
    print(f"compacted ({packed:,} rows packed in {t1 - t0:.2f} s), then a poll "
          f"({(t2 - t1) * 1e3:.1f} ms) and two metrics collections ({(t3 - t2) * 1e3:.1f}, "
          f"{(t4 - t3) * 1e3:.1f} ms): RSS +{r4 - r0:.0f} MiB (rows {rows4 / 2**20:.0f} MiB), "
          f"{(r4 - r0) * 2**20 / steps:.0f} bytes per step; then a maintenance round "
          f"({(t6 - t5) * 1e3:.1f} ms): RSS +{r5 - r0:.0f} MiB, "
          f"{(r5 - r0) * 2**20 / steps:.0f} bytes per step"
          + ("" if spill is None else "; packed rows and segments on disk: "
             f"{spill.disk_bytes / 2**20:.0f} MiB, {spill.disk_bytes / steps:.0f} bytes per "
             f"step; kept steps in mapped files: {spill.mapped_bytes / 2**20:.0f} MiB, of "
             f"which resident {f5 - f0:.0f} MiB (RssFile)"))
    # What of that is still the C heap's free pages (none, if the round's trim ran)
    trim_heap()
    gc.collect()
    r6 = rss_mb()
    print(f"then the C heap's free pages given back (heap.trim_heap, unconditionally): RSS "
          f"+{r6 - r0:.0f} MiB, {(r6 - r0) * 2**20 / steps:.0f} bytes per step")
    if args.trace:  # (before a packed process is read below)
        print_traced(args.trace, steps)
    # What reading a packed process costs (a memo dropped, a fresh accounting)
    big = max(store.snapshot(name).processes.values(), key=lambda p: p.rows_id[0]
              if isinstance(p, PackedProcessSpans) else -1)
    if isinstance(big, PackedProcessSpans):
        t0 = time.perf_counter()
        n = len(big.data)
        print(f"reading the largest packed process's {n:,} rows (inflating them"
              + ("" if spill is None else ", from disk") +
              f"): {time.perf_counter() - t0:.3f} s")
    print("held then: " + breakdown(store, name))
    if spill is not None:
        spill.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
