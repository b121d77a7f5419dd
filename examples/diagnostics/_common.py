"""Shared by the two diagnostics examples: how to trigger on-demand capture, and the end."""

from __future__ import annotations

import glob
import os


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
        from goodput_processor.accounting import report_run_dir
        from goodput_processor.report import render_table
    except ImportError:
        print(f"goodput report {run_dir}   (goodput_processor is not installed here)")
        return 0
    results = report_run_dir(run_dir)
    render_table(results)
    for job in results:
        print(f"custom:profile badput: {job.badput_s.get('custom:profile', 0.0):.3f} s "
              f"of {job.total_time_s:.3f} s")
    return 0
