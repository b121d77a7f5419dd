"""``ml_goodput_measurement.goodput`` (0.2.3): ``GoodputRecorder`` and ``GoodputCalculator``.

Code written for the incumbent switches by changing its import::

    from goodput.mgm import goodput          # was: from ml_goodput_measurement import goodput

    recorder = goodput.GoodputRecorder(job_name=run_name, logger_name=f"goodput_{run_name}",
                                       logging_enabled=(jax.process_index() == 0))
    recorder.record_job_start_time(datetime.datetime.now())
    ...
    calculator = goodput.GoodputCalculator(job_name=run_name, logger_name=f"goodput_{run_name}")
    percent, badput, last_step = calculator.get_job_goodput(include_badput_breakdown=True)

Same class names, positional and keyword arguments, defaults, method names and return
shapes (percentages 0..100, :class:`BadputType` keys with ``CUSTOM_BADPUT_EVENTS`` nested
by upper-cased type, seconds in the details). What differs is where the data lives: the
recorder writes spans (the local spool, any configured exporter) instead of Cloud Logging
entries, and the calculator reads them.

**Where ``logger_name`` points.** The incumbent's log is named by ``logger_name`` (and the
job by ``job_name``). Here the log is the job's *run directory*: ``run_dir=`` (keyword, on
both classes) if given, else ``GOODPUT_RUN_DIR``, else ``goodput-runs/<job_name>``
(:func:`goodput.schema.default_run_dir`). ``logger_name`` is accepted and kept but picks
nothing: recorder, calculator and monitor find the same directory from the job name,
without configuration, as the incumbent's do from ``logger_name``.

**Whose numbers.** By default the calculator answers with the incumbent's own definitions
(``definitions="mgm"``): the numbers, the keys (exactly the :class:`BadputType` members
0.2.3 returns) and the errors of ``ml-goodput-measurement`` 0.2.3 on the same calls, equal
to ``goodput report --definitions mgm`` and to :class:`goodput.mgm.monitoring.GoodputMonitor`'s
scalars at the same query time, so a dashboard does not jump when the import changes. This
project's own model is one argument away, ``definitions="goodput"`` (productive time from
step ends, slow steps as ``BadputType.TRAINING_SLOWDOWN``, a key 0.2.3 does not have;
``docs/definitions.md``). The processor (``goodput_processor``) does the accounting; it is
imported when a calculator is first queried, never when this module is imported.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from typing import Union

from goodput.mgm import goodput_utils
from goodput.mgm.recording import GoodputRecorder, run_dir_of

__all__ = [
    "BadputType", "GoodputCalculator", "GoodputInfo", "GoodputRecorder", "GoodputType",
    "IntervalMetricType", "IntervalWorkloadMetricDetails", "MetricType", "StepInfo",
    "UnproductiveTimeDict", "WorkloadMetricDetails", "compute_ideal_step_time",
    "get_extra_time_from_anomalous_steps", "get_timestamp_from_log_entry",
]

log = logging.getLogger(__name__)

BadputType = goodput_utils.BadputType
GoodputType = goodput_utils.GoodputType
GoodputInfo = goodput_utils.GoodputInfo
MetricType = goodput_utils.MetricType
IntervalMetricType = goodput_utils.IntervalMetricType
StepInfo = goodput_utils.StepInfo
WorkloadMetricDetails = goodput_utils.WorkloadMetricDetails
IntervalWorkloadMetricDetails = goodput_utils.IntervalWorkloadMetricDetails
get_timestamp_from_log_entry = goodput_utils.get_timestamp_from_log_entry
get_extra_time_from_anomalous_steps = goodput_utils.get_extra_time_from_anomalous_steps
compute_ideal_step_time = goodput_utils.compute_ideal_step_time
#: ``{BadputType: seconds or percent}``, ``CUSTOM_BADPUT_EVENTS`` -> ``{TYPE: value}``.
UnproductiveTimeDict = dict[BadputType, Union[float, dict[str, float]]]  # noqa: UP007

_NS = 1_000_000_000
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def to_ns(t) -> int:
    """A datetime (naive = UTC, as the incumbent's queries take it) or POSIX seconds -> ns.

    Raises:
        TypeError: neither (the message names the value).
    """
    if isinstance(t, _dt.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
        d = t - _EPOCH
        return (d.days * 86_400 + d.seconds) * _NS + d.microseconds * 1000
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return round(t * _NS)
    raise TypeError(f"expected a datetime or POSIX seconds, got {type(t).__name__}: {t!r}")


def _enum_badput(d: dict) -> dict:
    """Name-keyed badput (``goodput_processor.exporters.workload``) -> ``{BadputType: ...}``."""
    return {BadputType[k]: (dict(v) if isinstance(v, dict) else float(v)) for k, v in d.items()}


class GoodputCalculator:
    """Drop-in for ``ml_goodput_measurement.goodput.GoodputCalculator`` (0.2.3 signatures),
    over the job's run directory.

    Args:
        job_name: the job (run) name, as given to the recorder.
        logger_name, cloud_logger, max_logs_retention_period, gcs_path, cache_dir: accepted
            for compatibility; unused (no Cloud Logging, no cache files).
        using_pathways: kept as the attribute of that name. The incumbent's 0.2.3 calculator
            stores it and computes nothing differently with it; neither does this one (its
            anomalous-step discount for Pathways went away in 0.1; this project counts slow
            steps as ``training_slowdown`` for every job, in the goodput model).
        run_dir: the run directory (default: see the module docstring).
        definitions: ``"mgm"`` (default: the incumbent's rules, numbers and keys on the
            same spans, as ``goodput report --definitions mgm``) or ``"goodput"`` (this
            project's model; its breakdown adds ``BadputType.TRAINING_SLOWDOWN``).
        query_time: answer as of this moment: a datetime (naive = UTC), POSIX seconds, or a
            callable returning one, called at each query (None: the spans as they are). As
            ``goodput report --at``: later spans are left out and, with ``"mgm"``, a job
            without ``job_end_time`` is measured up to it (the incumbent's "now"; without
            ``query_time`` it is measured up to the last moment it was seen alive).

    Each query reads only what the recorder appended since the last one.

    Raises:
        ValueError: unknown ``definitions``.
    """

    #: ``ElasticGoodputCalculator`` answers with the incumbent's elastic rules.
    _elastic = False

    def __init__(self, job_name: str, logger_name: str | None = None, cloud_logger=None,
                 using_pathways: bool = False, max_logs_retention_period=None,
                 gcs_path: str | None = None, cache_dir: str = "/tmp", *,
                 run_dir: str | os.PathLike | None = None, definitions: str = "mgm",
                 query_time=None):
        if definitions not in ("goodput", "mgm"):
            raise ValueError(f"definitions must be 'goodput' or 'mgm', got {definitions!r}")
        self.job_name = job_name
        self.logger_name = logger_name
        self.using_pathways = using_pathways
        self.definitions = definitions
        self.query_time = query_time
        self.run_dir = run_dir_of(job_name, run_dir)
        self._store = self._tailer = None
        self._mgm_memo = None  # definitions='mgm': kept from query to query

    # --- reading ----------------------------------------------------------------------------

    def _query_ns(self) -> int | None:
        q = self.query_time() if callable(self.query_time) else self.query_time
        return None if q is None else to_ns(q)

    def _job(self):
        """``(job spans, query time ns or None)``: reads what was appended since the last
        query, then takes the job as of the query time."""
        if self._tailer is None:
            from goodput_processor.mgm_entry import LiveStore, SpoolTailer

            self._store = LiveStore()
            self._tailer = SpoolTailer(self._store, [self.run_dir])
        self._tailer.poll()
        if self.job_name not in self._store.jobs():
            known = ", ".join(self._store.jobs()) or "none"
            raise ValueError(
                f"no spans of job {self.job_name!r} in {self.run_dir} (jobs there: {known}); "
                "pass run_dir= the directory given to goodput.configure(run_dir=...)")
        js = self._store.snapshot(self.job_name)
        at = self._query_ns()
        if at is not None:
            from goodput_processor.mgm_entry import as_of

            js = as_of(js, at)
        return js, at

    def _mgm(self, interval_ns=None, ideal_s=None):
        from goodput_processor.mgm_entry import account_mgm

        js, at = self._job()
        # The tailed spool's rows only grow at the end: what new spans cannot change comes
        # from the memo (not as of a query time, which cuts spans that later go on).
        memo = None
        if self.query_time is None:
            if self._mgm_memo is None:
                from goodput_processor.mgm_entry import AccountingMemo

                self._mgm_memo = AccountingMemo()
            memo = self._mgm_memo
        return account_mgm(js, interval_ns=interval_ns, now_ns=at, ideal_step_time_s=ideal_s,
                           elastic=self._elastic, memo=memo)

    def _account(self, ideal_s=None):
        from goodput_processor.mgm_entry import account

        self._job()  # (makes the store)
        with self._store.memo(self.job_name) as memo:  # what new spans cannot change
            js, at = self._job()
            return account(js, ideal_step_time_s=ideal_s, now_ns=at, memo=memo)

    # --- the incumbent's API --------------------------------------------------------------

    def get_job_goodput(self, include_badput_breakdown: bool = False,
                        configured_ideal_step_time: float | None = None):
        """Cumulative goodput of the job so far.

        Returns:
            ``(goodput_percent, badput_breakdown, last_step)``: goodput in percent of the
            total time, ``{BadputType: percent}`` (``{}`` unless
            ``include_badput_breakdown``; ``CUSTOM_BADPUT_EVENTS`` maps upper-cased custom
            types to percent) and the highest productive step (0 if none).

        Raises:
            ValueError: no spans of the job in the run directory, total time zero, or (with
                ``"mgm"``) the incumbent's own "productive training time is invalid".
        """
        if self.definitions == "mgm":
            m = self._mgm(ideal_s=configured_ideal_step_time)
            breakdown = _enum_badput(m.badput_percent) if include_badput_breakdown else {}
            return m.goodput_percent, breakdown, int(m.max_productive_step or 0)
        from goodput_processor.mgm_entry import native_breakdown

        r = self._account(configured_ideal_step_time)
        if not r.total_ns:
            raise ValueError(f"total time of job {self.job_name!r} is zero: no attempt spans")
        breakdown = (_enum_badput(native_breakdown(r.buckets_ns, r.async_work_s,
                                                   100 / r.total_ns))
                     if include_badput_breakdown else {})
        return r.goodput * 100, breakdown, int(r.max_productive_step or 0)

    def get_job_goodput_interval(self, interval_start, interval_end):
        """Goodput of the job within ``[interval_start, interval_end]``.

        Args:
            interval_start, interval_end: datetimes (naive ones are UTC) or POSIX seconds.

        Returns:
            ``(goodput_percent, badput_breakdown_percent, last_step, total_time_s,
            disruptions)``: percentages of the interval's time (the part of it the job ran),
            the highest productive step (this project: started before the interval's end),
            the interval's time in seconds, and the number of restarts within it.

        Raises:
            ValueError: the interval does not overlap the job, or no spans of the job.
        """
        start_ns, end_ns = to_ns(interval_start), to_ns(interval_end)
        if self.definitions == "mgm":
            m = self._mgm(interval_ns=(start_ns, end_ns))
            return (m.goodput_percent, _enum_badput(m.badput_percent),
                    int(m.max_productive_step or 0), m.total_time_s, m.disruptions)
        from goodput_processor.mgm_entry import NONE, account_interval, native_breakdown

        js, at = self._job()
        r, w = account_interval(js, start_ns, end_ns, now_ns=at)
        st = r.steps
        sel = (st.start_ns < w.end_ns) & (st.step != NONE)
        last = int(st.step[sel].max()) if sel.any() else 0
        restarts = sum(1 for a in r.attempts[1:] if w.start_ns < a.start_ns <= w.end_ns)
        # asynchronous work is not clipped to intervals: left out here
        breakdown = _enum_badput(native_breakdown(w.buckets_ns, {}, 100 / w.total_ns))
        return w.goodput * 100, breakdown, last, w.total_ns / _NS, restarts

    def get_step_deviation(self, configured_ideal_step_time: float | None = None
                           ) -> dict[int, float]:
        """``{step: |step time - ideal step time|}`` in seconds, for every kept step.

        The ideal step time is ``configured_ideal_step_time`` (seconds) or estimated (this
        project: median of kept step times; ``"mgm"``: the incumbent's estimate, which
        ignores steps shorter than 1 s).

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
        from goodput_processor.mgm_entry import details

        d = details(self._account(configured_ideal_step_time))["step_time_deviation"]
        if not d:
            raise ValueError(f"no step times for job {self.job_name!r}")
        return d

    def _details(self, result) -> dict:
        from goodput_processor.mgm_entry import details

        d = details(result)
        if not self._elastic:  # the incumbent's base calculator has no slice efficiency
            d.pop("stepping_slice_efficiency", None)
            d.pop("available_slice_efficiency", None)
        d["goodput_time"] = {GoodputType.TOTAL: d["goodput_time"]["TOTAL"]}
        d["badput_time"] = _enum_badput(d["badput_time"])
        return d

    def get_job_goodput_details(self) -> WorkloadMetricDetails:
        """The incumbent's ``WorkloadMetricDetails`` (what its monitor uploads): productive
        time ``{GoodputType.TOTAL: seconds}``, badput ``{BadputType: seconds}``, max
        productive step, total elapsed seconds, disruptions, step deviations (seconds),
        ideal step time (seconds, 0.0 if unknown), excluded time (0.0); for an elastic
        calculator also the two slice efficiencies (fractions) when slice counts were
        recorded. As the incumbent, the zero details when nothing can be computed (no
        spans yet: logged)."""
        try:
            if self.definitions == "mgm":
                result = self._mgm()
            else:
                result = self._account()
            return self._details(result)
        except ValueError as e:
            log.warning("goodput information unavailable: %s", e)
            return {MetricType.GOODPUT_TIME.value: {}, MetricType.BADPUT_TIME.value: {},
                    MetricType.MAX_PRODUCTIVE_STEP.value: 0,
                    MetricType.TOTAL_ELAPSED_TIME.value: 0.0,
                    MetricType.DISRUPTION_COUNT.value: 0,
                    MetricType.STEP_TIME_DEVIATION.value: {},
                    MetricType.IDEAL_STEP_TIME.value: 0.0,
                    MetricType.TOTAL_EXCLUDED_TIME.value: 0.0}

    def get_interval_metric_details(self, interval_start, interval_end
                                    ) -> IntervalWorkloadMetricDetails:
        """The incumbent's ``IntervalWorkloadMetricDetails`` for the interval: goodput
        ``{GoodputType.TOTAL: percent}``, badput ``{BadputType: percent}`` and the interval
        size in whole seconds (empty dicts when the interval has no number); for an elastic
        calculator also the slice efficiencies over the interval."""
        from goodput_processor.mgm_entry import interval_details

        start_ns, end_ns = to_ns(interval_start), to_ns(interval_end)
        size = int((end_ns - start_ns) // _NS)
        try:
            if self.definitions == "mgm":
                d = interval_details(self._mgm(interval_ns=(start_ns, end_ns)), size)
            else:
                from goodput_processor.mgm_entry import account_interval

                js, at = self._job()
                d = interval_details(account_interval(js, start_ns, end_ns, now_ns=at)[1],
                                     size)
        except ValueError as e:
            log.warning("failed to get interval metric details: %s", e)
            d = interval_details(None, size)
        if not self._elastic:
            d.pop("stepping_slice_efficiency", None)
            d.pop("available_slice_efficiency", None)
        if d["interval_goodput"]:
            d["interval_goodput"] = {GoodputType.TOTAL: d["interval_goodput"]["TOTAL"]}
            d["interval_badput"] = _enum_badput(d["interval_badput"])
        return d

    def get_job_goodput_with_exclusions(self, exclusion_intervals,
                                        include_badput_breakdown: bool = False,
                                        configured_ideal_step_time: float | None = None):
        """Goodput with the time of ``exclusion_intervals`` left out.

        Args:
            exclusion_intervals: ``[(start, end), ...]`` UTC datetimes; as the incumbent, an
                interval whose times are not ``datetime.timezone.utc``-aware, or whose start
                is not before its end, is skipped (and logged).
            include_badput_breakdown, configured_ideal_step_time: as for
                :meth:`get_job_goodput`.

        Returns:
            ``(goodput_percent, badput_breakdown, max_productive_step,
            total_excluded_time_s)``. With ``"mgm"``, the incumbent's own exclusion rules
            (``docs/definitions.md``: its excluded time is the overlap of every measured
            time difference with the intervals); with ``"goodput"``, the intervals' instants
            leave the total and the buckets (``docs/accounting.md``, "Exclusions").

        Raises:
            ValueError: no spans of the job.
        """
        spans = []
        for start, end in exclusion_intervals:
            if (getattr(start, "tzinfo", None) is not _dt.timezone.utc
                    or getattr(end, "tzinfo", None) is not _dt.timezone.utc):
                log.warning("Skipping interval [%s , %s]: Timezone is not UTC", start, end)
                continue
            if start >= end:
                log.warning("Skipping interval [%s , %s]: Start time is after or equal to "
                            "End time.", start, end)
                continue
            spans.append((to_ns(start), to_ns(end)))
        ideal = configured_ideal_step_time
        if self.definitions == "mgm":
            from goodput_processor.mgm_entry import account_mgm_excluding

            js, at = self._job()
            m = account_mgm_excluding(js, spans, now_ns=at, ideal_step_time_s=ideal,
                                      elastic=self._elastic)
            breakdown = (_enum_badput(m.badput_percent)
                         if include_badput_breakdown and m.total_time_s else {})
            return m.goodput_percent, breakdown, int(m.max_productive_step), m.excluded_time_s
        from goodput_processor.mgm_entry import account_excluding, native_breakdown

        js, at = self._job()
        r = account_excluding(js, spans, ideal, at)
        if not r.total_ns:
            return 0.0, {}, int(r.max_productive_step or 0), r.excluded_time_s
        breakdown = (_enum_badput(native_breakdown(r.buckets_ns, r.async_work_s,
                                                   100 / r.total_ns))
                     if include_badput_breakdown else {})
        return (r.goodput * 100, breakdown, int(r.max_productive_step or 0),
                r.excluded_time_s)

    def sync_to_gcs(self) -> None:
        """A no-op: there is no cache file to copy (the spool is the record)."""
