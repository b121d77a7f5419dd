"""Shared by the two diagnostics examples: options, how to trigger on-demand capture, the end."""

from __future__ import annotations

import argparse
import glob
import os


def parse_args(argv, *, doc: str, framework: str, lr: float) -> argparse.Namespace:
    """The examples' options; ``framework`` ("jax", "torch") names the default run."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--run-dir", default=f"runs/diag-{framework}", help="goodput run directory")
    p.add_argument("--name", default=f"{framework}-digits-diag", help="run (and job) name")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--metrics-every", type=int, default=10, help="metrics.record every N steps")
    p.add_argument("--profile-at", type=int, default=20, help="first profiled step (0: none)")
    p.add_argument("--profile-steps", type=int, default=5, help="steps in the profile")
    p.add_argument("--on-demand", action="store_true",
                   help="enable on-demand capture (SIGUSR2, HTTP on GOODPUT_PROFILE_PORT/9012)")
    p.add_argument("--step-sleep", type=float, default=0.005,
                   help="extra seconds per step, so that the tiny steps are measurable")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.metrics_every < 1 or args.profile_steps < 1:
        p.error("--steps, --metrics-every and --profile-steps must be >= 1")
    return args


def print_on_demand(enabled: bool) -> None:
    """How to trigger an on-demand capture of this process."""
    if not enabled:
        return
    from goodput.diagnostics import ondemand

    h = ondemand.current()
    if h is None:
        print("on-demand capture is not enabled (see the log)", flush=True)
        return
    print(f"on-demand capture: kill -USR2 {h.pid}", flush=True)
    if h.port is not None:
        print(f"  or: curl -X POST 'http://127.0.0.1:{h.port}/profile?duration_s=5'",
              flush=True)


def finish(run, run_dir: str) -> int:
    """End the run and print where things went and the goodput report."""

    import goodput
    from goodput import schema

    run.end()
    goodput.job_end()
    files = sorted(glob.glob(os.path.join(run_dir, "*.jsonl")))
    prefix = schema.METRICS_SPOOL_PREFIX
    metric_files = [f for f in files if os.path.basename(f).startswith(prefix)]
    print(f"metrics (OTLP JSON lines): {', '.join(metric_files) or 'none'}")
    print(f"spans (OTLP JSON lines):   {', '.join(f for f in files if f not in metric_files)}")
    try:
        from goodput_processor.account.run_dir import report_run_dir
        from goodput_processor.results.table import render_table
    except ImportError:
        print(f"goodput report {run_dir}   (goodput_processor is not installed here)")
        return 0
    results = report_run_dir(run_dir)
    render_table(results)
    for job in results:
        print(f"custom:profile badput: {job.badput_s.get('custom:profile', 0.0):.3f} s "
              f"of {job.total_time_s:.3f} s")
    return 0
