"""The JSON form of the report: :class:`~goodput_processor.results.job.JobResult` to a dict
and to text.

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
from collections.abc import Iterable

from .job import JobResult

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library works
    _orjson = None

__all__ = ["REPORT_SCHEMA", "dumps", "job_to_dict", "to_json", "to_json_dict"]

#: Value of the ``schema`` key of the JSON report.
REPORT_SCHEMA = "goodput.report/1"


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
