"""``GoodputCalculator``: the query API of Google's ``ml-goodput-measurement``, on this project.

Analysis scripts and monitors written for ``ml_goodput_measurement.goodput.GoodputCalculator``
switch by changing the import; the calculator reads the run directory the recorder writes
(or one made by ``goodput import``) instead of Cloud Logging::

    from goodput_processor.compat import BadputType, GoodputCalculator

    calc = GoodputCalculator(job_name=run_name, logger_name=f"goodput_{run_name}")
    goodput, badput, last_step = calc.get_job_goodput(include_badput_breakdown=True)
    print(f"{goodput:.2f}% goodput, {badput[BadputType.TPU_INITIALIZATION]:.2f}% tpu init")

Return shapes are the incumbent's (0.2.3): percentages (0..100), ``BadputType`` keys with
``CUSTOM_BADPUT_EVENTS`` a nested ``{TYPE: percent}``, step deviations in seconds. The
numbers are this project's model (``definitions="goodput"``, the default: slow steps are
``BadputType.TRAINING_SLOWDOWN``, a key the incumbent does not have) or the incumbent's own
definitions (``definitions="mgm"``, ``docs/definitions.md``). Spans are read incrementally:
each query reads only what the recorder appended since the last one.
"""

from __future__ import annotations

import datetime as _dt
import enum
import os

import numpy as np

from goodput import schema

from .timeline import NONE

__all__ = ["BadputType", "GoodputCalculator", "GoodputType", "IntervalMetricType", "MetricType"]


class BadputType(enum.Enum):
    """Badput buckets, with the names and values of ``ml_goodput_measurement`` 0.2.3's enum.

    ``TRAINING_SLOWDOWN`` is this project's own (slow steps beyond the ideal step time;
    the incumbent counts them as productive) and appears only with ``definitions="goodput"``.
    """

    TPU_INITIALIZATION = 1
    TRAINING_PREP = 2
    PROGRAM_STARTUP = 3
    DATA_LOADING_SYNC = 4
    DATA_LOADING_ASYNC = 5
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME = 6
    UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME = 7
    WASTED_PROGRESS_FROM_DISRUPTION = 8
    INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION = 9
    CUSTOM_BADPUT_EVENTS = 10
    OTHER = 11
    ELASTIC_SLICE_DOWN = 12
    ELASTIC_SCALE_UP = 13
    ELASTIC_REINITIALIZATION = 14
    TRAINING_SLOWDOWN = 15


class GoodputType(enum.Enum):
    """Kinds of goodput (the incumbent has one)."""

    TOTAL = 1


class MetricType(enum.Enum):
    """Keys of :meth:`GoodputCalculator.get_job_goodput_details` (the incumbent's values)."""

    GOODPUT_TIME = "goodput_time"
    BADPUT_TIME = "badput_time"
    MAX_PRODUCTIVE_STEP = "max_productive_step"
    TOTAL_ELAPSED_TIME = "total_elapsed_time"
    DISRUPTION_COUNT = "disruption_count"
    STEP_TIME_DEVIATION = "step_time_deviation"
    IDEAL_STEP_TIME = "ideal_step_time"
    TOTAL_EXCLUDED_TIME = "total_excluded_time"


class IntervalMetricType(enum.Enum):
    """Keys of :meth:`GoodputCalculator.get_interval_metric_details`."""

    INTERVAL_GOODPUT = "interval_goodput"
    INTERVAL_BADPUT = "interval_badput"
    INTERVAL_SIZE = "interval_size"


#: This project's buckets -> the incumbent's badput types.
_BUCKET_TYPE = {
    "process_startup": BadputType.OTHER,  # mgm has no such type: it is part of its OTHER
    "accelerator_init": BadputType.TPU_INITIALIZATION,
    "training_prep": BadputType.TRAINING_PREP,
    "program_startup": BadputType.PROGRAM_STARTUP,
    "data_loading": BadputType.DATA_LOADING_SYNC,
    "checkpoint_save": BadputType.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME,
    "checkpoint_restore": BadputType.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME,
    "wasted_progress": BadputType.WASTED_PROGRESS_FROM_DISRUPTION,
    "infrastructure_recovery": BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION,
    "training_slowdown": BadputType.TRAINING_SLOWDOWN,
    "other": BadputType.OTHER,
}
_NS = 1_000_000_000


def _to_ns(t) -> int:
    """A datetime (naive = UTC, as the incumbent assumes) or POSIX seconds -> ns."""
    if isinstance(t, _dt.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
        return round(t.timestamp() * _NS)
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return round(t * _NS)
    raise TypeError(f"expected a datetime or POSIX seconds, got {type(t).__name__}: {t!r}")


def _breakdown(buckets_ns: dict[str, int], async_s: dict[str, float], total_ns: int,
               scale: float) -> dict:
    """Bucket ns -> ``{BadputType: value}`` with custom types nested; ``scale`` per ns."""
    out: dict = {}
    custom: dict[str, float] = {}
    for name, ns in buckets_ns.items():
        if name == schema.PRODUCTIVE:
            continue
        if name.startswith(schema.CUSTOM_PREFIX):
            key = name[len(schema.CUSTOM_PREFIX):].upper()
            custom[key] = custom.get(key, 0.0) + ns * scale
        else:
            key = _BUCKET_TYPE[name]
            out[key] = out.get(key, 0.0) + ns * scale
    out[BadputType.DATA_LOADING_ASYNC] = async_s.get("data_loading", 0.0) * _NS * scale
    out[BadputType.CUSTOM_BADPUT_EVENTS] = custom
    return out


class GoodputCalculator:
    """Drop-in for ``ml_goodput_measurement.goodput.GoodputCalculator`` (0.2.3 signatures).

    Args:
        job_name: the job (run) name, as given to the recorder.
        logger_name, cloud_logger, using_pathways, max_logs_retention_period, gcs_path,
            cache_dir: accepted for compatibility; unused (there is no Cloud Logging).
        run_dir: the run directory to read; default ``GOODPUT_RUN_DIR``, else
            ``goodput-runs/<job>`` (where the recorder writes by default).
        definitions: ``"goodput"`` (this project's model, default) or ``"mgm"`` (the
            incumbent's own definitions on the same timeline).

    Raises:
        ValueError: unknown ``definitions``.
    """

    def __init__(self, job_name: str, logger_name: str | None = None, cloud_logger=None,
                 using_pathways: bool = False, max_logs_retention_period=None,
                 gcs_path: str | None = None, cache_dir: str | None = None, *,
                 run_dir: str | os.PathLike | None = None, definitions: str = "goodput"):
        if definitions not in ("goodput", "mgm"):
            raise ValueError(f"definitions must be 'goodput' or 'mgm', got {definitions!r}")
        from .serve.store import LiveStore
        from .serve.tail import SpoolTailer

        self.job_name = job_name
        self.logger_name = logger_name
        self.using_pathways = using_pathways
        self.definitions = definitions
        if run_dir is None:
            run_dir = os.environ.get("GOODPUT_RUN_DIR") or schema.default_run_dir(job_name)
        self.run_dir = os.fspath(run_dir)
        self._store = LiveStore()
        self._tailer = SpoolTailer(self._store, [self.run_dir])

    # --- reading -------------------------------------------------------------------

    def _job(self):
        """The job's spans so far (reads what was appended since the last query)."""
        self._tailer.poll()
        if self.job_name not in self._store.jobs():
            known = ", ".join(self._store.jobs()) or "none"
            raise ValueError(
                f"no spans of job {self.job_name!r} in {self.run_dir} (jobs there: {known}); "
                "pass run_dir= the directory given to goodput.configure(run_dir=...)"
            )
        return self._store.snapshot(self.job_name)

    def _account(self, ideal_s=None):
        from .accounting import account

        return account(self._job(), ideal_step_time_s=ideal_s)

    def _mgm(self, interval_ns=None, ideal_s=None):
        from .definitions.mgm import account_mgm

        return account_mgm(self._job(), interval_ns=interval_ns, ideal_step_time_s=ideal_s)

    @staticmethod
    def _mgm_breakdown(values: dict[str, float], custom: dict[str, float]) -> dict:
        out = {BadputType[k]: float(v) for k, v in values.items() if k != "CUSTOM_BADPUT_EVENTS"}
        out[BadputType.CUSTOM_BADPUT_EVENTS] = dict(custom)
        return out

    # --- the incumbent's API -----------------------------------------------------------

    def get_job_goodput(self, include_badput_breakdown: bool = False,
                        configured_ideal_step_time: float | None = None):
        """Cumulative goodput of the job so far.

        Returns:
            ``(goodput_percent, badput_breakdown, last_step)``: goodput in percent of the
            total time, ``{BadputType: percent}`` (``{}`` unless
            ``include_badput_breakdown``; ``CUSTOM_BADPUT_EVENTS`` maps upper-cased custom
            types to percent) and the highest productive step (0 if none).

        Raises:
            ValueError: no spans of the job in the run directory, or total time zero.
        """
        if self.definitions == "mgm":
            m = self._mgm(ideal_s=configured_ideal_step_time)
            pct = m.badput_percent
            breakdown = (self._mgm_breakdown(
                {k: v for k, v in pct.items() if not isinstance(v, dict)},
                pct.get("CUSTOM_BADPUT_EVENTS", {})) if include_badput_breakdown else {})
            return m.goodput * 100, breakdown, int(m.max_productive_step or 0)
        r = self._account(configured_ideal_step_time)
        if not r.total_ns:
            raise ValueError(f"total time of job {self.job_name!r} is zero: no attempt spans")
        breakdown = (_breakdown(r.buckets_ns, r.async_work_s, r.total_ns, 100 / r.total_ns)
                     if include_badput_breakdown else {})
        return r.goodput * 100, breakdown, int(r.max_productive_step or 0)

    def get_job_goodput_interval(self, interval_start, interval_end):
        """Goodput of the job within ``[interval_start, interval_end]``.

        Args:
            interval_start, interval_end: datetimes (naive ones are UTC) or POSIX seconds.

        Returns:
            ``(goodput_percent, badput_breakdown_percent, last_step, total_time_s,
            disruptions)``: percentages of the interval's time (the part of it the job ran),
            the highest productive step started before the interval's end, the interval's
            time in seconds, and the number of restarts within it.

        Raises:
            ValueError: the interval does not overlap the job, or no spans of the job.
        """
        start_ns, end_ns = _to_ns(interval_start), _to_ns(interval_end)
        if self.definitions == "mgm":
            m = self._mgm(interval_ns=(start_ns, end_ns))
            pct = m.badput_percent
            breakdown = self._mgm_breakdown(
                {k: v for k, v in pct.items() if not isinstance(v, dict)},
                pct.get("CUSTOM_BADPUT_EVENTS", {}))
            return (m.goodput * 100, breakdown, int(m.max_productive_step or 0),
                    m.total_time_s, m.disruptions)
        from .windows import account_interval

        r, w = account_interval(self._job(), start_ns, end_ns)
        st = r.steps
        sel = (st.start_ns < w.end_ns) & (st.step != NONE)
        last = int(st.step[sel].max()) if sel.any() else 0
        restarts = sum(1 for a in r.attempts[1:] if w.start_ns < a.start_ns <= w.end_ns)
        async_s = {}  # asynchronous work is not clipped to intervals: left out here
        breakdown = _breakdown(w.buckets_ns, async_s, w.total_ns, 100 / w.total_ns)
        return w.goodput * 100, breakdown, last, w.total_ns / _NS, restarts

    def get_step_deviation(self, configured_ideal_step_time: float | None = None
                           ) -> dict[int, float]:
        """``{step: |step time - ideal step time|}`` in seconds, for every kept step.

        The ideal step time is ``configured_ideal_step_time`` (seconds) or estimated (this
        project: median of kept step times; ``definitions="mgm"``: the incumbent's
        estimate, which ignores steps shorter than 1 s).

        Raises:
            ValueError: no step times, or no ideal step time can be estimated.
        """
        if self.definitions == "mgm":
            m = self._mgm(ideal_s=configured_ideal_step_time)
            if not m.step_deviation_s:
                raise ValueError(
                    f"no step time deviation for job {self.job_name!r}: no consecutive steps, "
                    "or no ideal step time (the mgm estimate ignores steps shorter than 1 s)")
            return dict(m.step_deviation_s)
        r = self._account(configured_ideal_step_time)
        st = r.steps
        sel = (st.step != NONE) & ~np.isnan(st.deviation_s)
        if not sel.any():
            raise ValueError(f"no step times for job {self.job_name!r}")
        return {int(s): abs(float(d)) for s, d in zip(st.step[sel], st.deviation_s[sel],
                                                      strict=True)}

    def get_job_goodput_details(self) -> dict:
        """The incumbent's ``WorkloadMetricDetails``: ``{MetricType value: ...}`` with
        productive time ``{GoodputType.TOTAL: seconds}``, badput ``{BadputType: seconds}``,
        max productive step, total elapsed seconds, disruptions, step deviations (seconds),
        ideal step time (seconds, 0.0 if unknown) and excluded time (always 0.0)."""
        r = self._account()
        st = r.steps
        sel = (st.step != NONE) & ~np.isnan(st.deviation_s)
        return {
            MetricType.GOODPUT_TIME.value: {GoodputType.TOTAL: r.productive_time_s},
            MetricType.BADPUT_TIME.value: _breakdown(r.buckets_ns, r.async_work_s, r.total_ns,
                                                     1 / _NS),
            MetricType.MAX_PRODUCTIVE_STEP.value: int(r.max_productive_step or 0),
            MetricType.TOTAL_ELAPSED_TIME.value: r.total_time_s,
            MetricType.DISRUPTION_COUNT.value: r.disruptions,
            MetricType.STEP_TIME_DEVIATION.value: {
                int(s): abs(float(d)) for s, d in zip(st.step[sel], st.deviation_s[sel],
                                                      strict=True)},
            MetricType.IDEAL_STEP_TIME.value: r.ideal_step_time_s or 0.0,
            MetricType.TOTAL_EXCLUDED_TIME.value: 0.0,
        }

    def get_interval_metric_details(self, interval_start, interval_end) -> dict:
        """The incumbent's ``IntervalWorkloadMetricDetails`` for the interval: goodput
        ``{GoodputType.TOTAL: percent}``, badput ``{BadputType: percent}`` and the interval
        size in whole seconds; empty dicts when the interval does not overlap the job."""
        size = int((_to_ns(interval_end) - _to_ns(interval_start)) // _NS)
        try:
            goodput, badput, *_ = self.get_job_goodput_interval(interval_start, interval_end)
        except ValueError:
            return {IntervalMetricType.INTERVAL_GOODPUT.value: {},
                    IntervalMetricType.INTERVAL_BADPUT.value: {},
                    IntervalMetricType.INTERVAL_SIZE.value: size}
        return {IntervalMetricType.INTERVAL_GOODPUT.value: {GoodputType.TOTAL: goodput},
                IntervalMetricType.INTERVAL_BADPUT.value: badput,
                IntervalMetricType.INTERVAL_SIZE.value: size}
