"""SIGKILL the JAX + Orbax digits job, restart it, and compare goodput's report with the truth.

The driver runs ``examples/jax_orbax/train.py`` (goodput recorded by
``goodput.instrument()``, or by ``opentelemetry-instrument`` with
``--launcher otel``, or by phase API markers with ``--marks manual``) in a fresh
run directory, waits until it has saved ``--min-checkpoints`` checkpoints and
made some progress past the last one, kills it with SIGKILL (no clean shutdown,
no end marker), waits ``--restart-delay`` seconds and starts it again; the
second attempt restores the latest committed Orbax checkpoint and finishes.
Then it prints ``goodput report`` and compares it with what the driver measured
itself:

- true infrastructure recovery = restart time - kill time
- true wasted progress = kill time - the moment the blocking part of the save
  of the checkpoint the restart resumed from returned (the job prints
  ``checkpoint saved step N`` right then; the driver notes when it reads it)

The ground truth is also written as JSON (``WORKDIR/runs/ground_truth.json`` or
``--truth-file``) for ``tests/instrumentation/test_instr_jax.py``. Run from the repository root
(POSIX only)::

    python examples/jax_orbax/crash_restart.py
    python examples/jax_orbax/crash_restart.py --launcher otel   # opentelemetry-instrument
    python examples/jax_orbax/crash_restart.py --workdir /tmp/jax-demo --marks manual
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
REPO = HERE.parents[1]

# The PyTorch driver's helpers (child process with a line reader, report runner).
_spec = importlib.util.spec_from_file_location("goodput_example_crash_restart",
                                               HERE.parent / "crash_restart.py")
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

STEP_RE = re.compile(r"^step (\d+) loss ")
SAVED_RE = re.compile(r"^checkpoint saved step (\d+)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=None,
                   help="where runs/, checkpoints/ and ground_truth.json go (default: a temp dir)")
    p.add_argument("--job-name", default="jax-digits-crash")
    p.add_argument("--truth-file", type=Path, default=None)
    p.add_argument("--launcher", choices=("python", "otel"), default="python",
                   help="otel: run the job under opentelemetry-instrument with --marks none")
    p.add_argument("--marks", choices=("auto", "manual"), default="auto",
                   help="with --launcher python: goodput.instrument() or phase API markers")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=40)
    p.add_argument("--step-sleep", type=float, default=0.03)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--flush-interval", type=float, default=0.5, help="goodput flush interval (s)")
    p.add_argument("--min-checkpoints", type=int, default=2)
    p.add_argument("--kill-at-step", type=int, default=None,
                   help="default: 80%% of the way from the last of the --min-checkpoints "
                   "checkpoints to the next")
    p.add_argument("--restart-delay", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    if args.kill_at_step is None:
        past = max(args.log_every, (4 * args.ckpt_every // 5) // args.log_every * args.log_every)
        args.kill_at_step = args.min_checkpoints * args.ckpt_every + past
    if args.kill_at_step >= args.steps:
        p.error(f"--kill-at-step {args.kill_at_step} must be below --steps {args.steps}")
    return args


def child_env(args: argparse.Namespace, run_dir: Path) -> dict[str, str]:
    """The children's environment: goodput settings for this run, the checkout importable."""
    env = base.child_env()
    if importlib.util.find_spec("goodput_instrumentation") is None:
        extra = [str(REPO / "src"), str(REPO / "collectors"), str(REPO / "instrumentation")]
        env["PYTHONPATH"] = os.pathsep.join(extra + [env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
    env.update(GOODPUT_RUN_DIR=str(run_dir), GOODPUT_JOB_NAME=args.job_name,
               GOODPUT_FLUSH_INTERVAL_S=str(args.flush_interval))
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def train_cmd(args: argparse.Namespace, ckpt_dir: Path) -> list[str]:
    """The command line of one attempt of the training job."""
    opts = ["--ckpt-dir", str(ckpt_dir), "--steps", str(args.steps),
            "--ckpt-every", str(args.ckpt_every), "--step-sleep", str(args.step_sleep),
            "--log-every", str(args.log_every)]
    if args.launcher == "otel":
        launcher = Path(sys.executable).with_name("opentelemetry-instrument")
        exe = str(launcher) if launcher.exists() else shutil.which("opentelemetry-instrument")
        if exe is None:
            raise SystemExit("opentelemetry-instrument not found (pip install "
                             "opentelemetry-instrumentation)")
        return [exe, sys.executable, str(TRAIN), *opts, "--marks", "none"]
    return [sys.executable, str(TRAIN), *opts, "--marks", args.marks]


def committed_steps(ckpt_dir: Path) -> list[int]:
    """Steps of the committed Orbax checkpoints (a killed async write leaves a tmp dir)."""
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.is_dir() and p.name.isdigit())


def crash_and_restart(args: argparse.Namespace) -> dict:
    """Run, kill, restart and finish the training job; return the ground truth."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goodput-jax-crash-"))
    run_dir = (workdir / "runs" / args.job_name).resolve()
    ckpt_dir = (workdir / "checkpoints" / args.job_name).resolve()
    for d in (run_dir, ckpt_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    env = child_env(args, run_dir)
    cmd = train_cmd(args, ckpt_dir)
    deadline = time.monotonic() + args.timeout
    print(f"run dir:         {run_dir}\ncheckpoint dir:  {ckpt_dir}", flush=True)
    children: list = []
    try:
        # Attempt 0: run until enough checkpoints and progress, then SIGKILL.
        launch_time = time.time()
        first = base.Child(cmd, env, "attempt 0")
        children.append(first)
        saved: dict[int, float] = {}
        kill_step = None
        for line in first.lines(deadline):
            if m := SAVED_RE.match(line):
                saved[int(m.group(1))] = time.time()
            elif (m := STEP_RE.match(line)) and len(saved) >= args.min_checkpoints \
                    and int(m.group(1)) >= args.kill_at_step:
                kill_step = int(m.group(1))
                break
        if kill_step is None:
            raise SystemExit("the training ended before the kill point; check --kill-at-step")
        kill_time = time.time()
        os.kill(first.proc.pid, signal.SIGKILL)
        for _ in first.lines(deadline):
            pass
        first.proc.wait()
        print(f"killed attempt 0 (SIGKILL) after step {kill_step}", flush=True)
        steps = committed_steps(ckpt_dir)
        if not steps:
            raise SystemExit("no committed checkpoint before the kill")
        ckpt_step = steps[-1]

        # Attempt 1: restart after a delay; it restores ckpt_step and finishes.
        time.sleep(args.restart_delay)
        restart_time = time.time()
        second = base.Child(cmd, env, "attempt 1")
        children.append(second)
        for _ in second.lines(deadline):
            pass
        status = second.proc.wait()
        exit_time = time.time()
        if status != 0:
            raise SystemExit(f"the restarted training failed with exit status {status}")
    finally:
        for child in children:
            child.stop()
    return {
        "job": args.job_name,
        "run_dir": str(run_dir),
        "ckpt_dir": str(ckpt_dir),
        "launcher": args.launcher,
        "marks": "none" if args.launcher == "otel" else args.marks,
        "flush_interval_s": args.flush_interval,
        "final_step": args.steps,
        "kill_step": kill_step,
        "last_checkpoint_step": ckpt_step,
        "launch_time": launch_time,
        "last_checkpoint_saved_time": saved[ckpt_step],
        "kill_time": kill_time,
        "restart_time": restart_time,
        "exit_time": exit_time,
        "infrastructure_recovery_s": restart_time - kill_time,
        "wasted_progress_s": kill_time - saved[ckpt_step],
        "total_time_upper_s": exit_time - launch_time,
    }


def print_truth(truth: dict) -> None:
    """Print the ground-truth table (times in seconds since the first launch)."""
    t0 = truth["launch_time"]
    rows = [
        ("first launch", 0.0),
        (f"blocking save of step {truth['last_checkpoint_step']} returned",
         truth["last_checkpoint_saved_time"] - t0),
        (f"kill (SIGKILL, after step {truth['kill_step']})", truth["kill_time"] - t0),
        ("restart", truth["restart_time"] - t0),
        ("second attempt exited", truth["exit_time"] - t0),
        ("true infrastructure recovery = restart - kill", truth["infrastructure_recovery_s"]),
        ("true wasted progress = kill - end of that save", truth["wasted_progress_s"]),
    ]
    print("\nground truth (seconds since the first launch)")
    for name, value in rows:
        print(f"  {name:<56} {value:>8.3f}")


def print_comparison(truth: dict, job: dict) -> None:
    """Print the report's figures next to the truth."""
    badput = job["badput_s"]
    print("\nreport vs truth (seconds)")
    print(f"  {'bucket':<26} {'truth':>8} {'report':>8} {'diff':>8}")
    for bucket in ("wasted_progress", "infrastructure_recovery"):
        true, got = truth[f"{bucket}_s"], badput.get(bucket, 0.0)
        print(f"  {bucket:<26} {true:>8.3f} {got:>8.3f} {got - true:>+8.3f}")
    resume = job["attempts"][-1]["resume_step"]
    print(f"  resume step: report {resume}, last committed checkpoint "
          f"{truth['last_checkpoint_step']}")
    print(f"  program_startup {badput['program_startup']:.3f} s, checkpoint_save (blocking) "
          f"{badput['checkpoint_save']:.3f} s, checkpoint_restore "
          f"{badput['checkpoint_restore']:.3f} s, asynchronous checkpoint writes "
          f"{job['async_work_s'].get('checkpoint_save', 0.0):.3f} s")
    print("  (a killed attempt ends at its last record, which reached the OS before the kill\n"
          "   (the spool tail): wasted progress reads low and infrastructure recovery high by\n"
          "   the time from that record to the kill, at most a step; whatever the flush\n"
          f"   interval, {truth['flush_interval_s']} s here)")


def main(argv: list[str] | None = None) -> int:
    """Run the crash-and-restart experiment; returns the exit status."""
    args = parse_args(argv)
    truth = crash_and_restart(args)
    truth_file = args.truth_file or Path(truth["run_dir"]).parent / "ground_truth.json"
    truth_file.parent.mkdir(parents=True, exist_ok=True)
    truth_file.write_text(json.dumps(truth, indent=2) + "\n")
    print_truth(truth)
    print(f"  written to {truth_file}")
    run_dir = Path(truth["run_dir"])
    print(f"\n$ goodput report {run_dir}", flush=True)
    print(base.run_report(run_dir).rstrip("\n"), flush=True)
    report = json.loads(base.run_report(run_dir, "--format", "json"))
    jobs = [j for j in report["jobs"] if j["job"] == truth["job"]]
    if jobs:
        print_comparison(truth, jobs[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
