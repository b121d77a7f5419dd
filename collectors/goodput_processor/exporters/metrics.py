"""Publish jobs' goodput accounting as OpenTelemetry metrics (``docs/metrics.md``).

:class:`GoodputMetrics` registers observable gauges on a ``MeterProvider``; at every
collection it asks its *source* for the current state of each job and reports it. Any
OpenTelemetry metric reader/exporter publishes them: OTLP, Cloud Monitoring (the ``gcp``
extra) and Prometheus (:mod:`.metric_readers`), or an ``InMemoryMetricReader`` in tests::

    from opentelemetry.sdk.metrics import MeterProvider
    from goodput_processor.exporters.metric_readers import otlp_reader
    from goodput_processor.exporters.metrics import GoodputMetrics, run_dir_source

    provider = MeterProvider(metric_readers=[otlp_reader("localhost:4317", interval_s=30)])
    GoodputMetrics(run_dir_source("goodput-runs/my-job"), provider, windows_s=(60, 300, 900))

A source is any callable returning an iterable of :class:`JobSpans` (accounted here,
with the rolling windows), :class:`JobSnapshot` (already accounted, e.g. by the
``goodput serve`` service) or plain :class:`JobResult` (no windows). All values are
gauges: a cumulative bucket can shrink (a restart turns earlier steps into wasted
progress; an estimated ideal step time moves), so they are not monotonic sums.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import CallbackOptions, Observation

from goodput import schema
from goodput.links import doc_url

from ..account.windows import WindowResult, account_windows, check_windows
from ..read.reader import read_run_dir
from ..read.rows import JobSpans
from ..results.job import JobResult

__all__ = ["ATTR_BUCKET", "ATTR_JOB", "ATTR_STATISTIC", "ATTR_WINDOW", "DEFAULT_WINDOWS_S",
           "METER_NAME", "METRIC_NAMES", "GoodputMetrics", "JobSnapshot",
           "run_dir_source", "snapshot"]

log = logging.getLogger(__name__)

#: Instrumentation scope of the metrics.
METER_NAME = "goodput_processor"
#: Attribute keys: job name, badput bucket, rolling window (seconds), deviation statistic.
ATTR_JOB = schema.RES_JOB_NAME
ATTR_BUCKET = "goodput.badput.bucket"
ATTR_WINDOW = "goodput.window"
ATTR_STATISTIC = "goodput.statistic"
#: Attributes of ``goodput.straggler.step_time_ratio``: host, process index, rank (1 = slowest).
ATTR_HOST = schema.RES_HOST_NAME
ATTR_PROCESS = schema.RES_PROCESS_INDEX
ATTR_RANK = "goodput.straggler.rank"
#: Attributes of ``goodput.host.badput_time`` (with host and process) and
#: ``goodput.recovery.phase_time``: what caused it (``training_slowdown`` or
#: ``disruptions``), and the recovery phase.
ATTR_CAUSE = "goodput.badput.cause"
ATTR_PHASE = "goodput.recovery.phase"
#: Attribute of ``goodput.host.badput_time``: what the charge rests on, ``observed`` (the
#: slowdown; a failure seen as an exception, end marker or launcher event) or ``inferred``
#: (a disruption charged on the process's last sign of life only).
ATTR_EVIDENCE = "goodput.evidence"
#: Attribute of ``goodput.warnings``: the warning's code.
ATTR_WARNING_CODE = "goodput.warning.code"
#: Attribute of ``goodput.job.over_limit``: which limit of ``goodput serve``.
ATTR_LIMIT = "goodput.limit"
#: Rolling windows (seconds) used when none are given.
DEFAULT_WINDOWS_S = (60, 300, 900)
#: Statistics of the step-time deviation (percentiles over kept steps, and the maximum).
_STATS = (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))

#: name -> (unit, description); every metric is an observable gauge.
METRIC_NAMES: dict[str, tuple[str, str]] = {
    "goodput.goodput": ("1", "Cumulative goodput: productive time / total time (0..1)"),
    "goodput.productive_time": ("s", "Cumulative productive time"),
    "goodput.badput_time": ("s", "Cumulative badput time per bucket"),
    "goodput.elapsed_time": ("s", "Total time of the job (first attempt start to now/end)"),
    "goodput.disruptions": ("{disruption}", "Restarts: attempts after the first"),
    "goodput.max_productive_step": ("{step}", "Highest step number of a kept step"),
    "goodput.ideal_step_time": ("s", "Ideal step time (given, or median of kept steps)"),
    "goodput.step_time_deviation": ("s", "Step time minus ideal step time over kept steps: "
                                    "p50, p90, p99 and max"),
    "goodput.anomalous_steps": ("{step}", "Kept steps slower than ideal + noise band"),
    "goodput.mfu": ("1", "Model FLOPs utilisation during productive time (0..1)"),
    "goodput.useful_compute": ("1", "Goodput x MFU: share of the job's peak FLOP/s spent on "
                               "kept training (0..1)"),
    "goodput.warnings": ("{warning}", "Warnings of the job's report, per code: what the "
                         "input could not settle (" + doc_url("accounting.md", "Warnings")
                         + ")"),
    "goodput.job.over_limit": ("1", "Values of the job past a limit of goodput serve, per "
                               "limit (custom_types, attribute_bytes); absent when none"),
    # --- elastic jobs (slice counts, goodput_processor.analysis.elastic)
    "goodput.elastic.stepping_slice_efficiency": (
        "1", "Time-weighted stepping slices / total slices of an elastic job (0..1)"),
    "goodput.elastic.available_slice_efficiency": (
        "1", "Time-weighted available slices / total slices of an elastic job (0..1)"),
    # --- end elastic
    "goodput.window.goodput": ("1", "Goodput over the last W seconds of the job"),
    "goodput.window.productive_time": ("s", "Productive time in the last W seconds"),
    "goodput.window.badput_time": ("s", "Badput time per bucket in the last W seconds"),
    # --- stragglers (goodput_processor.analysis.stragglers)
    "goodput.straggler.step_time_ratio": ("1", "Median step time of one of the slowest hosts "
                                          "/ median over hosts (top 5, by host)"),
    # --- end stragglers
    # --- recovery phases and badput by host (goodput_processor.analysis.recovery, .attribution)
    "goodput.host.badput_time": ("s", "Badput a host process caused: training slowdown "
                                 "attributed to it and the disruptions it failed first in "
                                 "(goodput.badput.cause); top hosts by badput, observed "
                                 "and inferred charges apart (goodput.evidence)"),
    "goodput.recovery.phase_time": ("s", "Time of each recovery phase (goodput.recovery.phase), "
                                    "summed over the job's disruptions; unknown phases absent"),
    # --- end recovery
}


@dataclass(frozen=True)
class JobSnapshot:
    """One job's accounting at one moment: the cumulative result and its rolling windows."""

    result: JobResult
    windows: tuple[WindowResult, ...] = ()


def snapshot(
    job: JobSpans,
    windows_s: Sequence[float] = DEFAULT_WINDOWS_S,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
    memo=None,
) -> JobSnapshot:
    """Account ``job`` with rolling windows (see
    :func:`~goodput_processor.account.windows.account_windows`; ``memo``:
    an :class:`~goodput_processor.model.memo.AccountingMemo` of earlier snapshots of the job).

    Raises:
        ValueError: a window is not a number of seconds > 0, or bad ``ideal_step_time_s``.
    """
    result, windows = account_windows(job, windows_s, ideal_step_time_s, now_ns, memo)
    return JobSnapshot(result, windows)


def run_dir_source(
    path: str | os.PathLike,
    windows_s: Sequence[float] = DEFAULT_WINDOWS_S,
    ideal_step_time_s: float | None = None,
    job: str | None = None,
) -> Callable[[], list[JobSnapshot]]:
    """A source that re-reads run directory ``path`` at every call and accounts each job.

    Re-reading costs time proportional to the spool size (``docs/benchmarks.md``); for
    long jobs prefer a live source (``goodput serve``). ``job``: only that job.

    Raises (when called):
        RunDirError, SpoolFormatError: see :func:`~goodput_processor.read.reader.read_run_dir`.
    """
    windows = check_windows(windows_s)

    def source() -> list[JobSnapshot]:
        spans = read_run_dir(path)
        names = sorted(spans.jobs) if job is None else [n for n in spans.jobs if n == job]
        return [snapshot(spans.jobs[n], windows, ideal_step_time_s) for n in names]

    return source


def _window_attr(w: float) -> int | float:
    return int(w) if float(w).is_integer() else float(w)


class GoodputMetrics:
    """Observable gauges of goodput, badput, step-time deviation and rolling windows.

    Args:
        source: callable returning an iterable of :class:`JobSpans`,
            :class:`JobSnapshot` or :class:`JobResult` (one per job). It is called once
            per collection (by the first gauge observed; the others reuse its answer,
            and a later collection within ``min_refresh_s`` reuses it too).
        meter_provider: where the gauges live; default the global provider.
        windows_s: rolling windows in seconds, used for :class:`JobSpans` items.
        ideal_step_time_s: ideal step time (seconds) for :class:`JobSpans` items.
        min_refresh_s: reuse a snapshot younger than this (seconds >= 0), so several
            readers collecting at once do not re-account the jobs each.

    If ``source`` raises, the error is logged and counted in :attr:`errors`, and the
    last good snapshot is reported again (none before the first success).

    Raises:
        ValueError: bad ``windows_s``, ``ideal_step_time_s`` or ``min_refresh_s``.
    """

    def __init__(
        self,
        source: Callable[[], Iterable[JobSpans | JobSnapshot | JobResult]],
        meter_provider: otel_metrics.MeterProvider | None = None,
        *,
        windows_s: Sequence[float] = DEFAULT_WINDOWS_S,
        ideal_step_time_s: float | None = None,
        min_refresh_s: float = 0.5,
    ):
        self.windows_s = check_windows(windows_s)
        if ideal_step_time_s is not None and not (
            math.isfinite(ideal_step_time_s) and ideal_step_time_s > 0
        ):
            raise ValueError(
                f"ideal step time must be a finite number > 0, got {ideal_step_time_s}")
        if not (math.isfinite(min_refresh_s) and min_refresh_s >= 0):
            raise ValueError(f"min_refresh_s must be a number >= 0, got {min_refresh_s}")
        self._source = source
        self._ideal = ideal_step_time_s
        self._min_refresh_ns = round(min_refresh_s * 1e9)
        self._lock = threading.Lock()
        self._snap: list[JobSnapshot] = []
        self._snap_ns: int | None = None
        #: Number of failed calls of the source.
        self.errors = 0
        meter = (meter_provider or otel_metrics.get_meter_provider()).get_meter(METER_NAME)
        observers = {
            "goodput.goodput": self._obs_goodput,
            "goodput.productive_time": self._obs_productive,
            "goodput.badput_time": self._obs_badput,
            "goodput.elapsed_time": self._obs_elapsed,
            "goodput.disruptions": self._obs_disruptions,
            "goodput.max_productive_step": self._obs_max_step,
            "goodput.ideal_step_time": self._obs_ideal,
            "goodput.step_time_deviation": self._obs_deviation,
            "goodput.anomalous_steps": self._obs_anomalous,
            "goodput.mfu": self._obs_mfu,
            "goodput.useful_compute": self._obs_useful,
            "goodput.warnings": self._obs_warnings,
            "goodput.job.over_limit": self._obs_over_limit,
            "goodput.window.goodput": self._obs_w_goodput,
            "goodput.window.productive_time": self._obs_w_productive,
            "goodput.window.badput_time": self._obs_w_badput,
            "goodput.straggler.step_time_ratio": self._obs_straggler,  # --- stragglers
            "goodput.host.badput_time": self._obs_host_badput,  # --- recovery, attribution
            "goodput.recovery.phase_time": self._obs_recovery,
            "goodput.elastic.stepping_slice_efficiency": self._obs_stepping,  # --- elastic
            "goodput.elastic.available_slice_efficiency": self._obs_available,
        }
        first = True
        for name, fn in observers.items():
            unit, desc = METRIC_NAMES[name]
            meter.create_observable_gauge(name, [self._callback(fn, first)], unit, desc)
            first = False
        #: Failed accountings per job name (its result is then left out of the gauges).
        self.job_errors: dict[str, int] = {}
        meter.create_observable_counter(
            "goodput.job.errors", [self._obs_job_errors], "{error}",
            "Collections in which the job could not be accounted (its other metrics are "
            "absent then; the other jobs are unaffected)")

    # -- snapshot --------------------------------------------------------------------
    def refresh(self) -> list[JobSnapshot]:
        """Call the source now and keep its answer; returns it (errors: see the class).

        Each job is converted on its own: one whose accounting raises is counted in
        :attr:`job_errors` and left out, and the others are published as usual.
        """
        try:
            snaps = []
            for x in self._source():
                if not isinstance(x, (JobSnapshot, JobResult, JobSpans)):
                    raise TypeError(f"source item must be JobSpans, JobSnapshot or "
                                    f"JobResult, got {type(x).__name__}")
                try:
                    snaps.append(self._to_snapshot(x))
                except Exception:  # one job's spans must not take the others' metrics
                    name = x.name if isinstance(x, JobSpans) else (
                        x.job if isinstance(x, JobResult) else x.result.job)
                    self.job_errors[name] = self.job_errors.get(name, 0) + 1
                    log.exception("goodput metrics: accounting job %r failed", name)
                    continue
                if snaps[-1].result.error is not None:
                    name = snaps.pop().result.job
                    self.job_errors[name] = self.job_errors.get(name, 0) + 1
        except Exception:  # a broken source must not break the exporter
            self.errors += 1
            log.exception("goodput metrics: the source failed; reporting the last values")
            return self._snap
        with self._lock:
            self._snap, self._snap_ns = snaps, time.monotonic_ns()
        return snaps

    def _to_snapshot(self, item) -> JobSnapshot:
        if isinstance(item, JobSnapshot):
            return item
        if isinstance(item, JobResult):
            return JobSnapshot(item)
        if isinstance(item, JobSpans):
            return snapshot(item, self.windows_s, self._ideal)
        raise TypeError(f"source item must be JobSpans, JobSnapshot or JobResult, "
                        f"got {type(item).__name__}")

    def _current(self, refresh: bool) -> list[JobSnapshot]:
        with self._lock:
            fresh = (self._snap_ns is not None
                     and time.monotonic_ns() - self._snap_ns < self._min_refresh_ns)
            if self._snap_ns is not None and (fresh or not refresh):
                return self._snap
        return self.refresh()

    def _callback(self, fn, first: bool):
        def cb(options: CallbackOptions):
            out = []
            for s in self._current(refresh=first):
                out.extend(fn(s, {ATTR_JOB: s.result.job}))
            return out

        return cb

    # -- observers: (snapshot, base attributes) -> observations ----------------------
    @staticmethod
    def _obs_goodput(s, a):
        return [Observation(s.result.goodput, a)]

    @staticmethod
    def _obs_productive(s, a):
        return [Observation(s.result.productive_time_s, a)]

    @staticmethod
    def _obs_badput(s, a):
        return [Observation(v, {**a, ATTR_BUCKET: k}) for k, v in s.result.badput_s.items()]

    @staticmethod
    def _obs_elapsed(s, a):
        return [Observation(s.result.total_time_s, a)]

    @staticmethod
    def _obs_disruptions(s, a):
        return [Observation(s.result.disruptions, a)]

    @staticmethod
    def _obs_max_step(s, a):
        m = s.result.max_productive_step
        return [] if m is None else [Observation(m, a)]

    @staticmethod
    def _obs_ideal(s, a):
        t = s.result.ideal_step_time_s
        return [] if t is None else [Observation(t, a)]

    @staticmethod
    def _obs_deviation(s, a):
        ideal = s.result.ideal_step_time_s
        if ideal is None:
            return []
        values = s.result.steps.time_quantiles_s([q for _, q in _STATS])
        return [Observation(float(v) - ideal, {**a, ATTR_STATISTIC: n})
                for (n, _), v in zip(_STATS, values, strict=True)]

    @staticmethod
    def _obs_mfu(s, a):
        m = s.result.mfu
        return [] if m is None else [Observation(m, a)]

    @staticmethod
    def _obs_useful(s, a):
        u = s.result.useful_compute
        return [] if u is None else [Observation(u, a)]

    @staticmethod
    def _obs_warnings(s, a):
        counts: dict[str, int] = {}
        for w in s.result.warnings:
            counts[w.code] = counts.get(w.code, 0) + 1
        return [Observation(n, {**a, ATTR_WARNING_CODE: code}) for code, n in counts.items()]

    @staticmethod
    def _obs_over_limit(s, a):
        return [Observation(n, {**a, ATTR_LIMIT: limit})
                for limit, n in sorted(s.result.over_limit.items())]

    def _obs_job_errors(self, options: CallbackOptions):
        self._current(refresh=False)
        return [Observation(n, {ATTR_JOB: job}) for job, n in sorted(self.job_errors.items())]

    @staticmethod
    def _obs_anomalous(s, a):
        return [Observation(s.result.step_time.anomalous_steps, a)]

    # --- stragglers: absent with fewer than two host processes
    @staticmethod
    def _obs_straggler(s, a):
        st = getattr(s.result, "stragglers", None)
        if st is None:
            return []
        return [Observation(h.ratio, {**a, ATTR_HOST: h.host or "", ATTR_PROCESS: h.process,
                                      ATTR_RANK: rank})
                for rank, h in enumerate(st.slowest, 1)]
    # --- end stragglers

    # --- recovery and badput by host: absent without disruptions / attributed badput
    @staticmethod
    def _obs_host_badput(s, a):
        out = []
        for h in (*getattr(s.result, "host_badput", ()),
                  *getattr(s.result, "host_badput_inferred", ())):
            base = {**a, ATTR_HOST: h.host or "", ATTR_PROCESS: h.process,
                    ATTR_EVIDENCE: getattr(h, "evidence", "observed")}
            if h.slowdown_s > 0:
                out.append(Observation(h.slowdown_s, {**base, ATTR_CAUSE: "training_slowdown"}))
            if h.disruptions_caused:
                out.append(Observation(h.badput_s - h.slowdown_s,
                                       {**base, ATTR_CAUSE: "disruptions"}))
        return out

    @staticmethod
    def _obs_recovery(s, a):
        sums: dict[str, float] = {}
        for rec in getattr(s.result, "recovery", ()):
            for k, v in rec.phases.items():
                if v is not None:
                    sums[k] = sums.get(k, 0.0) + v
        return [Observation(v, {**a, ATTR_PHASE: k}) for k, v in sums.items()]
    # --- end recovery

    # --- elastic: absent without slice-count records
    @staticmethod
    def _obs_stepping(s, a):
        e = getattr(s.result, "slice_efficiency", None)
        return [] if e is None else [Observation(e.stepping, a)]

    @staticmethod
    def _obs_available(s, a):
        e = getattr(s.result, "slice_efficiency", None)
        return [] if e is None else [Observation(e.available, a)]
    # --- end elastic

    @staticmethod
    def _obs_w_goodput(s, a):
        return [Observation(w.goodput, {**a, ATTR_WINDOW: _window_attr(w.window_s)})
                for w in s.windows]

    @staticmethod
    def _obs_w_productive(s, a):
        return [Observation(w.productive_time_s, {**a, ATTR_WINDOW: _window_attr(w.window_s)})
                for w in s.windows]

    @staticmethod
    def _obs_w_badput(s, a):
        return [Observation(v, {**a, ATTR_WINDOW: _window_attr(w.window_s), ATTR_BUCKET: k})
                for w in s.windows for k, v in w.badput_s.items()]
