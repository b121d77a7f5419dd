"""The report: result data classes (:class:`JobResult`, ...) and their JSON and table forms.

JSON report (``goodput report RUN_DIR --format json``), schema ``goodput.report/1``.
Durations are float seconds, ``goodput`` is a fraction in [0, 1], absolute times are
integer ns since the Unix epoch; ``null`` marks an unknown value::

    {
      "schema": "goodput.report/1",
      "jobs": [                                  # sorted by job name
        {
          "job": str,                            # goodput.job.name (else service.name)
          "schema_version": str | null,          # goodput.schema.version(s) read
          "start_unix_ns": int, "end_unix_ns": int,
          "total_time_s": float,                 # first attempt start -> last attempt end
          "productive_time_s": float,
          "goodput": float,                      # productive / total, 0..1
          "badput_s": {bucket: float},           # every schema.BADPUT_BUCKETS name, plus
                                                 # "custom:<type>" after training_slowdown;
                                                 # productive + badput == total (exact
                                                 # in ns; floats may differ in last digit)
          "disruptions": int,                    # attempts - 1
          "max_productive_step": int | null,
          "ideal_step_time_s": float | null,
          "ideal_step_time_source": "given" | "estimated" | null,
          "noise_tolerance_s": float | null,     # step anomalous above ideal + this
          "step_time": {"count": int, "p50_s": float | null, "p90_s": float | null,
                        "p99_s": float | null, "max_s": float | null,
                        "anomalous_steps": int},  # over kept steps
          "attempts": [                          # ordered by start
            {"attempt": int,                     # found from evidence (accounting.md)
             "start_unix_ns": int, "end_unix_ns": int,
             "start_s": float,                   # offset from the job start
             "duration_s": float,
             "end_reason": str,                  # goodput.end.reason of the process seen
                                                 # last, "killed" or "running"
             "cut": bool,                        # end moved back to the next start
             "primary_process": int, "processes": int,  # ranks (identity marker or env)
             "declared_processes": int | null,   # goodput.process.count
             "hosts": [str], "resume_step": int | null,
             "steps_kept": int, "steps_wasted": int,
             "error_spans": int,                 # spans with status ERROR
             "recorder": {"errors": int, "dropped": int}}
          ],
          "async_work_s": {name: float},         # goodput.blocking=false spans of the
                                                 # primary processes, not badput; name is
                                                 # a bucket name ("checkpoint_save",
                                                 # "custom:<type>", ...) or "step"
          "skipped": {reason: int},              # records skipped, by reason: torn,
                                                 # malformed (lines), invalid_span, duplicate,
                                                 # unknown, unsupported_schema (spans); all
                                                 # six always present
          "skipped_examples": [str],             # up to 20 "file:line: reason"
          "recorder": {"errors": int, "dropped": int},  # goodput.recorder.errors /
                                                 # dropped: per process the largest value
                                                 # on job_end/heartbeat, summed
          "run": {attribute: str | int},         # ML run resource attributes (ml.run.name,
                                                 # ml.flops_per_step, ...); {} if none
          "mfu": float | null,                   # model FLOPs utilisation in productive
                                                 # time, 0..1 (needs ml.flops_per_step,
                                                 # ml.device.peak_flops, ml.device.count)
          "useful_compute": float | null,        # goodput x mfu
          "slice_efficiency": null | {           # elastic jobs (goodput.elastic_slices):
            "stepping": float,                   # time-weighted stepping / total slices
            "available": float},                 # and available / total slices, 0..1
          "excluded_time_s": float,              # report --exclude: seconds taken out of
                                                 # the total and the buckets (0 without)
          "stragglers": null | {                 # per-host step times (stragglers.py);
                                                 # null with fewer than 2 host processes
            "hosts": int,                        # host processes with kept steps
            "median_step_time_s": float,         # median over hosts of their median
            "max_ratio": float,                  # slowest host's median / that
            "slowest": [{"host": str | null, "process": int, "steps": int,
                         "median_step_time_s": float, "ratio": float,
                         "median_start_lag_s": float | null}]},  # up to 5, slowest first
          "recovery": [                          # per disruption (recovery.py)
            {"attempt": int, "next_attempt": int,   # the failed one, the one that took over
             "phases_s": {phase: float | null},  # detection, termination, rescheduling,
                                                 # startup, rendezvous_init, restore,
                                                 # recompilation_warmup; null = unknown
             "phase_labels": {phase: str},       # the name to show where not the key:
                                                 # rendezvous_init -> "initialization"
                                                 # when the next attempt had one process
             "first_failure": {"process": int | null,  # null: every process of the
                               "host": str | null,    # attempt recorded only its start
                               "how": "exception" | "signal" | "missing_heartbeat" | "end",
                               "at_unix_ns": int,
                               "uncertain_among": [int],  # others that may have failed
                                                          # first (first_failure_uncertain)
                               "evidence": "observed" | "inferred"},  # inferred: its last
                                                          # sign of life only
             "lost_s": float,                    # badput the disruption caused
             "lost_ns": int,                     # the same in ns
             "window_unix_ns": [int, int],       # the stretch it owns (no two overlap)
             "evidence": {key: float}}],         # launcher / pod times, when recorded
          "host_badput": [                       # top hosts by badput caused on observed
            {"host": str | null, "process": int, # evidence (attribution.py)
             "slowdown_s": float, "disruptions_caused": int, "badput_s": float,
             "badput_ns": int, "evidence": "observed"}],
          "host_badput_inferred": [...],         # the same, charged on a last sign of life
                                                 # only ("evidence": "inferred"), apart
          "slowdown_unattributed_s": float,      # training_slowdown no host explains
          "badput_charged": {"total_badput_ns": int,  # the job's badput = observed_ns +
                             "observed_ns": int,      # inferred_ns + unattributed_ns,
                             "inferred_ns": int,      # exactly, over all hosts
                             "unattributed_ns": int},
          "warnings": [{"code": str, "message": str,  # what the input could not settle
                        "attempt": int | null, "process": int | null,
                        "file": str | null}],
          "error": str | null  # why the job could not be accounted (then all is 0)
        }
      ]
    }
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from goodput import schema

from ..analysis.steptimes import StepArrays

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library works
    _orjson = None

if TYPE_CHECKING:
    from rich.console import Console

    from ..analysis.attribution import HostBadput
    from ..analysis.elastic import SliceEfficiency
    from ..analysis.recovery import Recovery
    from ..analysis.stragglers import StragglerReport

__all__ = ["REPORT_SCHEMA", "AttemptResult", "JobResult", "ReportWarning", "StepArrays",
           "StepTimeSummary", "format_duration", "job_to_dict", "render_table", "to_json",
           "to_json_dict"]

#: Value of the ``schema`` key of the JSON report.
REPORT_SCHEMA = "goodput.report/1"


@dataclass(frozen=True)
class ReportWarning:
    """Something the report's input could not settle or that looks wrong: the report
    carries it instead of guessing silently.

    ``code``: a stable name (listed in ``docs/accounting.md``, "Warnings"); ``message``: one
    line for people; ``attempt``/``process``/``file``: the attempt number, rank and spool
    file concerned, if any.
    """

    code: str
    message: str
    attempt: int | None = None
    process: int | None = None
    file: str | None = None


@dataclass(frozen=True)
class StepTimeSummary:
    """Step times of kept steps, in seconds (None when there are no kept steps)."""

    count: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    anomalous_steps: int


@dataclass(frozen=True)
class AttemptResult:
    """One attempt in the result; times in ns since the epoch, durations in seconds."""

    attempt: int
    start_ns: int
    end_ns: int
    duration_s: float
    end_reason: str
    cut: bool
    primary_process: int
    processes: int
    declared_processes: int | None
    hosts: tuple[str, ...]
    resume_step: int | None
    steps_kept: int
    steps_wasted: int
    error_spans: int
    recorder_errors: int
    recorder_dropped: int


@dataclass(frozen=True)
class JobResult:
    """Accounting result of one job.

    Seconds are floats converted from exact integer ns (``buckets_ns``); ``goodput`` is a
    fraction in [0, 1]. ``badput_s`` holds every bucket of ``schema.BADPUT_BUCKETS`` (0 if
    unused) plus ``custom:<type>`` buckets, in report order (custom after
    ``training_slowdown``). ``buckets_ns`` holds ``productive`` and every badput bucket
    in ns; they sum exactly to ``total_ns``. ``async_work_s``: seconds of
    ``goodput.blocking=false`` spans per bucket name (not badput). ``skipped``: counts
    of skipped records by reason, ``skipped_examples`` up to 20 "where: why" strings.
    ``run``: the ML run's resource attributes (``ml.run.name``, ``ml.flops_per_step``, ...;
    :data:`~goodput_processor.read.rows.RUN_ATTRIBUTES`). ``mfu``: model FLOPs utilisation
    during productive time, a fraction (None without FLOPs per step, peak FLOP/s and device
    count); ``useful_compute`` = ``goodput`` x ``mfu``, the share of the machine's peak
    over the whole job that went into kept training math (see ``docs/accounting.md``).
    """

    job: str
    start_ns: int
    end_ns: int
    total_ns: int
    total_time_s: float
    productive_time_s: float
    goodput: float
    badput_s: dict[str, float]
    buckets_ns: dict[str, int]
    disruptions: int
    max_productive_step: int | None
    ideal_step_time_s: float | None
    ideal_step_time_source: str | None
    noise_tolerance_s: float | None
    step_time: StepTimeSummary
    attempts: tuple[AttemptResult, ...]
    async_work_s: dict[str, float]
    skipped: dict[str, int]
    skipped_examples: tuple[str, ...]
    recorder_errors: int
    recorder_dropped: int
    schema_version: str | None
    steps: StepArrays = field(repr=False)
    run: dict = field(default_factory=dict)
    mfu: float | None = None
    useful_compute: float | None = None
    #: Per-host step times against the median host (:mod:`goodput_processor.analysis.stragglers`);
    #: None with < 2 hosts.
    stragglers: StragglerReport | None = None
    #: What the input could not settle (:class:`ReportWarning`), in attempt order.
    warnings: tuple[ReportWarning, ...] = ()
    #: Why the job could not be accounted (``goodput report`` and ``goodput serve``
    #: isolate such a job and report it with zero time and this message,
    #: :func:`~goodput_processor.account.accounting.isolated`); None when it was.
    error: str | None = None
    #: Stepping and available slice efficiency of an elastic job
    #: (:mod:`goodput_processor.analysis.elastic`); None
    #: without slice-count records.
    slice_efficiency: SliceEfficiency | None = None
    #: Seconds taken out of the total and the buckets by exclusion intervals
    #: (:func:`~goodput_processor.account.windows.account_excluding`); 0 without.
    excluded_time_s: float = 0.0
    #: One :class:`~goodput_processor.analysis.recovery.Recovery` per disruption (its phases, the
    #: process that failed first), in attempt order.
    recovery: tuple[Recovery, ...] = ()
    #: The hosts that caused the most badput on observed evidence
    #: (:class:`~goodput_processor.analysis.attribution.HostBadput`), most first, top N.
    host_badput: tuple[HostBadput, ...] = ()
    #: The hosts charged with disruptions on their last sign of life only (evidence
    #: ``inferred``), apart from those, most first, top N.
    host_badput_inferred: tuple[HostBadput, ...] = ()
    #: The job's badput and how it is charged, in integer ns over all host processes
    #: (:class:`~goodput_processor.analysis.attribution.HostCharges`): ``total_badput_ns`` =
    #: ``observed_ns`` + ``inferred_ns`` + ``unattributed_ns`` exactly; empty when not
    #: accounted.
    badput_charged: dict = field(default_factory=dict)
    #: Seconds of ``training_slowdown`` that no host's arrival at the step's end explains.
    slowdown_unattributed_s: float = 0.0
    #: Values past each of ``goodput serve``'s per-job limits, ``{limit: count}``
    #: (``custom_types``, ``attribute_bytes``); empty in ``goodput report``.
    over_limit: dict = field(default_factory=dict)


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


def _attempt_dict(a, job_start_ns: int) -> dict:
    return {
        "attempt": a.attempt,
        "start_unix_ns": a.start_ns,
        "end_unix_ns": a.end_ns,
        "start_s": (a.start_ns - job_start_ns) / 1e9,
        "duration_s": a.duration_s,
        "end_reason": a.end_reason,
        "cut": a.cut,
        "primary_process": a.primary_process,
        "processes": a.processes,
        "declared_processes": a.declared_processes,
        "hosts": list(a.hosts),
        "resume_step": a.resume_step,
        "steps_kept": a.steps_kept,
        "steps_wasted": a.steps_wasted,
        "error_spans": a.error_spans,
        "recorder": {"errors": a.recorder_errors, "dropped": a.recorder_dropped},
    }


def job_to_dict(r: JobResult) -> dict:
    """The JSON object of one job (see the module docstring)."""
    st = r.step_time
    return {
        "job": r.job,
        "schema_version": r.schema_version,
        "start_unix_ns": r.start_ns,
        "end_unix_ns": r.end_ns,
        "total_time_s": r.total_time_s,
        "productive_time_s": r.productive_time_s,
        "goodput": r.goodput,
        "badput_s": dict(r.badput_s),
        "disruptions": r.disruptions,
        "max_productive_step": r.max_productive_step,
        "ideal_step_time_s": r.ideal_step_time_s,
        "ideal_step_time_source": r.ideal_step_time_source,
        "noise_tolerance_s": r.noise_tolerance_s,
        "step_time": {
            "count": st.count,
            "p50_s": st.p50_s,
            "p90_s": st.p90_s,
            "p99_s": st.p99_s,
            "max_s": st.max_s,
            "anomalous_steps": st.anomalous_steps,
        },
        "attempts": [_attempt_dict(a, r.start_ns) for a in r.attempts],
        "async_work_s": dict(r.async_work_s),
        "skipped": dict(r.skipped),
        "skipped_examples": list(r.skipped_examples),
        "recorder": {"errors": r.recorder_errors, "dropped": r.recorder_dropped},
        "run": {k: v for k, v in r.run.items()},
        "mfu": r.mfu,
        "useful_compute": r.useful_compute,
        "slice_efficiency": (None if r.slice_efficiency is None
                             else r.slice_efficiency.to_json_dict()),
        "excluded_time_s": r.excluded_time_s,
        "stragglers": _stragglers_dict(r.stragglers),  # --- stragglers
        "recovery": [_recovery_dict(x) for x in r.recovery],  # --- recovery, attribution
        "host_badput": [_host_dict(h) for h in r.host_badput],
        "host_badput_inferred": [_host_dict(h) for h in r.host_badput_inferred],
        "slowdown_unattributed_s": r.slowdown_unattributed_s,
        "badput_charged": dict(r.badput_charged),
        "warnings": [{"code": w.code, "message": w.message, "attempt": w.attempt,
                      "process": w.process, "file": w.file} for w in r.warnings],
        "error": r.error,
    }


# --- stragglers (goodput_processor.analysis.stragglers) ------------------------------------------
def _stragglers_dict(s) -> dict | None:
    if s is None:
        return None
    return {
        "hosts": s.hosts,
        "median_step_time_s": s.median_step_time_s,
        "max_ratio": s.max_ratio,
        "slowest": [{"host": h.host, "process": h.process, "steps": h.steps,
                     "median_step_time_s": h.median_step_time_s, "ratio": h.ratio,
                     "median_start_lag_s": h.median_start_lag_s} for h in s.slowest],
    }


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
# --- end stragglers


# --- recovery phases and badput by host (goodput_processor.analysis.recovery, .attribution) -------
def _recovery_dict(x) -> dict:
    f = x.first_failure
    return {"attempt": x.attempt, "next_attempt": x.next_attempt, "phases_s": dict(x.phases),
            "phase_labels": dict(x.labels),
            "first_failure": {"process": f.process, "host": f.host, "how": f.how,
                              "at_unix_ns": f.at_ns,
                              "uncertain_among": list(f.uncertain_among),
                              "evidence": f.evidence},
            "lost_s": x.lost_s, "lost_ns": x.lost_ns, "window_unix_ns": list(x.window_ns),
            "evidence": dict(x.evidence)}


def _host_dict(h) -> dict:
    return {"host": h.host, "process": h.process, "slowdown_s": h.slowdown_s,
            "disruptions_caused": h.disruptions_caused, "badput_s": h.badput_s,
            "badput_ns": h.badput_ns, "evidence": h.evidence}


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
# --- end recovery


def to_json_dict(results: Iterable[JobResult]) -> dict:
    """The whole JSON report as a dict: ``{"schema": REPORT_SCHEMA, "jobs": [...]}``."""
    return {"schema": REPORT_SCHEMA, "jobs": [job_to_dict(r) for r in results]}


def dumps(doc, indent: int | None = 2) -> str:
    """``doc`` (JSON types only) as JSON text: through orjson when it can (ten times faster
    on a report with a million steps), else ``json.dumps(allow_nan=False)``. ``indent``: 2
    or None (compact). Floats are written in their shortest round-trip form either way.

    Raises:
        ValueError: ``doc`` holds NaN or infinity and orjson is not there.
    """
    if _orjson is not None and indent in (None, 2):
        try:
            return _orjson.dumps(doc, option=_orjson.OPT_INDENT_2 if indent else 0).decode()
        except TypeError:  # e.g. an int beyond 64 bits: the standard library writes it
            pass
    return json.dumps(doc, indent=indent, allow_nan=False)


def to_json(results: Iterable[JobResult], indent: int | None = 2) -> str:
    """The JSON report as a string (no trailing newline)."""
    return dumps(to_json_dict(results), indent)


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


def make_console():
    """A rich console on stdout; 120 columns when stdout is not a terminal (pipes, files)."""
    import sys

    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def render_table(results: Iterable[JobResult], console: Console | None = None) -> None:
    """Print every job's report (see :func:`render_job`) to ``console`` (default stdout)."""
    if console is None:
        console = make_console()
    for i, r in enumerate(results):
        if i:
            console.print()
        render_job(r, console)
