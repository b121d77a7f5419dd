"""Turn one job's spans into goodput buckets, exactly as ``docs/accounting.md`` says.

Everything is computed in integer nanoseconds on numpy ``int64`` arrays: each attempt's
primary-process spans are clipped to the attempt, the time line is cut at every span
boundary into elementary segments, and each segment is "painted" with the highest-priority
level that covers it (difference arrays + cumsum per level). Step time per step is the
step-level time inside it (``np.bincount``). Seconds (floats) appear only in the results.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np

from goodput import schema

from ..analysis.attribution import host_badput
from ..analysis.disruptions import job_wide, kept_recovery_report
from ..analysis.elastic import records_of, slice_efficiency
from ..analysis.step_arrays import StepArrays
from ..analysis.steptimes import step_stats
from ..analysis.stragglers import straggler_report
from ..model.attempts import Attempt, build_attempts
from ..model.memo import AccountingMemo, cached, proc_key
from ..model.packed import PackedProcessSpans
from ..model.summaries import error_spans, resume_of, resume_step
from ..read.rows import (
    C_IVAL,
    C_KIND,
    C_START,
    K_STEP,
    NONE,
    RUN_ATTRIBUTES,
    SKIP_REASONS,
    JobSpans,
)
from ..results.job import AttemptResult, JobResult, StepTimeSummary
from . import live
from .checks import job_warnings, recovery_warnings
from .painting import _Acc, attempt_types

_log = logging.getLogger(__name__)

__all__ = ["AccountingInvariantError", "AttemptResult", "JobResult", "StepArrays",
           "StepTimeSummary", "account", "failed_result", "isolated", "resume_step"]

_NS = 1_000_000_000


class AccountingInvariantError(RuntimeError):
    """The buckets of a job (or a window) do not add up to its wall-clock time: a bug of the
    accounting, whatever the input. :func:`isolated` reports that job as failed
    (``JobResult.error``, logged with the traceback); the other jobs carry on."""

def _wasted_steps(d: np.ndarray, a: Attempt, bound: int) -> int:
    """Steps above ``bound`` that one process of attempt ``a`` started within it."""
    sel = (d[:, C_KIND] == K_STEP) & (d[:, C_IVAL] != NONE) & (d[:, C_IVAL] > bound)
    sel &= (d[:, C_START] >= a.start_ns) & (d[:, C_START] < a.end_ns)
    return len(np.unique(d[sel, C_IVAL]))



def account(
    job: JobSpans,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
    memo: AccountingMemo | None = None,
) -> JobResult:
    """Account one job's spans into goodput buckets (``docs/accounting.md``).

    Args:
        job: one job's spans, e.g. ``read_run_dir(path).jobs[name]``.
        ideal_step_time_s: ideal step time in seconds; None = median of kept step times.
        now_ns: "now" (ns since the epoch) for telling a running attempt; default now.
        memo: results of an earlier accounting of the same job, whose rows have only grown
            at the end since (:mod:`goodput_processor.model.memo`): what the new rows cannot
            change is taken from it. The result is the same with or without.

    Returns:
        A :class:`JobResult`. A job without any usable span gets total 0.

    Raises:
        ValueError: ``ideal_step_time_s`` is not a finite number > 0.
    """
    return _account(job, ideal_step_time_s, now_ns, False, memo)[0]


def _account(job, ideal_step_time_s, now_ns, keep_segments: bool, memo=None):
    """:func:`account`, also returning the attempts and the running totals; one round of
    ``memo`` (:meth:`~goodput_processor.model.memo.AccountingMemo.end_round`)."""
    _check_ideal(ideal_step_time_s)
    if memo is None:
        return _account_with(job, ideal_step_time_s, now_ns, keep_segments, None)
    try:
        return _account_with(job, ideal_step_time_s, now_ns, keep_segments, memo)
    finally:
        memo.end_round()


def _account_with(job, ideal_step_time_s, now_ns, keep_segments: bool, memo):
    attempts = build_attempts(job, now_ns, memo)
    n = len(attempts)
    prefix = None if memo is None else memo.prefix  # the finished attempts folded (.live)
    same = live.same_attempts(prefix, attempts)
    resume = (prefix.resume[:same] if same else []) + [
        cached(memo, ("resume", proc_key(a.primary)), lambda a=a: resume_of(a.primary, memo))
        for a in attempts[same:]]
    later = [None] * n  # per attempt: the lowest resume step of those after it
    for i in range(n - 2, -1, -1):
        r, nxt = resume[i + 1], later[i + 1]
        later[i] = nxt if r is None else r if nxt is None else min(r, nxt)
    bounds = later
    types = (prefix.types[:same] if same else []) + [
        attempt_types(job, a, memo) for a in attempts[same:]]
    acc = _Acc(job, attempts, keep_segments, memo, sorted(set().union(*types)))
    k = live.valid_length(prefix, attempts[: n - 1], resume, bounds, tuple(acc.names),
                          keep_segments)
    k = live.restore(acc, prefix, k) if k else 0
    rows = list(prefix.rows[:k]) if k else []
    cur = prefix if k and k == len(prefix.attempts) else None  # (this poll's prefix)
    recovery_ns = sum(attempts[i + 1].start_ns - attempts[i].end_ns for i in range(n - 1))
    for i in range(k, n):
        a = attempts[i]
        if i == n - 1 and memo is not None and k < n - 1:  # the finished ones, folded once
            memo.prefix = cur = None if live.packed(attempts[:i]) else live.Prefix(
                tuple(attempts[:i]), resume[:i], bounds[:i], types[:i], tuple(acc.names),
                keep_segments, live.snapshot(acc), list(rows),
                {} if cur is None else dict(cur.kept))  # (what analyses kept: extended)
        has_next = i + 1 < n
        kept, wasted = acc.attempt(a, bounds[i], has_next)
        if has_next and memo is not None and not any(
                isinstance(p, PackedProcessSpans) for p in a.processes):
            # a finished attempt, the same Attempt object (kept alive by the value, so its id
            # names it; never one of packed processes: a copy keeps their rows once read)
            # and the same inputs: the same row
            row = memo.get(("attempt_row", id(a), resume[i], bounds[i], kept, wasted),
                           lambda a=a, i=i, kept=kept, wasted=wasted: (a, _attempt_row(
                               a, resume[i], bounds[i], kept, wasted, True, memo)))[1]
        else:
            row = _attempt_row(a, resume[i], bounds[i], kept, wasted, has_next, memo)
        rows.append(row)
    result = _finish(job, attempts, rows, acc, recovery_ns, ideal_step_time_s, cur)
    result = replace(result, warnings=tuple(job_warnings(
        job, attempts, result, memo, live.warnings_done(cur, attempts, memo))),
                     over_limit=dict(job.over_limit))
    # --- stragglers (analysis.stragglers): per-host step times, not in the buckets
    result = replace(result, stragglers=straggler_report(
        attempts, bounds, memo=memo, done=live.stragglers_done(cur, attempts, memo)))
    # --- end stragglers
    # --- recovery phases, badput by host (goodput_processor.analysis.recovery, .attribution)
    wide = None if memo is None else job_wide(job, result, memo)
    recs = kept_recovery_report(job, attempts, bounds, resume, result, acc.wasted_start, memo,
                                live.kept_records(cur, wide), wide)
    live.keep_records(cur, wide, recs)
    charges = host_badput(attempts, result, recs, memo=memo)
    result = replace(result, recovery=recs, host_badput=charges.observed,
                     host_badput_inferred=charges.inferred,
                     slowdown_unattributed_s=charges.slowdown_unattributed_s,
                     badput_charged={"total_badput_ns": charges.total_badput_ns,
                                     "observed_ns": charges.observed_ns,
                                     "inferred_ns": charges.inferred_ns,
                                     "unattributed_ns": charges.unattributed_ns},
                     warnings=result.warnings + tuple(recovery_warnings(recs)))
    # --- end recovery
    return result, attempts, acc


def _attempt_row(a, resume, bound, kept, wasted, has_next: bool, memo) -> AttemptResult:
    """Attempt ``a``'s row of the result: ``resume`` its resume step, ``bound`` the highest
    step kept of it (None: all), ``kept``/``wasted`` its primary's steps kept and wasted
    (a peer may have flushed steps the primary lost: the most wasted of them is taken)."""
    if has_next and bound is not None:
        wasted = max([wasted] + [
            cached(memo, ("wasted", proc_key(p), a.start_ns, a.end_ns, bound),
                   lambda p=p: _wasted_steps(p.data, a, bound))
            for p in a.processes[1:]])
    errors = sum(cached(memo, ("errors", proc_key(p)), lambda p=p: error_spans(p, memo))
                 for p in a.processes)
    return AttemptResult(
        attempt=a.attempt, start_ns=a.start_ns, end_ns=a.end_ns,
        duration_s=a.duration_ns / _NS, end_reason=a.end_reason, cut=a.cut,
        primary_process=a.primary.index, processes=len(a.processes),
        declared_processes=a.declared_process_count, hosts=a.hosts,
        resume_step=resume, steps_kept=kept, steps_wasted=wasted, error_spans=errors,
        recorder_errors=a.recorder_errors, recorder_dropped=a.recorder_dropped,
    )


def _finish(job, attempts, attempt_rows, acc: _Acc, recovery_ns, ideal_step_time_s,
            prefix=None):
    """Ideal step time, noise band, slowdown and the :class:`JobResult` (see the docs);
    ``prefix``: the finished attempts' :class:`.live.Prefix` (what it kept is not redone)."""
    level_names, level_ns = acc.names, acc.ns
    total_ns = attempts[-1].end_ns - attempts[0].start_ns if attempts else 0
    given = None if ideal_step_time_s is None else round(ideal_step_time_s * _NS)
    stats = step_stats(acc.kept, given, NONE, acc.memo, acc.part_keys)
    ideal, tol, slowdown = stats.ideal_ns, stats.tol_ns, stats.slowdown_ns
    kept_ns = level_ns[acc.level["step"]]
    if kept_ns != stats.time_ns:  # pragma: no cover - a bug, never expected
        raise AccountingInvariantError("kept step time must equal the step-level time")
    buckets = {schema.PRODUCTIVE: kept_ns - slowdown}
    customs = [n for n in level_names if n.startswith(schema.CUSTOM_PREFIX)]
    for name in schema.BADPUT_BUCKETS:
        if name == "other":
            for c in customs:
                buckets[c] = level_ns[acc.level[c]]
            buckets[name] = level_ns[acc.other]
        elif name == "training_slowdown":
            buckets[name] = slowdown
        elif name == "infrastructure_recovery":
            buckets[name] = recovery_ns
            if acc.elastic:
                for e in schema.ELASTIC_BUCKETS:
                    buckets[e] = level_ns[acc.level[e]]
        else:
            buckets[name] = level_ns[acc.level[name]]
    if sum(buckets.values()) != total_ns:  # pragma: no cover - a bug, never expected
        raise AccountingInvariantError(f"buckets {buckets} do not sum to total {total_ns} ns")
    run = live.run_attributes(prefix, attempts, _run_attributes)
    mfu = _mfu(run, stats.steps, buckets[schema.PRODUCTIVE])
    goodput = buckets[schema.PRODUCTIVE] / total_ns if total_ns else 0.0
    slices = slice_efficiency(records_of(live.marker_rows(prefix, job, attempts, acc.memo)),
                              attempts[0].start_ns, attempts[-1].end_ns) if attempts else None
    has_steps = any(len(p[0]) for p in acc.kept)
    return JobResult(
        job=job.name,
        start_ns=attempts[0].start_ns if attempts else 0,
        end_ns=attempts[-1].end_ns if attempts else 0,
        total_ns=total_ns,
        total_time_s=total_ns / _NS,
        productive_time_s=buckets[schema.PRODUCTIVE] / _NS,
        goodput=goodput,
        badput_s={k: v / _NS for k, v in buckets.items() if k != schema.PRODUCTIVE},
        buckets_ns=buckets,
        disruptions=max(len(attempts) - 1, 0),
        max_productive_step=stats.max_step,
        ideal_step_time_s=None if ideal is None else ideal / _NS,
        ideal_step_time_source=stats.source,
        noise_tolerance_s=tol / _NS if has_steps else None,
        step_time=StepTimeSummary(stats.steps, *stats.percentiles_s,
                                  anomalous_steps=stats.anomalous),
        attempts=tuple(attempt_rows),
        async_work_s={k: v / _NS for k, v in sorted(acc.async_ns.items())},
        skipped={**dict.fromkeys(SKIP_REASONS, 0), **job.skipped},
        skipped_examples=tuple(job.examples),
        recorder_errors=sum(a.recorder_errors for a in attempts),
        recorder_dropped=sum(a.recorder_dropped for a in attempts),
        schema_version=",".join(sorted(job.schema_versions)) or None,
        steps=StepArrays(acc.kept, ideal, tol, acc.part_keys, stats.kth),
        run=run,
        mfu=mfu,
        useful_compute=None if mfu is None else goodput * mfu,
        slice_efficiency=slices,
    )


def _run_attributes(attempts, run: dict | None = None) -> dict:
    """The ML run's resource attributes: the latest attempt's primary process first
    (``run``: those of the attempts before, updated in place)."""
    run = {} if run is None else run
    for a in attempts:
        for p in (*a.processes[1:], a.primary):  # the primary process wins
            run.update((k, v) for k, v in p.run.items() if k in RUN_ATTRIBUTES)
    return run


def _mfu(run: dict, steps: int, productive_ns: int) -> float | None:
    """Model FLOPs utilisation during productive time (a fraction):
    ``flops_per_step x kept steps / (productive seconds x peak FLOP/s x devices)``.

    The standard MFU (PaLM, Chowdhery et al. 2022, appendix B: achieved model FLOP/s over
    peak FLOP/s), measured over the productive time of the kept steps, so that
    ``goodput x mfu`` is the share of the whole job's peak compute spent on kept training.
    None when an input is missing, not a positive number, or nothing was productive.
    """
    vals = [run.get(k) for k in (schema.RES_FLOPS_PER_STEP, schema.RES_PEAK_FLOPS,
                                 schema.RES_DEVICE_COUNT)]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
               for v in vals) or productive_ns <= 0 or steps <= 0:
        return None
    flops, peak, devices = (float(v) for v in vals)
    mfu = flops * steps / (productive_ns / _NS * peak * devices)
    return mfu if math.isfinite(mfu) else None


def _check_ideal(ideal_step_time_s) -> None:
    if ideal_step_time_s is not None and not (
        math.isfinite(ideal_step_time_s) and ideal_step_time_s > 0
    ):
        raise ValueError(f"ideal step time must be a finite number > 0, got {ideal_step_time_s}")


def isolated(job: str, compute, on_error=None) -> JobResult:
    """``compute()`` (a job's accounting), or :func:`failed_result` of ``job`` when it
    raises: one job's spans never stop a report or a service, and the job is reported as
    failed instead of guessed. ``on_error(exc)`` is called inside the handler (so
    ``logging.exception`` there has the traceback). Check the caller's arguments before:
    every exception of ``compute`` counts as the job's."""
    try:
        return compute()
    except Exception as e:  # noqa: BLE001 - the job is reported failed, never dropped
        if on_error is not None:
            on_error(e)
        return failed_result(job, f"accounting failed: {type(e).__name__}: {e}")


_EMPTY: list = []  # the result of a job without spans, made once


def failed_result(job: str, error: str) -> JobResult:
    """The result of a job that could not be accounted: zero time, no steps, ``error`` set
    (:func:`isolated`). Built from the result of an empty job, made once."""
    if not _EMPTY:
        _EMPTY.append(_account(JobSpans(""), None, 0, False)[0])
    return replace(_EMPTY[0], job=job, error=error)
