"""Crash a real training job with SIGKILL, restart it, and compare goodput's report with the truth.

The driver runs ``examples/pytorch_digits/train.py`` (a small PyTorch job) in a
fresh run directory, waits until it has saved a couple of checkpoints and made
some progress past the last one, kills it with SIGKILL (no clean shutdown, no end
marker: the worst case for the accounting), waits a restart delay, and starts it
again; the second attempt resumes from the last checkpoint and finishes. Then it
prints ``goodput report`` for the run and a table comparing the report with
what the driver itself measured:

- true infrastructure recovery = restart time - kill time
- true wasted progress = kill time - mtime of the last checkpoint written before the kill

The ground truth is also written as JSON (``ground_truth.json`` next to the run
directory, or ``--truth-file``) so a test can check the report against it.

Run from the repository root::

    python examples/crash_restart.py                      # package pip-installed
    PYTHONPATH=src:collectors python examples/crash_restart.py   # from a checkout

POSIX only (SIGKILL).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "pytorch_digits" / "train.py"
REPO = HERE.parent

STEP_RE = re.compile(r"^step (\d+) loss ")
SAVED_RE = re.compile(r"^checkpoint saved step (\d+)")
CKPT_RE = re.compile(r"^ckpt-(\d{8})\.pt$")

# Settings in the environment that would change what the children record
# (another job name, a fixed attempt number, a rank, extra exporters).
_JOB_ENV = (
    "TORCHELASTIC_RESTART_COUNT",
    "RANK",
    "WORLD_SIZE",
    "JAX_PROCESS_ID",
    "JAX_NUM_PROCESSES",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where runs/, checkpoints/ and ground_truth.json go (default: a new temp dir)",
    )
    p.add_argument("--job-name", default="digits-crash")
    p.add_argument(
        "--truth-file", type=Path, default=None, help="default: RUN_DIR/../ground_truth.json"
    )
    p.add_argument("--steps", type=int, default=300, help="final step of the training")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--step-sleep", type=float, default=0.03, help="extra seconds per step")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--flush-interval", type=float, default=1.0,
                   help="goodput flush interval (s; default 1, the recorder's default)")
    p.add_argument(
        "--min-checkpoints", type=int, default=2, help="checkpoints saved before the kill"
    )
    p.add_argument(
        "--kill-at-step",
        type=int,
        default=None,
        help="kill at the first progress line at or after this step, once --min-checkpoints "
        "checkpoints are saved (default: 80%% of the way from the last of those to the next)",
    )
    p.add_argument(
        "--restart-delay", type=float, default=3.0, help="seconds between kill and restart"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    args = p.parse_args(argv)
    if args.kill_at_step is None:
        past = max(args.log_every, (4 * args.ckpt_every // 5) // args.log_every * args.log_every)
        args.kill_at_step = args.min_checkpoints * args.ckpt_every + past
    if args.kill_at_step >= args.steps:
        p.error(f"--kill-at-step {args.kill_at_step} must be below --steps {args.steps}")
    return args


def child_env() -> dict[str, str]:
    """The children's environment: no stray goodput/OpenTelemetry settings.

    If the package is not importable (neither installed nor on PYTHONPATH), the
    checkout's ``src`` and ``collectors`` are put on the children's PYTHONPATH.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GOODPUT_", "OTEL_")) and k not in _JOB_ENV
    }
    env["PYTHONUNBUFFERED"] = "1"
    if not _importable("goodput", "goodput_processor"):
        paths = [str(REPO / "src"), str(REPO / "collectors")]
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _importable(*names: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in names)


class Child:
    """A training process whose output lines are read by a thread (so reads can time out)."""

    def __init__(self, cmd: list[str], env: dict[str, str], label: str):
        self.label = label
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def stop(self) -> None:
        """Kill the process if it is still running (on errors and timeouts)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def lines(self, deadline: float) -> Iterator[str]:
        """Yield output lines (echoed) until EOF; raise TimeoutError past ``deadline``."""
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{self.label}: no output before the deadline") from None
            if line is None:
                return
            print(f"  [{self.label}] {line}", flush=True)
            yield line


def train_cmd(args: argparse.Namespace, run_dir: Path, ckpt_dir: Path) -> list[str]:
    """The command line of one attempt of the training job."""
    return [
        sys.executable,
        str(TRAIN),
        "--run-dir", str(run_dir),
        "--ckpt-dir", str(ckpt_dir),
        "--job-name", args.job_name,
        "--steps", str(args.steps),
        "--ckpt-every", str(args.ckpt_every),
        "--eval-every", str(args.eval_every),
        "--step-sleep", str(args.step_sleep),
        "--log-every", str(args.log_every),
        "--flush-interval", str(args.flush_interval),
    ]  # fmt: skip


def last_checkpoint(ckpt_dir: Path) -> tuple[int, float]:
    """``(step, mtime)`` of the newest complete checkpoint file in ``ckpt_dir``."""
    found = [
        (int(m.group(1)), p.stat().st_mtime)
        for p in ckpt_dir.iterdir()
        if (m := CKPT_RE.match(p.name))
    ]
    if not found:
        raise RuntimeError(f"no checkpoint in {ckpt_dir}")
    return max(found)


def run_report(run_dir: Path, *options: str) -> str:
    """Run ``goodput report RUN_DIR [OPTIONS]`` and return its standard output."""
    cmd = [sys.executable, "-m", "goodput_processor.cli", "report", str(run_dir), *options]
    res = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=False)
    if res.returncode != 0:
        sys.stderr.write(res.stdout + res.stderr)
        raise SystemExit(f"goodput report failed with exit status {res.returncode}")
    return res.stdout


def crash_and_restart(args: argparse.Namespace) -> dict:
    """Run, kill, restart and finish the training job; return the ground truth."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goodput-crash-restart-"))
    run_dir = (workdir / "runs" / args.job_name).resolve()
    ckpt_dir = (workdir / "checkpoints" / args.job_name).resolve()
    for d in (run_dir, ckpt_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    env = child_env()
    cmd = train_cmd(args, run_dir, ckpt_dir)
    deadline = time.monotonic() + args.timeout
    print(f"run dir:         {run_dir}\ncheckpoint dir:  {ckpt_dir}", flush=True)

    children: list[Child] = []
    try:
        return _run_attempts(args, cmd, env, run_dir, ckpt_dir, deadline, children)
    finally:
        for child in children:
            child.stop()


def _run_attempts(
    args: argparse.Namespace,
    cmd: list[str],
    env: dict[str, str],
    run_dir: Path,
    ckpt_dir: Path,
    deadline: float,
    children: list[Child],
) -> dict:
    """The two attempts of :func:`crash_and_restart`; started children go to ``children``."""
    # Attempt 0: run until enough checkpoints and progress, then SIGKILL.
    launch_time = time.time()
    first = Child(cmd, env, "attempt 0")
    children.append(first)
    saved: list[int] = []
    kill_step = None
    for line in first.lines(deadline):
        if m := SAVED_RE.match(line):
            saved.append(int(m.group(1)))
        elif (m := STEP_RE.match(line)) and len(saved) >= args.min_checkpoints:
            if int(m.group(1)) >= args.kill_at_step:
                kill_step = int(m.group(1))
                break
    if kill_step is None:
        raise SystemExit("the training ended before the kill point; check --kill-at-step")
    kill_time = time.time()
    os.kill(first.proc.pid, signal.SIGKILL)
    for _ in first.lines(deadline):  # drain what it printed before dying
        pass
    first.proc.wait()
    print(f"killed attempt 0 (SIGKILL) after step {kill_step}", flush=True)
    ckpt_step, ckpt_mtime = last_checkpoint(ckpt_dir)

    # Attempt 1: restart after a delay; it resumes from the last checkpoint.
    time.sleep(args.restart_delay)
    restart_time = time.time()
    second = Child(cmd, env, "attempt 1")
    children.append(second)
    for _ in second.lines(deadline):
        pass
    status = second.proc.wait()
    exit_time = time.time()
    if status != 0:
        raise SystemExit(f"the restarted training failed with exit status {status}")

    return {
        "job": args.job_name,
        "run_dir": str(run_dir),
        "ckpt_dir": str(ckpt_dir),
        "flush_interval_s": args.flush_interval,
        "final_step": args.steps,
        "kill_step": kill_step,
        "last_checkpoint_step": ckpt_step,
        "launch_time": launch_time,
        "last_checkpoint_mtime": ckpt_mtime,
        "kill_time": kill_time,
        "restart_time": restart_time,
        "exit_time": exit_time,
        "infrastructure_recovery_s": restart_time - kill_time,
        "wasted_progress_s": kill_time - ckpt_mtime,
        # An upper bound: each attempt starts after its Popen call and ends
        # (job_end at interpreter exit) a little before the driver sees the exit.
        "total_time_upper_s": exit_time - launch_time,
    }


def print_truth(truth: dict) -> None:
    """Print the ground-truth table (times in seconds since the first launch)."""
    t0 = truth["launch_time"]
    ckpt = f"last checkpoint before the kill (step {truth['last_checkpoint_step']}), mtime"
    rows = [
        ("first launch", 0.0),
        (ckpt, truth["last_checkpoint_mtime"] - t0),
        (f"kill (SIGKILL, after step {truth['kill_step']})", truth["kill_time"] - t0),
        ("restart", truth["restart_time"] - t0),
        ("second attempt exited", truth["exit_time"] - t0),
        ("true infrastructure recovery = restart - kill", truth["infrastructure_recovery_s"]),
        ("true wasted progress = kill - checkpoint mtime", truth["wasted_progress_s"]),
    ]
    print("\nground truth (seconds since the first launch)")
    for name, value in rows:
        print(f"  {name:<56} {value:>8.3f}")


def print_comparison(truth: dict, report: dict) -> None:
    """Print the report's wasted progress and recovery next to the truth."""
    jobs = [j for j in report.get("jobs", []) if j.get("job") == truth["job"]]
    if not jobs:
        print(f"\nthe report has no job named {truth['job']!r}")
        return
    job = jobs[0]
    badput = job.get("badput_s", {})
    print("\nreport vs truth (seconds)")
    print(f"  {'bucket':<26} {'truth':>8} {'report':>8} {'diff':>8}")
    for bucket in ("wasted_progress", "infrastructure_recovery"):
        true = truth[f"{bucket}_s"]
        got = badput.get(bucket, 0.0)
        print(f"  {bucket:<26} {true:>8.3f} {got:>8.3f} {got - true:>+8.3f}")
    print(
        "  (the end of the killed attempt is its last record, which reached the OS before the\n"
        "   kill (the spool tail): wasted progress reads low and infrastructure recovery high\n"
        "   by the time from that record to the kill, at most a step; whatever the flush\n"
        f"   interval, {truth['flush_interval_s']} s here)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the crash-and-restart experiment; returns the exit status."""
    args = parse_args(argv)
    truth = crash_and_restart(args)
    truth_file = args.truth_file or Path(truth["run_dir"]).parent / "ground_truth.json"
    truth_file.parent.mkdir(parents=True, exist_ok=True)
    truth_file.write_text(json.dumps(truth, indent=2) + "\n")
    print_truth(truth)
    print(f"  written to {truth_file}")

    print(f"\n$ goodput report {truth['run_dir']}", flush=True)
    print(run_report(Path(truth["run_dir"])).rstrip("\n"), flush=True)
    print_comparison(truth, json.loads(run_report(Path(truth["run_dir"]), "--format", "json")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
