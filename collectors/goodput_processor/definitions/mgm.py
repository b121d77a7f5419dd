"""ml-goodput-measurement 0.2.3 definitions on our timeline (``--definitions mgm``).

Users who migrate from Google's ``ml-goodput-measurement`` (mgm) can ask for its numbers
on the same spans: :func:`account_mgm` turns one job's spans into the event stream mgm's
recorder would have written to Cloud Logging and applies the semantics of mgm 0.2.3's
``GoodputCalculator`` (``ml_goodput_measurement/src/goodput.py``), quirks included, with
its own code (integer nanoseconds and numpy, no mgm import). Every rule below names the
mgm function it reproduces.

**From spans to mgm events** (each attempt on its primary process, as in
``docs/accounting.md``; the stream is built in :mod:`.mgm_events`):

==============================================  ============================================
span / attempt                                  mgm log entry
==============================================  ============================================
attempt start                                   ``job_start_time``
attempt end, unless ``killed``/``running``/      ``job_end_time`` (a job_end marker of any
``restart``                                     other reason: explicit, exit, ...; a
                                                ``restart`` end is the recorder's own
                                                close at a second ``job_start``, which mgm
                                                never logs)
``goodput.step`` start (with ``goodput.step``)  ``step_start_time`` + ``step_count``
``goodput.accelerator_init``                    ``tpu_init_start_time`` / ``..._end_time``
``goodput.training_prep``                       ``training_prep_start_time`` / ``..._end_time``
``goodput.data_loading``                        ``data_loading_start_time`` / ``..._end_time``
``goodput.custom_badput``                       ``custom_badput_event_start_time`` /
                                                ``..._end_time`` with its type (``unknown``,
                                                mgm's default, when the span has none)
``goodput.checkpoint_save`` (blocking)          Orbax save statistics: ``step`` = checkpoint
                                                step, checkpoint-manager blocking duration =
                                                span length, at the span start
``goodput.checkpoint_restore`` (blocking)       Orbax restore statistics: duration = span
                                                length, at the span start
``goodput.elastic_wait``                        ``elastic_wait_start_time`` / ``..._end_time``
                                                with its ``elastic_wait_event_type``
``goodput.elastic_reinit``                      ``elastic_reinit_start_time`` / ``..._end_time``
``goodput.elastic_slices``                      ``elastic_slice_counts_timestamp`` (slice
                                                counts, read apart for slice efficiency)
==============================================  ============================================

A phase whose end is inferred (``F_ENDLESS``: in flight when its process died, or at
``--at``) contributes its start only, and a checkpoint save or restore in flight none (Orbax
logs its statistics when done). Jobs with elastic spans follow mgm's
``ElasticGoodputCalculator`` (``elastic=None``, the default of :func:`account_mgm`).

Non-blocking spans (``goodput.blocking = false``), ``goodput.program_startup`` spans,
heartbeats and step spans without a step number are not mgm events (mgm derives program
startup from the first step). Our spans carry no checkpoint directory: every save and
restore is treated as one kind (mgm keeps ``local`` and ``gs://`` apart). Events are ordered
by time; at equal times in the order the recorder writes them: job start, ends of spans,
step starts, starts of spans (and checkpoint statistics), ends of zero-length spans, job end.

**Differences from mgm that are not about the timeline:**

- *now*: mgm measures a job without a ``job_end_time`` up to the wall-clock time of the
  query; we use ``now_ns``, by default the end of the job's last attempt (the timeline's
  end), so that a finished-but-killed job gives a stable number.
- Times are exact integer ns here; mgm uses float epoch seconds (~0.2 µs resolution) and
  microsecond datetimes for the total time, so results agree to about 1e-6 s.
- ``step_deviation_s`` of an interval result is computed on the interval's step events
  (mgm's ``get_job_goodput_interval`` computes no step deviation).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from ..analysis.elastic import slice_efficiency
from ..model.memo import AccountingMemo, cached
from ..read.rows import JobSpans
from .mgm_calc import _calculate
from .mgm_events import (
    E_JOB_END,
    E_JOB_START,
    E_REINIT_END,
    E_REINIT_START,
    E_WAIT_END,
    E_WAIT_START,
    Events,
    in_order,
    keyed_chunks,
    renumber,
    stream,
    take_stream,
)
from .mgm_result import (
    _BREAKDOWN_ORDER,
    _EPS_S,
    _NS,
    BADPUT_TYPES,
    ELASTIC_TYPES,
    MGM_VERSION,
    Later,
    MgmResult,
)
from .mgm_resume import resumed_core, settled_box
from .mgm_steps import Deviation, _step_time_arrays, compute_ideal_step_time, deviation_of

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["BADPUT_TYPES", "ELASTIC_TYPES", "MGM_VERSION", "MgmResult", "account_mgm",
           "account_mgm_windows",
           "compute_ideal_step_time", "render_mgm"]


def _finish(job: str, core, steps, total_ns: int, interval, elastic: bool = False,
            slices=None) -> MgmResult:
    """Validity checks, sanitising, OTHER and percentages as mgm 0.2.3 ``get_job_goodput``
    / ``_compute_job_goodput_interval_metrics`` do on ``core`` (mgm's replay,
    :func:`~.mgm_calc._calculate`; ``elastic``: with the rules and the breakdown of
    ``ElasticGoodputCalculator``; ``slices``: its slice efficiencies). ``steps``: the
    ideal step time and step deviation, or a :class:`~.mgm_result.Later` of them."""
    if total_ns == 0:
        raise ValueError(f"job {job!r}: total job time is zero, mgm cannot compute goodput")
    total = total_ns / _NS
    # Our inputs are integer ns: a difference under 1 ns is float rounding of an equality
    # (mgm's own float noise may go either way there; we take it as equal).
    if core.productive_s < -_EPS_S or core.productive_s > total + _EPS_S:
        raise ValueError(
            f"job {job!r}: mgm's productive training time {core.productive_s:.6f} s is not "
            f"within the total {total:.6f} s (mgm: 'Productive training time is invalid')")
    # _sanitize_unproductive_times: values < 0 or > total are set to 0.
    unprod = {k: v if 0.0 <= v <= total else 0.0 for k, v in core.unproductive.items()}
    custom = {k: v if 0.0 <= v <= total else 0.0 for k, v in core.custom.items()}
    # _compute_other_unproductive_time: everything but DATA_LOADING_ASYNC is badput.
    known = sum(v for k, v in unprod.items() if k != "DATA_LOADING_ASYNC") + sum(
        custom.values())
    unprod["OTHER"] = max(0.0, total - core.productive_s - known)
    badput_s = {k: unprod[k] for k in BADPUT_TYPES + (ELASTIC_TYPES if elastic else ())}

    def pct(v: float) -> float:  # _get_job_badput_breakdown: 0 unless 0 < v < total
        return v / total * 100 if 0 < v < total else 0.0

    percent: dict[str, float | dict[str, float]] = {}
    for name in _BREAKDOWN_ORDER + (ELASTIC_TYPES if elastic else ()):
        percent[name] = ({k: pct(v) for k, v in custom.items()}
                         if name == "CUSTOM_BADPUT_EVENTS" else pct(badput_s[name]))
    if isinstance(steps, Later):
        ideal, deviation = Later(lambda: steps.value()[0]), Later(lambda: steps.value()[1])
    else:
        ideal, deviation = steps
    return MgmResult(
        job=job,
        total_time_s=total,
        productive_time_s=core.productive_s,
        goodput=core.productive_s / total,
        badput_s=badput_s,
        custom_badput_s=custom,
        badput_percent=percent,
        max_productive_step=core.max_productive_step,
        last_recorded_step=core.last_step,
        disruptions=core.disruptions,
        ideal_step_time_s=ideal,
        step_deviation_s=deviation,
        interval=interval,
        elastic=elastic,
        badput_keys=tuple(k for k in BADPUT_TYPES[:-1] + ("CUSTOM_BADPUT_EVENTS",)
                          + (ELASTIC_TYPES if elastic else ()) if k in core.present)
        + ("OTHER",),
        slice_efficiency=slices,
    )


def _steps(keys: np.ndarray, times: np.ndarray, ideal_step_time_s
           ) -> tuple[float | None, Deviation]:
    """``(ideal step time, step deviation)`` of :class:`MgmResult` for mgm's step times
    ``keys``/``times`` (:func:`~.mgm_steps._step_time_arrays`)."""
    ideal, deviation = deviation_of(keys, times, ideal_step_time_s)
    return (None if ideal is None else float(ideal)), deviation


def _replayed(memo, key, elastic: bool, events, ideal_step_time_s, resume=None,
              unkept=None):
    """mgm's replay of ``events()`` and its step statistics, kept in ``memo`` under
    ``key`` (the statistics as a :class:`~.mgm_result.Later`: computed when read, from
    ``unkept()``, the same events without the memo, default ``events``); ``resume()``:
    the replay from a settled one and the replay's state (:mod:`.mgm_resume`), used when
    not elastic (the step times then come from its state)."""
    if memo is None:
        ev = events()
        return _calculate(ev, elastic), _steps(*_step_time_arrays(ev), ideal_step_time_s)
    if resume is not None and not elastic:
        core, replay = cached(memo, ("mgm_resumed", key), resume)

        def arrays():
            return replay.st_keys, replay.st_ns / _NS
    else:
        core = cached(memo, ("mgm_core", key, elastic), lambda: _calculate(events(), elastic))
        later = events if unkept is None else unkept

        def arrays():
            return _step_time_arrays(later())
    steps = cached(memo, ("mgm_deviation", key, ideal_step_time_s),
                   lambda: Later(lambda: _steps(*arrays(), ideal_step_time_s)))
    return core, steps


def account_mgm(
    job: JobSpans,
    *,
    interval_ns: tuple[int, int] | None = None,
    now_ns: int | None = None,
    ideal_step_time_s: float | None = None,
    elastic: bool | None = None,
    memo: AccountingMemo | None = None,
) -> MgmResult:
    """What ml-goodput-measurement 0.2.3's ``GoodputCalculator`` returns for ``job``.

    Whole job (``get_job_goodput`` + ``get_step_deviation``): total time from the first
    ``job_start_time`` to the last ``job_end_time`` of the stream, or to *now* when there is
    none (``_get_total_job_time``). Interval (``get_job_goodput_interval``): only events
    with time in ``(start, end]``; total = ``min(end, last event time) - max(start, first
    event time)`` (``_get_total_job_time_from_interval``); the same rules on that subset.

    Args:
        job: one job's spans (``read_run_dir(path).jobs[name]``).
        interval_ns: ``(start, end)`` in ns since the epoch, or None for the whole job.
        now_ns: *now* in ns since the epoch, for a running last attempt
            (:func:`~goodput_processor.read.rows.build_attempts`) and as the end of a job
            without ``job_end_time``; default: the end of the last attempt (mgm uses the
            wall-clock time of the query).
        ideal_step_time_s: mgm's ``configured_ideal_step_time`` in seconds; None: mgm's
            :func:`compute_ideal_step_time` of the step times.
        elastic: answer as mgm's ``ElasticGoodputCalculator`` (``goodput_elastic.py``:
            elastic wait and reinitialisation badput, slice efficiency) or as its base
            ``GoodputCalculator``, which leaves elastic entries out (their time is OTHER);
            None (default): elastic when the job has elastic spans or slice counts.
        memo: results of earlier calls on the same job, whose rows have only grown at the
            end since (:mod:`goodput_processor.model.memo`; a live job's, read by a spool tailer
            or ``goodput serve``): each attempt's events, the event stream, mgm's replay of
            it and the step deviation are taken from it when what they depend on is
            unchanged, so a call with nothing new only recomputes what depends on *now*;
            the whole job's replay resumes from the state it had at a settled point of the
            stream when the stream still begins with the same events
            (:mod:`.mgm_resume`), and its ideal step time and step deviation are computed
            when first read (:class:`~.mgm_result.Later`). The result equals the one
            without a memo. Results share what the memo keeps (``step_deviation_s``):
            treat them as read-only. The call ends the memo's round
            (:meth:`~goodput_processor.model.memo.AccountingMemo.end_round`).

    Returns:
        An :class:`MgmResult`. Its ``slice_efficiency`` is mgm's for ``get_job_goodput_
        details`` (the whole job: from the first job start over the total time) or
        ``get_interval_metric_details`` (an interval: records within it, over the
        requested interval).

    Raises:
        ValueError: ``ideal_step_time_s`` is not a finite number > 0; the job has no
            attempt or its total time is zero; mgm's productive time is < 0 or above the
            total (mgm raises "Productive training time is invalid", e.g. when a clean end of
            an earlier attempt is the job's last ``job_end_time`` but later attempts ran
            on); for an interval: ``start >= end``, no event in ``(start, end]``, or the
            effective interval is empty.
    """
    if ideal_step_time_s is not None and not (
        math.isfinite(ideal_step_time_s) and ideal_step_time_s > 0
    ):
        raise ValueError(f"ideal step time must be a finite number > 0, got {ideal_step_time_s}")
    if memo is None:
        return _account(job, interval_ns, now_ns, ideal_step_time_s, elastic, None)
    try:
        return _account(job, interval_ns, now_ns, ideal_step_time_s, elastic, memo)
    finally:
        memo.end_round()


def account_mgm_windows(job: JobSpans, windows, *, ideal_step_time_s: float | None = None,
                        memo: AccountingMemo | None = None):
    """The whole job and each interval of ``windows`` (``(start_ns, end_ns)`` pairs) by
    :func:`account_mgm`, in one round of ``memo`` (what the calls share is computed once,
    and a later call with nothing new finds each of them).

    Returns:
        ``(whole job result, [interval result, or None where mgm refuses the interval]``).

    Raises:
        ValueError: as :func:`account_mgm` for the whole job.
    """
    one = None if memo is None else _Round(memo)
    try:
        whole = account_mgm(job, ideal_step_time_s=ideal_step_time_s, memo=one)
        parts = []
        for w in windows:
            try:
                parts.append(account_mgm(job, interval_ns=w, memo=one))
            except ValueError:
                parts.append(None)
        return whole, parts
    finally:
        if memo is not None:
            memo.end_round()


class _Round:
    """An :class:`AccountingMemo` for calls within one round: their ends of round are left
    out (the caller ends it)."""

    def __init__(self, memo: AccountingMemo) -> None:
        self._memo = memo

    def __getattr__(self, name: str):
        return getattr(self._memo, name)

    def end_round(self) -> None:
        pass


def _elastic_kinds(ev) -> bool:
    return bool(np.isin(ev.kind, (E_WAIT_START, E_WAIT_END, E_REINIT_START,
                                  E_REINIT_END)).any())


def _job_bounds(ev) -> tuple[int | None, int | None]:
    """The first job start and the last job end of ``ev`` (ns; None when there is none)."""
    js = ev.t[ev.kind == E_JOB_START]
    je = ev.t[ev.kind == E_JOB_END]
    return (int(js[0]) if len(js) else None), (int(je[-1]) if len(je) else None)


def _account(job: JobSpans, interval_ns, now_ns, ideal_step_time_s, elastic,
             memo: AccountingMemo | None) -> MgmResult:
    """:func:`account_mgm` (its arguments checked; ``memo``'s round not ended). With a memo,
    what depends only on an attempt's events is kept under its key, what depends on the
    stream under the attempts' keys (an interval's events are a slice of the stream, which
    is in time order), and the whole job's replay resumes from a settled one
    (:mod:`.mgm_resume`)."""
    chunks, key, last_end, slices = keyed_chunks(job, now_ns, memo)
    parts = [cached(memo, ("mgm_chunk_facts", k), lambda c=c: (_elastic_kinds(c),
                                                                *_job_bounds(c)))
             for k, c in zip(key, chunks, strict=True)]
    if memo is None:  # one accounting: the attempts' events go once merged
        merged = take_stream(chunks)  # (chunks emptied)

        def events():
            return merged
    else:
        def events():
            return stream(chunks, key, memo)
    if elastic is None:
        elastic = bool(len(slices)) or any(p[0] for p in parts)
    if interval_ns is None:
        # in time order: the first job start is the earliest one, the last end the latest
        first = min((p[1] for p in parts if p[1] is not None), default=None)
        last = max((p[2] for p in parts if p[2] is not None), default=None)
        if first is None:
            raise ValueError(f"job {job.name!r} has no spans: mgm cannot compute goodput")
        if last is not None:
            end = last
        else:
            end = int(now_ns) if now_ns is not None else int(last_end)
        eff = None
        if elastic:
            e = slice_efficiency(slices, first, end, mgm=True)
            eff = None if e is None else (e.stepping, e.available)
        box = None if memo is None else settled_box(memo)
        core, steps = _replayed(memo, key, elastic, events, ideal_step_time_s,
                                lambda: resumed_core(chunks, key, memo, box),
                                lambda: stream(chunks, key))
        return _finish(job.name, core, steps, end - first, None, elastic, eff)

    start, end = (int(x) for x in interval_ns)
    if start >= end:
        raise ValueError(f"interval start {start} ns is not before its end {end} ns")
    # the stream is in time order: the events in (start, end] are a slice of it
    sub, i, j = (_slice(chunks, start, end) if memo is not None and in_order(chunks)
                 else _slice_of(events(), start, end))
    if not len(sub.t):
        raise ValueError(
            f"job {job.name!r}: no mgm events within the interval ({start}, {end}] ns")
    lo, hi = max(start, int(sub.t[0])), min(end, int(sub.t[-1]))
    if lo >= hi:
        raise ValueError(
            f"job {job.name!r}: the events within the interval ({start}, {end}] ns span no "
            "time (mgm: 'Start time is on or after end time')")
    eff = None
    if elastic:
        inside = slices[(slices[:, 0] > start) & (slices[:, 0] <= end)]
        e = slice_efficiency(inside, start, end, mgm=True)
        eff = None if e is None else (e.stepping, e.available)
    core, steps = _replayed(memo, (key, i, j), elastic, lambda: sub, ideal_step_time_s)
    return _finish(job.name, core, steps, hi - lo, (lo, hi), elastic, eff)


def _slice_of(ev: Events, start: int, end: int) -> tuple[Events, int, int]:
    """The events of ``ev`` in ``(start, end]`` (ns) and their positions ``[i, j)``."""
    i, j = (int(x) for x in np.searchsorted(ev.t, (start, end), side="right"))
    return (Events(ev.t[i:j], ev.kind[i:j], ev.val[i:j], ev.dur[i:j], ev.types,
                   ev.wait_types), i, j)


def _slice(chunks, start: int, end: int) -> tuple[Events, int, int]:
    """:func:`_slice_of` the stream of ``chunks`` when it is their concatenation
    (:func:`~.mgm_events.in_order`), from the chunks that hold the slice (the stream is not
    made)."""
    types: dict = {}
    wait_types: dict = {}
    parts = []
    i = j = 0
    for c in chunks:
        before = (dict(types), dict(wait_types))
        for n in c.types:
            types.setdefault(n, len(types))
        for n in c.wait_types:
            wait_types.setdefault(n, len(wait_types))
        a, b = (int(x) for x in np.searchsorted(c.t, (start, end), side="right"))
        i, j = i + a, j + b
        if a < b:
            part = SimpleNamespace(t=c.t[a:b], kind=c.kind[a:b], val=c.val[a:b],
                                   dur=c.dur[a:b], types=c.types, wait_types=c.wait_types)
            parts.append((part, renumber([part], *before)[0]))
    if not parts:
        return Events(_Z, _Z.astype(np.int8), _Z, _Z, tuple(types), tuple(wait_types)), i, j
    t, kind, dur = (np.concatenate([getattr(p, f) for p, _ in parts])
                    for f in ("t", "kind", "dur"))
    val = np.concatenate([v for _, v in parts])
    return Events(t, kind, val, dur, tuple(types), tuple(wait_types)), i, j


_Z = np.zeros(0, np.int64)


# --- table ---------------------------------------------------------------------------


def render_mgm(results, console: Console | None = None) -> None:
    """Print each :class:`MgmResult` as a table (in the style of ``report.render_table``)
    to ``console`` (a ``rich.console.Console``; default stdout); see :mod:`.mgm_render`."""
    from .mgm_render import render

    render(results, console)
