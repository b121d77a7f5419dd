"""Chaos for ``goodput serve``: SIGKILL it at random moments while real training processes
export to it over OTLP/gRPC; after the last restart its report must equal ``goodput report``
of the processes' own spools, span for span.

    python benchmarks/serve_chaos.py [--kills 20] [--procs 4] [--seed 1] [--keep DIR]

What runs (all real OS processes on loopback):

- ``goodput serve --grpc-port P --http-port Q --wal-dir WAL`` (fixed ports, so the
  exporters find it again after each restart);
- ``--procs`` training processes of one job (ranks 0..n-1 of one launch), each a real
  ``goodput`` recorder whose OTLP/gRPC exporter (``traces_exporter="otlp"``, the SDK's
  ``OTLPSpanExporter`` with its retries, fed from the spool by goodput's forwarder with
  its backoff) points at serve. They record data loading, steps and checkpoint saves
  until told to stop, then ``goodput.flush()`` and end;
- the driver SIGKILLs serve ``--kills`` times, each after a random 0.2-2.5 s from its
  start (during replay, mid-request, idle), and restarts it at once.

Then it compares, after the last restart: the set of span ids in serve's write-ahead log
with the set in the spools (span for span), and serve's final report of the job with
``goodput report`` of the spools (every field but the skip examples and the count of
duplicate spans, which retries after a kill legitimately raise). Exit status 1 on any
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = "chaos"

CHILD = textwrap.dedent("""
    import os, sys, time, goodput
    run, stop_file, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    goodput.configure("chaos", run_dir=run, process_index=rank, process_count=world,
                      flush_interval_s=0.2, traces_exporter="otlp")
    with goodput.training_prep():
        time.sleep(0.05)
    n = 0
    while not os.path.exists(stop_file):
        n += 1
        with goodput.data_loading():
            time.sleep(0.002)
        with goodput.step(n):
            time.sleep(0.02)
        if n % 25 == 0:
            with goodput.checkpoint_save(step=n):
                time.sleep(0.005)
    ok = goodput.flush(120)
    goodput.shutdown()
    print("STEPS", n, "FLUSHED", ok, flush=True)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOODPUT_", "OTEL_"))}
    paths = [str(REPO / "src"), str(REPO / "collectors"), str(REPO / "instrumentation")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class Serve:
    """``goodput serve`` as a subprocess on fixed ports, restartable."""

    def __init__(self, base: Path, grpc_port: int, http_port: int, wal: bool = True):
        self.base, self.grpc_port, self.http_port = base, grpc_port, http_port
        self.wal = str(base / "wal") if wal else "off"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        err = open(self.base / f"serve-{self.starts:02d}.err", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "goodput_processor.cli", "serve",
             "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
             "--wal-dir", self.wal, "--format", "json",
             "--report-file", str(self.base / "reports.jsonl"), "--shutdown-timeout", "20"],
            env=_env(), stdout=subprocess.DEVNULL, stderr=err, cwd=self.base)
        err.close()

    def wait_listening(self, timeout_s: float = 60) -> None:
        path, deadline = self.base / f"serve-{self.starts:02d}.err", time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "listening" in path.read_text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}: {path.read_text()}")
            time.sleep(0.05)
        raise RuntimeError("serve did not start listening in time")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def span_ids(files) -> set[tuple[str, str]]:
    """(traceId, spanId) of every goodput-scope span in OTLP JSON lines files."""
    out = set()
    for f in files:
        for line in Path(f).read_bytes().splitlines():
            try:
                req = json.loads(line)
            except ValueError:
                continue
            for rs in req.get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    if ss.get("scope", {}).get("name") == "goodput":
                        out.update((sp["traceId"], sp["spanId"]) for sp in ss["spans"])
    return out


def comparable(job: dict) -> dict:
    job = dict(job)
    job.pop("skipped_examples", None)
    job["skipped"] = {k: v for k, v in job["skipped"].items() if k != "duplicate"}
    return job


def run(kills: int = 20, procs: int = 4, seed: int = 1, base: Path | None = None,
        wal: bool = True) -> dict:
    """Run the chaos; returns a summary dict with ``ok`` and what differed. ``wal=False``
    runs serve with ``--wal-dir off``: the control, which loses what was acknowledged."""
    rng = random.Random(seed)
    base = Path(base or tempfile.mkdtemp(prefix="serve-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    run_dir, stop_file = base / "run", base / "stop"
    (base / "child.py").write_text(CHILD)
    serve = Serve(base, free_port(), free_port(), wal)
    endpoint = f"http://127.0.0.1:{serve.grpc_port}"
    t0 = time.monotonic()
    serve.start()
    serve.wait_listening()
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_INSECURE="true",
               OTEL_EXPORTER_OTLP_TIMEOUT="5", GOODPUT_EXPORT_BACKOFF_S="0.2",
               GOODPUT_EXPORT_BACKOFF_MAX_S="1")
    children = [subprocess.Popen([sys.executable, str(base / "child.py"), str(run_dir),
                                  str(stop_file), str(r), str(procs)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 cwd=base)
                for r in range(procs)]
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.2, 2.5))
            serve.kill()
            serve.start()
        serve.wait_listening()
        time.sleep(1.0)  # the exporters find it again and catch up
        stop_file.touch()
        outs = [c.communicate(timeout=240)[0] for c in children]
        serve.stop()
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
        if serve.proc and serve.proc.poll() is None:
            serve.proc.kill()
    wall = time.monotonic() - t0
    steps = [int(m.group(1)) for o in outs for m in [re.search(r"STEPS (\d+)", o)] if m]
    flushed = all("FLUSHED True" in o for o in outs)
    spool = span_ids(p for p in run_dir.glob("spans-*.jsonl"))
    logged = span_ids((base / "wal").rglob("seg-*.jsonl"))
    final = [json.loads(line) for line in (base / "reports.jsonl").read_text().splitlines()]
    live = next(j for j in final[-1]["jobs"] if j["job"] == JOB)
    proc = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report",
                           str(run_dir), "--format", "json"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    (reported,) = json.loads(proc.stdout)["jobs"]
    diff = sorted(k for k in comparable(live) if comparable(live)[k] != comparable(reported)[k])
    summary = {
        "wal": wal, "kills": kills, "serve_starts": serve.starts, "procs": procs, "steps": steps,
        "flushed": flushed, "wall_s": round(wall, 1), "spool_spans": len(spool),
        "wal_spans": len(logged), "missing_from_wal": len(spool - logged),
        "extra_in_wal": len(logged - spool), "report_fields_differing": diff,
        "duplicates_dropped": live["skipped"].get("duplicate", 0),
        "steps_reported": live["step_time"]["count"],
        "steps_in_spools": reported["step_time"]["count"],
        "goodput": live["goodput"], "base": str(base),
    }
    summary["ok"] = flushed and spool == logged and not diff and final[-1].get("final") is True
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", type=Path, default=None, help="work directory (kept)")
    p.add_argument("--no-wal", action="store_true",
                   help="the control: serve with --wal-dir off (loses acknowledged spans)")
    a = p.parse_args(argv)
    s = run(a.kills, a.procs, a.seed, a.keep, wal=not a.no_wal)
    for k, v in s.items():
        print(f"{k:26s} {v}")
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
