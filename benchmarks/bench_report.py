"""Spools the real recorder writes, and `goodput report` wall time and peak memory on them.

The recorder records the job of ``benchmarks/recorded_job.py`` (3 restarts with redone
steps, a data-loading phase before every 0.5 s step, a 2 s checkpoint save every 1,000
steps, a 5 s ``eval`` every 5,000) on a simulated clock, flushing at every 1 s (the
default interval) of simulated time: one journal line per flush, a ``goodput.open``
record for the phase in flight at each flush, segments compacted as they close. With
``--baseline-src`` the same job is also recorded by another checkout's recorder (e.g.
``git worktree add /tmp/old <commit>``), and both spools are read by this checkout's
``goodput report``.

Each report runs as its own OS process (``python -m goodput_processor.cli report DIR
--format json``, with ``--definitions mgm`` too); peak memory is that process's maximum
resident set size (``wait4``), taken by a small intermediate process (:data:`_TIMED`) that
starts it: Linux gives a process started by ``fork``/``vfork`` + ``exec`` the resident
high-water mark of the memory it ran in before its ``exec`` (``exec_mmap``), so a report
started by this benchmark, which holds the spools' figures and more, was given this
process's peak; the intermediate's own (about 10 MB) is the floor. The first report
reads the spool (``--no-cache``); then the spool's files are dated 60 s back (a finished
run: the columnar cache, ``goodput_processor.read.cache``, is written only for files quiet
for 30 s), the first report with the cache on reads the spool and writes the cache
("+cache"; its cache is removed before each run), and the next ones ("2nd") read the cache.
Times are the median of ``--repeat`` runs, peak memory their maximum.

    python benchmarks/bench_report.py [--steps 1000000] [--baseline-src /tmp/old/src]
    python benchmarks/bench_report.py --keep /tmp/spools   # again: the spools are reused
    python benchmarks/bench_report.py --source megatron --steps 100000 --repeat 3
    python benchmarks/bench_report.py --keep /tmp/spools --restarts 3 200 --shape incumbent

``--spools recorder import`` measures, beside the recorder's spool, the import-shaped spool
of the same job: ml-goodput-measurement's entries of it (:func:`mgm_payloads`) through
``goodput import`` (:func:`write_import`: plain ``*.jsonl``, 512 spans a line, the resource on
each; "rec s" is the import's wall time), kept under ``--keep`` as ``import-<job>``.

    python benchmarks/bench_report.py --keep /tmp/spools --restarts 200 --shape incumbent \
        --spools recorder import

``--restarts`` (several: one spool each, side by side) and ``--shape`` are
``recorded_job.add_job_options``'s; each spool's line after its rows gives an orjson parse
of the bytes a report reads, on one core, the reports' ratio to it (issue 40: within 2x)
and the ``*.tmp`` files left in the spool after the reports (issue 40: none).

Target (issue 17): a 10^6-step job makes a spool under 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recorded_job  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_DONE = ".recorded"  # DIR.recorded is written beside a spool DIR once it is recorded


def mgm_payloads(steps: int, restarts: int, shape: str):
    """ml-goodput-measurement's recorder payloads (its local cache's bare payloads: POSIX
    seconds) of the job ``recorded_job.run_attempt`` records, attempt by attempt on the same
    clock and draws: job start, TPU init (5 s), training prep (10 s), an Orbax restore
    (3 s) after the first attempt, 20 s to the first step, a data-loading phase and a step
    per step, a 2 s save every ``ckpt_every`` steps, a 5 s ``eval`` every ``eval_every``,
    a killed attempt resumed 60 s later from its last save, a job end after the last."""
    import random

    sec = recorded_job.SEC
    state = recorded_job.state_of(steps, restarts, shape)
    t, done, kill_at = state["t"], 0, state["kill_at"]
    step_ns = int(state["step_s"] * sec)
    for attempt in range(len(kill_at) + 1):
        rng = random.Random(state["seed"] * 1000 + attempt)
        yield {"job_name": "recorded", "job_start_time": t / sec}
        yield {"job_name": "recorded", "tpu_init_start_time": t / sec}
        yield {"job_name": "recorded", "tpu_init_end_time": (t + 5 * sec) / sec}
        yield {"job_name": "recorded", "training_prep_start_time": (t + 5 * sec) / sec}
        yield {"job_name": "recorded", "training_prep_end_time": (t + 15 * sec) / sec}
        t += 15 * sec
        if done:
            yield {"event_type": "restore", "step": done,
                   "checkpoint_manager_start_time": t / sec,
                   "checkpoint_manager_duration_secs": 3.0}
            t += 3 * sec
        t += 20 * sec  # program startup (mgm: the first step's extra time)
        stop = kill_at[attempt] if attempt < len(kill_at) else state["steps"]
        for n in range(done + 1, stop + 1):
            yield {"job_name": "recorded", "data_loading_start_time": t / sec}
            t += step_ns // 50
            yield {"job_name": "recorded", "data_loading_end_time": t / sec}
            yield {"job_name": "recorded", "step_count": n, "step_start_time": t / sec}
            t += int(step_ns * rng.uniform(0.95, 1.05))
            if n % state["ckpt_every"] == 0:
                yield {"event_type": "save", "step": n,
                       "checkpoint_manager_blocking_start_time": t / sec,
                       "checkpoint_manager_blocking_duration_secs": 2.0,
                       "wait_for_prev_start_time": t / sec}
                t += 2 * sec
                done = n
            if n % state["eval_every"] == 0:
                yield {"job_name": "recorded", "custom_badput_event_type": "eval",
                       "custom_badput_event_start_time": t / sec}
                t += 5 * sec
                yield {"job_name": "recorded", "custom_badput_event_type": "eval",
                       "custom_badput_event_end_time": t / sec}
        if attempt < len(kill_at):
            t += 60 * sec
        else:
            yield {"job_name": "recorded", "job_end_time": t / sec}


def write_import(out_dir: str, steps: int, restarts: int, shape: str, env=None) -> dict:
    """The import-shaped spool of the job: :func:`mgm_payloads` written as JSON lines, then
    ``goodput import --from mgm`` of them into ``out_dir`` (one plain ``*.jsonl`` per
    attempt, 512 spans a line, the resource on every line); the payloads file is removed.
    Returns ``{"seconds": wall time of the import, "run_dir": the job's directory}``.

    Raises:
        subprocess.CalledProcessError: the import failed.
    """
    import orjson

    os.makedirs(out_dir, exist_ok=True)
    src = os.path.join(out_dir, "mgm-payloads.jsonl")
    with open(src, "wb") as f:
        for p in mgm_payloads(steps, restarts, shape):
            f.write(orjson.dumps(p) + b"\n")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "goodput_processor.cli", "import", src, "--from",
                    "mgm", "--to", out_dir, "--format", "json"], check=True,
                   capture_output=True, env=env)
    seconds = time.perf_counter() - t0
    os.remove(src)
    (job,) = [p for p in Path(out_dir).iterdir() if p.is_dir()]
    return {"seconds": seconds, "run_dir": str(job)}


def measure(run_dir: str, definitions: str, cache: bool = False,
            with_cpu: bool = False) -> tuple:
    """(wall seconds, peak RSS in MB) of one `goodput report --format json` process
    (``--no-cache`` unless ``cache``); ``with_cpu``: (wall s, peak MB, CPU s: user + system
    of the process and its children)."""
    cmd = [sys.executable, "-m", "goodput_processor.cli", "report", run_dir, "--format",
           "json", "--definitions", definitions] + ([] if cache else ["--no-cache"])
    # (started by a small process of its own: see _TIMED)
    proc = subprocess.run([sys.executable, "-c", _TIMED, *cmd], capture_output=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"report failed: {proc.stderr.decode()}")
    wall, maxrss_kb, cpu = proc.stdout.split()
    if with_cpu:  # (Linux wait4: the process and the children it waited for)
        return float(wall), int(maxrss_kb) / 1024, float(cpu)
    return float(wall), int(maxrss_kb) / 1024


#: Run argv[1:] with its output to /dev/null and print "wall_s maxrss_kb cpu_s" of it
#: (``wait4``: the process and the children it waited for); exit with its status. A fresh
#: interpreter, so that the report's peak is its own (see the module docstring).
_TIMED = """if True:
    import os, subprocess, sys, time
    t0 = time.perf_counter()
    p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    sys.stderr.buffer.write(err)
    print(wall, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)
    sys.exit(os.waitstatus_to_exitcode(status))
"""


def _summary(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """(median wall seconds, largest peak MB) of ``measure`` results."""
    return statistics.median(r[0] for r in runs), max(r[1] for r in runs)


def spool_sizes(run_dir: str) -> dict:
    """Bytes on disk by kind of file, and the spans a reader reads (window roots included)."""
    from goodput_processor.read.reader import span_files

    files = [p for p in Path(run_dir).iterdir() if p.is_file()]
    out = {"files": len(files), "total": sum(p.stat().st_size for p in files),
           "journal": sum(p.stat().st_size for p in files if p.name.endswith(".jsonl")),
           "compacted": sum(p.stat().st_size for p in files if p.name.endswith(".jsonl.gz")),
           "spans": 0, "lines_bytes": 0}
    import gzip

    for p in span_files(Path(run_dir)):
        with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as f:
            while chunk := f.read(1 << 24):
                out["lines_bytes"] += len(chunk)
                out["spans"] += chunk.count(b'"name":"goodput.')
    return out


def orjson_parse_s(run_dir: str) -> float:
    """CPU seconds (``time.process_time``, this one thread: one core) of ``orjson.loads``
    of every line of the span files a report reads (``span_files``: ``*.jsonl`` and the
    decompressed ``*.jsonl.gz``), each file's bytes read and decompressed untimed first:
    issue 40's yardstick for the report ("within 2x of an orjson parse of the spool")."""
    import gc
    import gzip

    import orjson

    from goodput_processor.read.reader import span_files

    cpu = 0.0
    gc.disable()
    try:
        for p in span_files(Path(run_dir)):
            with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as f:
                data = f.read()
            t = time.process_time()
            for line in data.splitlines():
                if line:
                    try:
                        orjson.loads(line)
                    except orjson.JSONDecodeError:
                        pass  # a torn last line
            cpu += time.process_time() - t
            del data
    finally:
        gc.enable()
    return cpu


def _megatron_file(path: str, steps: int) -> None:
    """A Collector file exporter's OTLP JSON of a Megatron-LM job with NeMo Lens: ``steps``
    ``megatron.train.iteration`` spans of 100 ms (one a step, 512 a line), on the resource of
    the real run in ``tests/data/sources/megatron/otlp.jsonl``."""
    data = ROOT / "tests" / "data" / "sources" / "megatron" / "otlp.jsonl"
    with open(data) as f:
        res = json.loads(f.readline())["resourceSpans"][0]["resource"]
    t0 = 1_700_000_000 * 10**9
    with open(path, "w") as f:
        for lo in range(0, steps, 512):
            spans = [{"traceId": "02" * 16, "spanId": f"{n + 1:016x}",
                      "parentSpanId": f"{1 << 62:016x}", "name": "megatron.train.iteration",
                      "kind": 1, "startTimeUnixNano": str(t0 + n * 100_000_000),
                      "endTimeUnixNano": str(t0 + n * 100_000_000 + 95_000_000),
                      "attributes": [
                          {"key": "is_goodput_span", "value": {"boolValue": True}},
                          {"key": "megatron.iteration", "value": {"intValue": str(n)}},
                          {"key": "megatron.skipped", "value": {"boolValue": False}}]}
                     for n in range(lo, min(steps, lo + 512))]
            f.write(json.dumps({"resourceSpans": [{"resource": res, "scopeSpans": [
                {"scope": {"name": "nemo.lens"}, "spans": spans}]}]}) + "\n")


def _stages(path: str, spans: int) -> str:
    """CPU per span of each stage of reading a foreign OTLP JSON file as ``goodput report``
    does (:func:`goodput_processor.read.foreign.translate_into`), in this process: the
    lines, the template scan of their text (``read.foreign_template.scan``), the rest of
    the translation (the lines' skeletons parsed, the translator, the ``Emitter``) and the
    rows; and, for comparison, an orjson parse of every line (what the scan replaces)."""
    from goodput_processor.importers.sources import get_source, translate_files
    from goodput_processor.importers.sources.driver import _lines, _loads, _open, no_gc
    from goodput_processor.read.emitted import ingest_emitted
    from goodput_processor.read.foreign_template import scan
    from goodput_processor.read.reader import _Reader

    def cpu(f):
        t = time.process_time()
        out = f()
        return (time.process_time() - t) / spans * 1e6, out

    with no_gc():
        with _open(path) as f:
            lines, _ = cpu(lambda: sum(1 for _ in _lines(f)))
        with _open(path) as f:
            parse, _ = cpu(lambda: sum(1 for body, _ in _lines(f) if _loads(body)))
        src = get_source("megatron")
        names = src.translator.template_names
        with _open(path) as f:
            scanned, _ = cpu(lambda: sum(1 for body, _ in _lines(f) if scan(body, names)))
        total, run = cpu(lambda: translate_files(src, [path], batches=True, scan=scan))
        reader = _Reader()
        rows, _ = cpu(lambda: [ingest_emitted(reader, b, ("bench",))
                               for b in run.resource_spans])
    return (f"lines {lines:.2f} us, template scan {scanned - lines:.2f} us, skeleton parse + "
            f"translator + Emitter {total - scanned:.2f} us, rows {rows:.2f} us (an orjson "
            f"parse of the lines instead of the scan: {parse - lines:.2f} us)")


def compare_source(args) -> int:
    """``--source megatron``: ``goodput report`` of a directory of a foreign producer's OTLP
    JSON (translated on the way in) against the report of the same spans written in this
    project's schema (``goodput import`` of that file), side by side, interleaved; then the
    CPU per span of each stage of reading the file (:func:`_stages`)."""
    sys.path.insert(0, str(ROOT / "collectors"))
    from goodput_processor.importers.sources import get_source, translate_files, write_spool

    if args.source != "megatron":
        print(f"--source {args.source}: this benchmark knows megatron")
        return 2
    print(f"{'steps':>9} {'defs':>12} {'own s':>7} {'own MB':>7} {'source s':>9} "
          f"{'source MB':>9} {'ratio':>6} {'own CPU':>8} {'src CPU':>8} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for steps in args.steps:
            foreign = os.path.join(tmp, f"collector-{steps}")
            os.makedirs(foreign)
            _megatron_file(os.path.join(foreign, "traces.json"), steps)
            own = os.path.join(tmp, f"own-{steps}")
            run = translate_files(get_source("megatron"), [os.path.join(foreign,
                                                                        "traces.json")])
            (job,) = write_spool(run.resource_spans, own).values()
            old = time.time() - 60  # a finished run: the cache is written
            for d in (job["run_dir"], foreign):
                for p in Path(d).iterdir():
                    os.utime(p, (old, old))
            for defs in ("goodput", "mgm"):
                for cached in (False, True):
                    a, b = [], []
                    for _ in range(args.repeat):
                        for d, out in ((job["run_dir"], a), (foreign, b)):
                            if cached:  # written by a first report, then read
                                shutil.rmtree(os.path.join(d, ".goodput-cache"),
                                              ignore_errors=True)
                                measure(d, defs, cache=True)
                            out.append(measure(d, defs, cache=cached, with_cpu=True))
                    (wa, pa), (wb, pb) = _summary(a), _summary(b)
                    ca, cb = (statistics.median(r[2] for r in x) for x in (a, b))
                    what = f"{defs}{' 2nd' if cached else ''}"
                    print(f"{steps:>9,} {what:>12} {wa:>7.2f} {pa:>7.0f} {wb:>9.2f} "
                          f"{pb:>9.0f} {wb / wa:>6.2f} {ca:>8.2f} {cb:>8.2f} {cb / ca:>6.2f}",
                          flush=True)
            print(f"{steps:>9,} where a first report's reading of the file goes, CPU per span: "
                  f"{_stages(os.path.join(foreign, 'traces.json'), steps)}", flush=True)
    print("own: goodput report of the spool goodput import writes of the file; source: "
          "goodput report of the file's directory (translated on the way in); 2nd: a report "
          "that reads the columnar cache a first one wrote; wall seconds (median), peak "
          "MB (max) and CPU seconds (median; the report and its reader workers)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="compare a source's report with the own schema's on "
                    "the same spans (megatron); see compare_source")
    ap.add_argument("--steps", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--baseline-src", help="another checkout's src/ (today's recorder)")
    ap.add_argument("--repeat", type=int, default=1, help="reports per spool and definition")
    ap.add_argument("--keep", help="record into this directory and keep the spools; a "
                    "spool already there (from an earlier run) is reused, not recorded again "
                    "(rec s: nan)")
    ap.add_argument("--spools", nargs="+", choices=("recorder", "import"),
                    default=["recorder"], help="recorder: the real recorder's spool of the "
                    "job; import: the spool `goodput import` writes of ml-goodput-measurement's "
                    "entries of the same job (mgm_payloads); both: side by side")
    recorded_job.add_job_options(ap)  # --restarts R [R ...], --shape (not with --source)
    args = ap.parse_args(argv)
    if args.source:
        return compare_source(args)
    here = os.pathsep.join([str(ROOT / "src"), str(ROOT / "collectors")])
    recorders = {"this": here} if "recorder" in args.spools else {}
    if "import" in args.spools:
        recorders["import"] = here
    if args.baseline_src:
        recorders["baseline"] = os.pathsep.join([args.baseline_src, str(ROOT / "collectors")])
    print(f"{'recorder':<9} {'steps':>9} {'spans read':>11} {'files':>6} {'spool MB':>9} "
          f"{'journal':>8} {'compact':>8} {'read MB':>8} {'rec s':>6} {'defs':>8} "
          f"{'report s':>9} {'peak MB':>8} {'+cache s':>9} {'+cache MB':>9} {'2nd s':>6} "
          f"{'2nd MB':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or tmp
        for steps, restarts in ((n, r) for n in args.steps for r in args.restarts):
            for name, path in recorders.items():
                d = os.path.join(base, f"{name}-"
                                 f"{recorded_job.job_name(steps, restarts, args.shape)}")
                env = {**os.environ, "PYTHONPATH": path}
                if args.keep and os.path.isfile(d + _DONE):
                    info = {**json.loads(Path(d + _DONE).read_text()),
                            "seconds": float("nan")}  # reused
                    d = info.get("run_dir", d)
                elif name == "import":
                    info = write_import(d, steps, restarts, args.shape, env=env)
                    Path(d + _DONE).write_text(json.dumps(info))
                    d = info["run_dir"]
                else:
                    info = recorded_job.write_job(d, steps, restarts, env=env,
                                                  shape=args.shape)
                    Path(d + _DONE).write_text(json.dumps(info))
                s = spool_sizes(d)
                parse = orjson_parse_s(d)
                reports = {}
                for defs in ("goodput", "mgm"):
                    runs = [measure(d, defs, with_cpu=True) for _ in range(args.repeat)]
                    wall, peak = _summary(runs)
                    reports[defs] = (wall, statistics.median(r[2] for r in runs))
                    old = time.time() - 60
                    for p in Path(d).iterdir():
                        if p.is_file():
                            os.utime(p, (old, old))
                    first = []
                    for _ in range(args.repeat):  # reads the spool, writes the cache
                        shutil.rmtree(os.path.join(d, ".goodput-cache"), ignore_errors=True)
                        first.append(measure(d, defs, cache=True))
                    wall1, peak1 = _summary(first)
                    wall2, peak2 = _summary([measure(d, defs, cache=True)
                                             for _ in range(args.repeat)])
                    print(f"{name:<9} {steps:>9,} {s['spans']:>11,} {s['files']:>6} "
                          f"{s['total'] / 1e6:>9.1f} {s['journal'] / 1e6:>8.1f} "
                          f"{s['compacted'] / 1e6:>8.1f} {s['lines_bytes'] / 1e6:>8.1f} "
                          f"{info['seconds']:>6.1f} {defs:>8} {wall:>9.2f} {peak:>8.0f} "
                          f"{wall1:>9.2f} {peak1:>9.0f} {wall2:>6.2f} {peak2:>7.0f}", flush=True)
                tmps = [p.name for p in Path(d).iterdir() if p.name.endswith(".tmp")]
                print(f"  {name} {steps:,} steps, {restarts} restarts ({args.shape}): orjson "
                      f"parse of the {s['lines_bytes'] / 1e6:.1f} MB read, one core: "
                      f"{parse:.2f} s CPU; report --no-cache wall, CPU / parse: " + ", ".join(
                          f"{k} {w / parse:.2f}x, {c / parse:.2f}x"
                          for k, (w, c) in reports.items())
                      + f"; *.tmp files left after the reports: {len(tmps)}", flush=True)
    print("spool MB: every file on disk; journal: *.jsonl (plain); compact: *.jsonl.gz; "
          "read MB: the OTLP JSON a report parses (decompressed); report: --no-cache; "
          "+cache: the first report with the cache (writes it); 2nd: reads it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
