"""Regenerate this folder's one-logger test data from a real run, SIGKILLed and restarted.

Pins (``venv.sh`` builds them): nv-one-logger-core, -otel, -training-telemetry,
-pytorch-lightning-integration 2.3.1; lightning 2.5.6; torch 2.13.0 (CPU) and
opentelemetry-sdk 1.45.2 from the main environment. CPU shims: none in one-logger; the
driver (``train_onelogger.py``) brackets Lightning's checkpoint restore through its private
``_CheckpointConnector.resume_start``/``resume_end`` (Lightning has no public hook there)
and each training step sleeps ``--step-s`` as a stand-in for compute.

The scenario: attempt 0 trains (checkpoint every 20 steps, validation every 25, one-logger's
``training_metrics_update`` every 5) and SIGKILLs itself at the end of step 67; attempt 1
resumes from the newest checkpoint (step 60) and trains to step 100. Both export through
one-logger's ``OTelExporter`` to ``spans.jsonl`` (OTLP JSON lines) or, with ``--endpoint``,
live over OTLP. The driver's fsync'd truth goes to ``truth.jsonl``.

``--ddp`` also makes ``ddp/``: a clean two-rank run (``torch.distributed.run
--nproc-per-node 2``, Lightning DDP over gloo on CPU, 20 steps, 500 ms batch delay), one
``spans-<rank>.jsonl`` per rank. Lightning re-seeds Python's ``random`` in each rank, which
the OTel SDK draws span ids from: one-logger's span ids repeat within a process there.

Usage::

    python tests/data/sources/onelogger/regenerate.py [--out-dir DIR] [--bsp-delay-ms 5000]
        [--python .venvs/onelogger/bin/python] [--endpoint URL [--http]] [--ddp]

Takes about 40 s on a 2-core machine (two interpreter starts, 100 steps of 0.1 s).
Exit status: 0 when the killed attempt died by SIGKILL and the second one finished.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "train_onelogger.py"
DEFAULT_PYTHON = os.environ.get("ONELOGGER_PYTHON", str(
    Path(__file__).resolve().parents[4] / ".venvs" / "onelogger" / "bin" / "python"))
JOB = "tiny-lightning"
SESSION = "session-1"
MAX_STEPS, CKPT_EVERY, VAL_EVERY, LOG_EVERY, STEP_S, KILL_AT = 100, 20, 25, 5, 0.1, 67


def run_scenario(out_dir: Path, *, python: str = DEFAULT_PYTHON, bsp_delay_ms: int = 5000,
                 endpoint: str | None = None, http: bool = False,
                 timeout_s: float = 300) -> dict:
    """Run the two attempts; returns ``{"spans": path | None, "truth": path,
    "returncodes": [rc0, rc1]}``.

    Raises:
        subprocess.TimeoutExpired: an attempt ran past ``timeout_s``.
        RuntimeError: the first attempt was not SIGKILLed or the second one failed
            (the message has the end of its output).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    spans, truth = out_dir / "spans.jsonl", out_dir / "truth.jsonl"
    for p in (spans, truth):
        if p.exists():
            p.unlink()
    env = dict(os.environ, OTEL_SERVICE_NAME=JOB, OTEL_BSP_SCHEDULE_DELAY=str(bsp_delay_ms),
               PYTHONHASHSEED="0")
    rcs = []
    with tempfile.TemporaryDirectory(prefix="onelogger-ckpt-") as ckpt:
        common = [python, str(DRIVER), "--truth", str(truth), "--ckpt-dir", ckpt,
                  "--session", SESSION, "--max-steps", str(MAX_STEPS),
                  "--ckpt-every", str(CKPT_EVERY), "--val-every", str(VAL_EVERY),
                  "--log-every", str(LOG_EVERY), "--step-s", str(STEP_S)]
        if endpoint:
            common += ["--endpoint", endpoint] + (["--http"] if http else [])
        else:
            common += ["--out", str(spans)]
        for attempt in (0, 1):
            extra = ["--kill-at-step", str(KILL_AT)] if attempt == 0 else []
            if attempt == 1:
                newest = max(Path(ckpt).glob("step=*.ckpt"),
                             key=lambda p: int(p.stem.split("=")[1]))
                extra = ["--resume", str(newest)]
            proc = subprocess.run(common + extra, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
            rcs.append(proc.returncode)
            want = -signal.SIGKILL if attempt == 0 else 0
            if proc.returncode != want:
                raise RuntimeError(f"attempt {attempt}: exit status {proc.returncode}, "
                                   f"wanted {want}:\n{proc.stderr[-3000:]}")
    return {"spans": None if endpoint else spans, "truth": truth, "returncodes": rcs}


def run_ddp(out_dir: Path, *, python: str = DEFAULT_PYTHON, bsp_delay_ms: int = 500,
            timeout_s: float = 300) -> dict:
    """A clean two-rank run (``torch.distributed.run``, Lightning DDP over gloo, 20 steps)
    into ``out_dir/spans-<rank>.jsonl`` and ``truth.jsonl``; returns their paths.

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout_s``.
        RuntimeError: it failed (the message has the end of its output).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in out_dir.glob("*.jsonl"):
        p.unlink()
    env = dict(os.environ, OTEL_SERVICE_NAME="ddp-lightning",
               OTEL_BSP_SCHEDULE_DELAY=str(bsp_delay_ms), PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory(prefix="onelogger-ckpt-") as ckpt:
        cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(DRIVER), "--out", str(out_dir / "spans-{rank}.jsonl"),
               "--truth", str(out_dir / "truth.jsonl"), "--ckpt-dir", ckpt,
               "--session", SESSION, "--max-steps", "20", "--ckpt-every", "10",
               "--val-every", "10", "--log-every", str(LOG_EVERY), "--step-s", "0.05"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"DDP run: exit status {proc.returncode}:\n{proc.stderr[-3000:]}")
    return {"spans": sorted(out_dir.glob("spans-*.jsonl")), "truth": out_dir / "truth.jsonl"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=HERE)
    ap.add_argument("--python", default=DEFAULT_PYTHON)
    ap.add_argument("--bsp-delay-ms", type=int, default=5000,
                    help="OTEL_BSP_SCHEDULE_DELAY of the runs (the SDK's default: 5000)")
    ap.add_argument("--endpoint")
    ap.add_argument("--http", action="store_true")
    ap.add_argument("--ddp", action="store_true",
                    help="also the two-rank run into OUT_DIR/ddp/ (500 ms batch delay)")
    a = ap.parse_args(argv)
    if a.ddp:
        got = run_ddp(a.out_dir / "ddp", python=a.python)
        print("ddp:", ", ".join(f"{p} ({p.stat().st_size} bytes)" for p in got["spans"]))
    got = run_scenario(a.out_dir, python=a.python, bsp_delay_ms=a.bsp_delay_ms,
                       endpoint=a.endpoint, http=a.http)
    for k in ("spans", "truth"):
        if got[k] is not None:
            print(f"{k}: {got[k]} ({got[k].stat().st_size} bytes)")
    print("exit statuses:", got["returncodes"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
