"""The terminal table of the report (``goodput report``'s default form), and durations as
people read them (:func:`format_duration`).

Needs ``rich`` (a dependency), imported when a table is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from goodput import schema

from ..terminal import make_console
from .job import JobResult

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["format_duration", "render_job", "render_table"]


def format_duration(seconds: float | None) -> str:
    """Human-readable duration: ``"1h 02m 03s"``, ``"2m 03s"``, ``"3.21 s"``, ``"3.00 ms"``."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    sign, s = ("-", -seconds) if seconds < 0 else ("", seconds)
    if s >= 60:
        whole = int(round(s))
        d, rem = divmod(whole, 86400)
        h, rem = divmod(rem, 3600)
        m, sec = divmod(rem, 60)
        if d:
            return f"{sign}{d}d {h:02d}h {m:02d}m {sec:02d}s"
        if h:
            return f"{sign}{h}h {m:02d}m {sec:02d}s"
        return f"{sign}{m}m {sec:02d}s"
    if s >= 1 or s == 0:
        return f"{sign}{s:.2f} s"
    if s >= 1e-3:
        return f"{sign}{s * 1e3:.2f} ms"
    return f"{sign}{s * 1e6:.1f} µs"


def _seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if abs(x) >= 1 or x == 0 else f"{x:.6f}"


def _render_stragglers(s, console) -> None:
    if s is None:
        return
    console.print(f"stragglers: {s.hosts} hosts, median step time "
                  f"{format_duration(s.median_step_time_s)}; slowest:", markup=False)
    for h in s.slowest:
        lag = ("" if h.median_start_lag_s is None
               else f", starts {format_duration(h.median_start_lag_s)} after the median")
        console.print(f"  {h.host or '-'} (process {h.process}): {h.ratio:.2f}x, "
                      f"{format_duration(h.median_step_time_s)} over {h.steps} steps{lag}",
                      markup=False, highlight=False)


def _or_others(f) -> str:
    """``; or process 2, 3`` when the first failure is uncertain among several."""
    among = f.uncertain_among
    return f"; or process {', '.join(map(str, among))}" if among else ""


def _render_recovery(r: JobResult, console) -> None:
    for x in r.recovery:
        f = x.first_failure
        parts = ", ".join(f"{x.label(k)} {'unknown' if v is None else format_duration(v)}"
                          for k, v in x.phases.items())
        who = ("no process showed a failure (each recorded only its start)"
               if f.process is None else
               f"process {f.process}{'' if f.host is None else ' on ' + f.host} failed first "
               f"({f.how}{', inferred' if f.evidence == 'inferred' else ''}{_or_others(f)})")
        console.print(f"recovery after attempt {x.attempt}: {who}; "
                      f"{parts}; lost {format_duration(x.lost_s)}", markup=False,
                      highlight=False)
    if r.host_badput:
        console.print("top hosts by badput caused (observed):", markup=False)
        for h in r.host_badput:
            console.print(f"  {h.host or '-'} (process {h.process}): "
                          f"{format_duration(h.badput_s)} (slowdown "
                          f"{format_duration(h.slowdown_s)}, disruptions "
                          f"{h.disruptions_caused})", markup=False, highlight=False)
    if r.host_badput_inferred:
        console.print("inferred, not ranked above (the process fell silent first; nothing "
                      "recorded says it failed):", markup=False)
        for h in r.host_badput_inferred:
            console.print(f"  {h.host or '-'} (process {h.process}): "
                          f"{format_duration(h.badput_s)} (disruptions "
                          f"{h.disruptions_caused}, inferred)", markup=False, highlight=False)
    c = r.badput_charged
    if c and (r.host_badput or r.host_badput_inferred):
        console.print(f"  badput charged to no host: {format_duration(c['unattributed_ns'] / 1e9)}"
                      f" of {format_duration(c['total_badput_ns'] / 1e9)}", markup=False,
                      highlight=False)
    if r.slowdown_unattributed_s > 0:
        console.print(f"  training slowdown not attributed to a host: "
                      f"{format_duration(r.slowdown_unattributed_s)} (a step slow on every "
                      "host alike, or no goodput.collective_wait recorded to tell which "
                      "host arrived last)", markup=False, highlight=False)


def _bucket_rows(r: JobResult):
    yield schema.PRODUCTIVE, r.productive_time_s
    yield from r.badput_s.items()


def render_job(r: JobResult, console: Console) -> None:
    """Print one job's report to ``console`` (a ``rich.console.Console``)."""
    from rich.table import Table
    from rich.text import Text

    if r.error is not None:
        console.print(f"Job {r.job}   FAILED: {r.error}", style="bold red", markup=False,
                      highlight=False)
        return
    total = r.total_time_s
    head = Text()
    head.append(f"Job {r.job}", style="bold")
    head.append(f"   total {format_duration(total)}")
    head.append(f"   goodput {r.goodput * 100:.2f} %", style="bold green")
    console.print(head)

    buckets = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    buckets.add_column("bucket")
    buckets.add_column("seconds", justify="right")
    buckets.add_column("duration", justify="right")
    buckets.add_column("%", justify="right")
    for name, sec in _bucket_rows(r):
        pct = 100 * sec / total if total else 0.0
        style = "green" if name == schema.PRODUCTIVE else ("dim" if sec == 0 else None)
        buckets.add_row(Text(name), _seconds(sec), format_duration(sec), f"{pct:.2f}", style=style)
    buckets.add_row("total", _seconds(total), format_duration(total), "100.00" if total else "0.00",
                    style="bold")
    console.print(buckets)

    ideal = "-"
    if r.ideal_step_time_s is not None:
        ideal = f"{_seconds(r.ideal_step_time_s)} s ({r.ideal_step_time_source})"
    st = r.step_time
    console.print(
        f"disruptions: {r.disruptions}   max productive step: "
        f"{'-' if r.max_productive_step is None else r.max_productive_step}",
        markup=False,
    )
    console.print(f"ideal step time: {ideal}", markup=False)
    if r.run.get(schema.RES_RUN_NAME):
        group = r.run.get(schema.RES_RUN_GROUP)
        console.print(f"ML run: {r.run[schema.RES_RUN_NAME]}"
                      + (f" (group {group})" if group else ""), markup=False)
    if r.mfu is not None:
        console.print(
            f"MFU in productive time: {r.mfu * 100:.2f} %   useful compute (goodput x MFU): "
            f"{r.useful_compute * 100:.2f} % of the job's peak FLOP/s",
            style="bold", markup=False,
        )
    console.print(
        f"step time of {st.count} kept steps: p50 {format_duration(st.p50_s)}, "
        f"p90 {format_duration(st.p90_s)}, p99 {format_duration(st.p99_s)}, "
        f"max {format_duration(st.max_s)}",
        markup=False,
    )
    if r.noise_tolerance_s is not None and r.ideal_step_time_s is not None:
        console.print(
            f"anomalous steps: {st.anomalous_steps} (step time > ideal + "
            f"{format_duration(r.noise_tolerance_s)})",
            markup=False,
        )
    _render_stragglers(r.stragglers, console)  # --- stragglers
    _render_recovery(r, console)  # --- recovery, attribution
    if r.slice_efficiency is not None:
        console.print(f"slice efficiency: stepping {r.slice_efficiency.stepping * 100:.2f} %, "
                      f"available {r.slice_efficiency.available * 100:.2f} %", markup=False)
    if r.excluded_time_s:
        console.print(f"excluded: {format_duration(r.excluded_time_s)} (not in the total)",
                      markup=False)

    attempts = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("attempt", "start", "duration", "end", "procs", "hosts", "resume",
                "kept", "wasted"):
        attempts.add_column(col, justify="left" if col in ("end", "hosts") else "right")
    for a in r.attempts:
        hosts = ",".join(a.hosts)
        attempts.add_row(
            str(a.attempt),
            "+" + format_duration((a.start_ns - r.start_ns) / 1e9),
            format_duration(a.duration_s),
            Text(a.end_reason + (" (cut)" if a.cut else "")),
            str(a.processes) + ("" if a.declared_processes is None else f"/{a.declared_processes}"),
            Text(hosts if len(hosts) <= 24 else hosts[:21] + "..."),
            "-" if a.resume_step is None else str(a.resume_step),
            str(a.steps_kept),
            str(a.steps_wasted),
        )
    console.print(attempts)

    if r.async_work_s:
        work = ", ".join(f"{k} {format_duration(v)}" for k, v in r.async_work_s.items())
        console.print(f"asynchronous work (not badput): {work}", markup=False)
    skipped = {k: v for k, v in r.skipped.items() if v}
    console.print(
        "skipped records: "
        + (", ".join(f"{k} {v}" for k, v in skipped.items()) if skipped else "none"),
        style="yellow" if skipped else None,
        markup=False,
    )
    for ex in r.skipped_examples:
        console.print(f"  {ex}", style="dim", markup=False, highlight=False)
    for w in r.warnings:
        console.print(f"warning [{w.code}]: {w.message}", style="yellow", markup=False,
                      highlight=False)
    errors = sum(a.error_spans for a in r.attempts)
    console.print(
        f"recorder: errors {r.recorder_errors}, dropped {r.recorder_dropped}; "
        f"spans with error status: {errors}",
        style="yellow" if (r.recorder_errors or r.recorder_dropped) else None,
        markup=False,
    )


def render_table(results: Iterable[JobResult], console: Console | None = None) -> None:
    """Print every job's report (see :func:`render_job`) to ``console`` (default stdout)."""
    if console is None:
        console = make_console()
    for i, r in enumerate(results):
        if i:
            console.print()
        render_job(r, console)
