"""Helpers for tests/serve/test_serve.py: a training-like child process exporting OTLP + spool.

Run as a script: ``python tests/serve_util.py JOB RUN_DIR GRPC_ENDPOINT INDEX COUNT STEPS
[--hang]``. It records training prep, a restore (on attempts > 0), ``STEPS`` steps with
data loading and a checkpoint save, through a real ``goodput`` recorder whose extra
exporter is the real OTLP/gRPC exporter. With ``--hang`` it flushes, prints ``FLUSHED``
and sleeps (to be killed with SIGKILL); else it exits normally (the attempt ends ``exit``).
"""

from __future__ import annotations

import os
import sys
import time

import goodput


def train(job, run_dir, endpoint, index, count, steps, hang=False, exporter=None):
    """Record a small training run; see the module docstring."""
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    attempt = int(os.environ.get("GOODPUT_ATTEMPT", "0"))
    goodput.configure(job, run_dir=run_dir, process_index=index, process_count=count,
                      flush_interval_s=30, exporters=[exporter], handle_signals=False)
    with goodput.training_prep():
        time.sleep(0.01)
    first = 0
    if attempt:
        first = 5 * attempt
        with goodput.checkpoint_restore(step=first):
            time.sleep(0.01)
    for n in range(first, first + steps):
        with goodput.data_loading():
            time.sleep(0.001)
        with goodput.step(n):
            time.sleep(0.004 if n % 7 else 0.012)
        if n % 5 == 4:
            with goodput.checkpoint_save(step=n + 1):
                time.sleep(0.003)
    if hang:
        goodput.flush()
        print("FLUSHED", flush=True)
        time.sleep(600)
    goodput.shutdown()


if __name__ == "__main__":
    a = sys.argv[1:]
    train(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), hang="--hang" in a)
