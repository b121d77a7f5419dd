"""`goodput import` wall time, entries/s and peak memory for 10^6-entry logs.

Two synthetic inputs:

- mgm: ml-goodput-measurement entries as Cloud Logging LogEntry objects (JSON lines, as a
  log sink writes them; ``--mgm-format array`` writes one pretty-printed JSON array as
  ``gcloud logging read --format=json`` does, ``payload`` bare payloads as mgm's local
  cache). Per step: data_loading start/end and step_start; 4 restarts (job start, TPU init,
  training prep, an Orbax restore), an Orbax save every 1,000 steps, an ``eval`` custom
  badput every 5,000 steps.
- resiliency: an event log of 256 nodes: 40 attempts (each node logs job_started, 2% of
  them twice, and job_terminated, with jittered times) and checkpoint_saved events of node
  0 making up the rest of the 10^6 lines, a checkpoint_loaded per attempt.

Each import runs as its own OS process (``python -m goodput_processor.cli import ...``),
then ``goodput report`` on the result; peak memory is the process's maximum resident set
size (``wait4``).

    python benchmarks/bench_import.py [--entries 1000000] [--mgm-format lines|array|payload]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

T0 = datetime(2025, 9, 27, 4, 0, tzinfo=timezone.utc).timestamp()
JOB = "bench-job"


def _logentry(payload: dict, i: int) -> dict:
    # The LogEntry timestamp is the write time (a little after the payload time).
    t = next(v for k, v in payload.items() if k.endswith("_time"))
    ts = datetime.fromtimestamp(t + 0.0005, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"insertId": f"{i:012x}", "jsonPayload": payload, "logName":
            "projects/p/logs/goodput_bench-job", "resource": {"type": "global", "labels":
            {"project_id": "p"}}, "severity": "INFO", "timestamp": ts,
            "receiveTimestamp": ts}


def mgm_payloads(n: int):
    """About ``n`` mgm payloads: steps with data loading, restarts, saves, evals."""
    restarts = 4
    steps_total = n // 3
    per_attempt = steps_total // (restarts + 1)
    t, step, count = T0, 0, 0
    for attempt in range(restarts + 1):
        yield {"job_name": JOB, "job_start_time": t}
        yield {"job_name": JOB, "tpu_init_start_time": t + 1}
        yield {"job_name": JOB, "tpu_init_end_time": t + 11}
        yield {"job_name": JOB, "training_prep_start_time": t + 11}
        yield {"job_name": JOB, "training_prep_end_time": t + 31}
        t += 31
        if attempt:
            yield {"event_type": "restore", "step": step, "checkpoint_manager_start_time": t,
                   "checkpoint_manager_duration_secs": 8.0}
            t += 8
        count += 6
        for _ in range(per_attempt):
            yield {"job_name": JOB, "data_loading_start_time": t}
            yield {"job_name": JOB, "data_loading_end_time": t + 0.01}
            yield {"job_name": JOB, "step_count": step, "step_start_time": t + 0.01}
            t += 0.5 + random.random() * 0.01
            count += 3
            if step % 1000 == 999:
                yield {"event_type": "save", "step": step + 1,
                       "checkpoint_manager_blocking_start_time": t,
                       "checkpoint_manager_blocking_duration_secs": 2.0,
                       "wait_for_prev_start_time": t}
                t += 2
                count += 1
            if step % 5000 == 4999:
                yield {"job_name": JOB, "custom_badput_event_type": "eval",
                       "custom_badput_event_start_time": t}
                yield {"job_name": JOB, "custom_badput_event_type": "eval",
                       "custom_badput_event_end_time": t + 30}
                t += 30
                count += 2
            step += 1
        if attempt < restarts:
            step = (step // 1000) * 1000  # crash: resume from the last save
            t += 120
        else:
            yield {"job_name": JOB, "job_end_time": t}


def write_mgm(path: str, n: int, fmt: str) -> int:
    rows = 0
    with open(path, "w", encoding="utf-8") as f:
        if fmt == "array":
            f.write("[\n")
        for i, p in enumerate(mgm_payloads(n)):
            if fmt == "payload":
                f.write(json.dumps(p) + "\n")
            elif fmt == "lines":
                f.write(json.dumps(_logentry(p, i)) + "\n")
            else:
                f.write((",\n" if i else "") + json.dumps(_logentry(p, i), indent=2))
            rows += 1
        if fmt == "array":
            f.write("\n]\n")
    return rows


def write_resiliency(path: str, n: int, nodes: int = 256, attempts: int = 40) -> int:
    rng = random.Random(7)
    lifecycle = attempts * nodes * 2.02
    saves = max(1, int((n - lifecycle - attempts) // attempts))
    t = datetime(2025, 9, 27, 4, 0)
    rows = 0
    step = 0

    def line(when, event, **kw):
        nonlocal rows
        rows += 1
        extra = "".join(f', "{k}": {v}' for k, v in kw.items())
        return (f'{{"timestamp": "{when.isoformat(timespec="microseconds")}", "job_name": '
                f'"{JOB}", "event_type": "{event}"{extra}}}\n')

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(attempts):
            for node in range(nodes):
                f.write(line(t + timedelta(seconds=rng.random() * 5), "job_started",
                             node_rank=node))
                if rng.random() < 0.02:
                    f.write(line(t + timedelta(seconds=5 + rng.random()), "job_started",
                                 node_rank=node))
            t += timedelta(seconds=30)
            f.write(line(t, "checkpoint_loaded", step=step))
            for _ in range(saves):
                t += timedelta(seconds=1.3 + rng.random() * 0.1)
                step += 500
                f.write(line(t, "checkpoint_saved", step=step))
            t += timedelta(seconds=10)
            step -= 500  # the work after the last save is lost
            for node in range(nodes):
                f.write(line(t + timedelta(seconds=rng.random() * 3), "job_terminated",
                             node_rank=node))
            t += timedelta(seconds=60)
    return rows


def run(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024, out.decode()


def bench(name: str, path: str, rows: int, out: str) -> None:
    py = [sys.executable, "-m", "goodput_processor.cli"]
    wall, rss, text = run([*py, "import", path, "--to", out, "--format", "json"])
    summary = json.loads(text)
    (job,) = summary["jobs"].values()
    size = os.path.getsize(path) / 2**20
    rwall, rrss, _ = run([*py, "report", job["run_dir"], "--format", "json"])
    print(f"{name:<22} {rows:>10,} {size:>8.0f} {wall:>9.2f} {rows / wall:>10,.0f} "
          f"{rss:>8.0f} {job['spans']:>10,} {rwall:>9.2f} {rrss:>8.0f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--mgm-format", choices=("lines", "array", "payload"), default="lines")
    ap.add_argument("--only", choices=("mgm", "resiliency"), default=None)
    args = ap.parse_args(argv)
    random.seed(1)
    print(f"{'input':<22} {'entries':>10} {'MB':>8} {'import s':>9} {'entries/s':>10} "
          f"{'peak MB':>8} {'spans':>10} {'report s':>9} {'peak MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "mgm"):
            path = os.path.join(tmp, f"mgm.{'json' if args.mgm_format == 'array' else 'jsonl'}")
            rows = write_mgm(path, args.entries, args.mgm_format)
            bench(f"mgm ({args.mgm_format})", path, rows, os.path.join(tmp, "out-mgm"))
        if args.only in (None, "resiliency"):
            path = os.path.join(tmp, "resiliency.log")
            rows = write_resiliency(path, args.entries)
            bench("resiliency (256 nodes)", path, rows, os.path.join(tmp, "out-res"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
