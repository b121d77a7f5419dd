"""Regenerate the MaxText test data: ``maxtext-0.log`` (killed run) and ``maxtext-1.log``
(its restart), MaxText's training stdout as ``kubectl logs --timestamps`` shows it, with
``truth-0.jsonl``/``truth-1.jsonl``.

What runs for real: MaxText's own ``MetricLogger`` methods that make and defer the step
line (``buffer_and_write_metrics``, ``_flush_one_buffered_entry``, ``record_train_metrics``,
``write_metrics``, ``log_metrics``, ``_log_training_metrics``, ``_maybe_abort_after_write_
metrics``, ``flush_metrics_and_cleanup``), cut verbatim out of ``src/maxtext/common/
metric_logger.py`` of AI-Hypercomputer/maxtext at e591f30cbbf217ed67ef71263ec0538239f9c3b8
(2026-08-22), and ``print_save_message`` and the restore lines of ``src/maxtext/common/
checkpointing.py``; ``max_logging`` is MaxText's (absl ``logging.info``), so the lines have
absl's ``I1207 14:00:00.123456 pid file:line]`` prefix. CPU shims (MaxText needs JAX and
TPU/GPU set-up to import): ``jax.process_index() -> 0``, ``elastic_utils.elastic_enabled
-> False``, a config object with the attributes those methods read, and the training loop
of ``train.py`` (``train_step``) re-told in a few lines: the step's compute is a sleep
(about 0.2 s, the first 1.5 s for compilation), ``step_time_delta`` and
``last_step_completion`` are taken exactly as there, then the checkpoint save (every 10
steps, synchronous, 0.6 s), then ``buffer_and_write_metrics``.

The driver SIGKILLs the first run once step 23 has completed and starts it again; that run
restores step 20 and ends at step 39. Truth: each step's completion (``last_step_
completion``) and the saves, fsync'd by the training process.

Run (about 20 s): ``python tests/data/sources/maxtext-log/regenerate.py --maxtext-repo PATH``
(a git clone or mirror of AI-Hypercomputer/maxtext holding the commit); needs absl-py and
numpy (the main environment has both).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMIT = "e591f30cbbf217ed67ef71263ec0538239f9c3b8"
METHODS = ("buffer_and_write_metrics", "_flush_one_buffered_entry", "record_train_metrics",
           "write_metrics", "log_metrics", "_log_training_metrics",
           "_maybe_abort_after_write_metrics", "flush_metrics_and_cleanup")
KILL_AFTER = 23
LAST = 39
PERIOD = 10


def cut_out(repo: str, out: Path) -> None:
    """Write ``maxtext_pinned.py``: the pinned methods as class ``MetricLoggerPinned`` and
    ``print_save_message``, behind the shims."""
    def show(path):
        return subprocess.run(["git", "-C", repo, "show", f"{COMMIT}:{path}"], check=True,
                              capture_output=True, text=True).stdout

    src = show("src/maxtext/common/metric_logger.py")
    lines = src.splitlines()
    cls = next(n for n in ast.parse(src).body
               if isinstance(n, ast.ClassDef) and n.name == "MetricLogger")
    meths = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in METHODS]
    body = "\n".join("\n".join(lines[m.lineno - 1 - len(m.decorator_list):m.end_lineno])
                     for m in meths)
    enum_cls = next(n for n in ast.parse(src).body
                    if isinstance(n, ast.ClassDef) and n.name == "MetadataKey")
    ck = show("src/maxtext/common/checkpointing.py")
    psm = next(n for n in ast.parse(ck).body
               if isinstance(n, ast.FunctionDef) and n.name == "print_save_message")
    out.write_text(
        f"# Cut verbatim from AI-Hypercomputer/maxtext {COMMIT} (see regenerate.py)\n"
        "import enum, sys\nimport numpy as np\nfrom absl import logging\n\n"
        "class max_logging:  # src/maxtext/utils/max_logging.py: log()\n"
        "  @staticmethod\n  def log(user_str):\n    logging.info(user_str, stacklevel=2)\n\n"
        "class jax:  # shim\n  @staticmethod\n  def process_index():\n    return 0\n\n"
        "class max_utils:  # shim: no summary writer\n  @staticmethod\n"
        "  def close_summary_writer(writer):\n    pass\n\n"
        "class elastic_utils:  # shim\n  @staticmethod\n  def elastic_enabled(config):\n"
        "    return False\n\n"
        + "\n".join(src.splitlines()[enum_cls.lineno - 1:enum_cls.end_lineno]) + "\n\n"
        + "\n".join(ck.splitlines()[psm.lineno - 1:psm.end_lineno]) + "\n\n"
        "class MetricLoggerPinned:\n" + body + "\n")


def child(run: int, out: Path) -> None:
    """One MaxText training process (the shims above)."""
    import random

    from absl import logging as absl_logging
    sys.path.insert(0, str(out))
    import maxtext_pinned as mp

    absl_logging.use_absl_handler()
    absl_logging.set_verbosity(absl_logging.INFO)
    truth = open(out / f"truth-{run}.jsonl", "a")

    def note(kind, step, t=None):
        t = time.time_ns() if t is None else t
        truth.write(f'{{"kind": "{kind}", "step": {step}, "t": {t}}}\n')
        truth.flush()
        os.fsync(truth.fileno())

    class Config:
        rampup_end_step = 0
        hide_profiler_step_metric = False
        num_experts = 1
        mtp_num_layers = 0
        use_indexer = False
        enable_tensorboard = metrics_file = gcs_metrics = managed_mldiagnostics = False
        enable_wandb = abort_on_nan_loss = abort_on_inf_loss = False

    logger = mp.MetricLoggerPinned()
    logger.config = Config()
    logger.writer = None
    logger.metadata = {mp.MetadataKey.PER_DEVICE_TFLOPS: 120.0,
                       mp.MetadataKey.PER_DEVICE_TOKENS: 8192.0}
    logger.learning_rate_schedule = lambda step: 1e-4
    logger.performance_metric_queue = None
    logger.buffered_metrics = []
    logger._pending_eval_step_count = 0
    note("process_start", -1)
    rng = random.Random(run)
    time.sleep(2.0)                                  # imports, mesh, model set-up
    start_step = 0
    if run == 1:
        mp.max_logging.log("checkpoint manager exists so trying to load this run's "
                           "existing checkpoint")
        step = PERIOD * (KILL_AFTER // PERIOD)       # the last saved step
        t0 = time.time_ns()
        mp.max_logging.log(f"restoring from this run's directory step {step}")
        time.sleep(0.8)                              # the restore
        note("restore", step, t0)
        note("restored", step)
        start_step = step + 1
    last_step_completion = datetime.datetime.now()   # train.py: python_vars
    for step in range(start_step, LAST + 1):
        time.sleep(1.5 if step == start_step else 0.2 + rng.uniform(-0.02, 0.02))
        metrics = {"scalar": {"learning/loss": 10.0 - step * 0.1, "learning/total_weights": 8192}}
        step_time_delta = datetime.datetime.now() - last_step_completion
        last_step_completion = datetime.datetime.now()
        note("completed", step, int(last_step_completion.timestamp() * 1e9))
        if step % PERIOD == 0 and step > 0:          # checkpointing.maybe_save_checkpoint
            note("save", step)
            time.sleep(0.6)
            mp.print_save_message(step, False)
            note("saved", step)
        logger.buffer_and_write_metrics(metrics, step, step_time_delta)
        if run == 0 and step == KILL_AFTER:
            note("kill_me", step)
            time.sleep(30)
    logger.flush_metrics_and_cleanup()
    note("exit", LAST)


def _pump(proc, path: Path) -> None:
    with open(path, "w") as f:
        for line in proc.stdout:
            ns = time.time_ns()
            stamp = datetime.datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%S")
            f.write(f"{stamp}.{ns % 10**9:09d}Z {line.rstrip()}\n")
            f.flush()


def drive(work: Path, out: Path = HERE) -> None:
    for run in (0, 1):
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(run), "--work",
                                 str(work)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        pump = threading.Thread(target=_pump, args=(proc, out / f"maxtext-{run}.log"))
        pump.start()
        if run == 0:
            truth = work / "truth-0.jsonl"
            while proc.poll() is None and (not truth.exists()
                                           or '"kill_me"' not in truth.read_text()):
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            with open(truth, "a") as f:
                f.write(f'{{"kind": "kill", "step": -1, "t": {time.time_ns()}}}\n')
        proc.wait()
        pump.join()
        (out / f"truth-{run}.jsonl").write_text((work / f"truth-{run}.jsonl").read_text())
        time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--maxtext-repo")
    ap.add_argument("--child", type=int)
    ap.add_argument("--work")
    ap.add_argument("--out", default=str(HERE), help="where the files go (default: here)")
    a = ap.parse_args()
    if a.child is not None:
        child(a.child, Path(a.work))
        return
    with tempfile.TemporaryDirectory() as tmp:
        cut_out(a.maxtext_repo, Path(tmp) / "maxtext_pinned.py")
        drive(Path(tmp), Path(a.out))


if __name__ == "__main__":
    main()
