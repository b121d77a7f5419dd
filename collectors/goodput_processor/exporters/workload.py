"""The Cloud Monitoring series of ml-goodput-measurement 0.2.3, unchanged (``docs/metrics.md``).

Users of Google's ``ml-goodput-measurement`` ("mgm") have dashboards and alerts on its
series ``compute.googleapis.com/workload/<name>`` of the monitored resource
``compute.googleapis.com/Workload`` (labels ``location``, ``workload_id`` = the job name,
``replica_id``). This sink writes the same series, with the same metric labels
(``goodput_source``, ``badput_source``, ``accelerator_type``, ``window_type``,
``rolling_window_size``, and ``cluster_name`` when set) and value types, built as mgm
0.2.3's ``monitoring._upload_goodput_metrics_to_gcm``,
``_upload_interval_goodput_metrics_to_gcm`` and ``_send_step_deviation_metric_to_gcp``
build them, so those dashboards keep working. This project's own metrics
(``workload.googleapis.com/goodput.*``, :mod:`.metrics`) are separate and stay available.

The inputs are the *details* mgm's calculator returns, keyed by name here (the training-side
drop-in, :mod:`goodput.mgm`, keys them by its enums): :func:`details` and
:func:`interval_details` compute them from a job's spans, by mgm's definitions
(``"mgm"``, :mod:`.definitions.mgm`) or this project's (``"goodput"``, buckets mapped to
mgm's names by :data:`BUCKET_NAMES`).

Needs ``google-cloud-monitoring`` (the ``gcp`` extra) only to send.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from dataclasses import dataclass

from goodput import schema

__all__ = ["BUCKET_NAMES", "METRIC_PREFIX", "RESOURCE_TYPE", "WorkloadOptions",
           "WorkloadSender", "cumulative_series", "details", "interval_details", "job_series",
           "interval_series", "native_breakdown", "percentile", "step_deviation_from_baseline",
           "step_deviation_series"]

log = logging.getLogger(__name__)

#: Prefix of the metric types, and the monitored resource type (mgm's).
METRIC_PREFIX = "compute.googleapis.com/workload/"
RESOURCE_TYPE = "compute.googleapis.com/Workload"
#: Badput names that are not badput and are never uploaded (mgm's ACTIVITY_EXCLUSION_LIST).
_NOT_UPLOADED = ("DATA_LOADING_ASYNC",)
#: This project's buckets -> mgm's badput names (``definitions="goodput"``).
#: ``process_startup`` is part of mgm's OTHER; ``training_slowdown`` has no mgm name and
#: keeps its own (``TRAINING_SLOWDOWN``).
BUCKET_NAMES = {
    "process_startup": "OTHER",
    "accelerator_init": "TPU_INITIALIZATION",
    "training_prep": "TRAINING_PREP",
    "program_startup": "PROGRAM_STARTUP",
    "data_loading": "DATA_LOADING_SYNC",
    "checkpoint_save": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "checkpoint_restore": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "wasted_progress": "WASTED_PROGRESS_FROM_DISRUPTION",
    "infrastructure_recovery": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "elastic_slice_down": "ELASTIC_SLICE_DOWN",
    "elastic_scale_up": "ELASTIC_SCALE_UP",
    "elastic_reinitialization": "ELASTIC_REINITIALIZATION",
    "training_slowdown": "TRAINING_SLOWDOWN",
    "other": "OTHER",
}
_NS = 1_000_000_000


# --- details (mgm's dictionaries, keyed by name) ------------------------------------------


def native_breakdown(buckets_ns: dict[str, int], async_s: dict[str, float], scale: float
                     ) -> dict:
    """This project's buckets as mgm names: ``{name: value, "CUSTOM_BADPUT_EVENTS":
    {TYPE: value}}`` (values = ns x ``scale``: seconds with ``1e-9``, percent with
    ``100 / total_ns``); ``DATA_LOADING_ASYNC`` from the asynchronous data loading."""
    out: dict = {}
    custom: dict[str, float] = {}
    for name, ns in buckets_ns.items():
        if name == schema.PRODUCTIVE:
            continue
        if name.startswith(schema.CUSTOM_PREFIX):
            key = name[len(schema.CUSTOM_PREFIX):].upper()
            custom[key] = custom.get(key, 0.0) + ns * scale
        else:
            key = BUCKET_NAMES[name]
            out[key] = out.get(key, 0.0) + ns * scale
    out["DATA_LOADING_ASYNC"] = async_s.get("data_loading", 0.0) * _NS * scale
    out["CUSTOM_BADPUT_EVENTS"] = custom
    return out


def mgm_badput_seconds(m) -> dict:
    """An :class:`~.definitions.mgm.MgmResult`'s badput in seconds, with the keys mgm's own
    dict has (``badput_keys``), custom types nested under ``CUSTOM_BADPUT_EVENTS``."""
    out: dict = {}
    for k in m.badput_keys:
        out[k] = dict(m.custom_badput_s) if k == "CUSTOM_BADPUT_EVENTS" else m.badput_s[k]
    return out


def details(result, *, excluded_s: float = 0.0, share: bool = False) -> dict:
    """mgm's ``WorkloadMetricDetails`` of a job, keyed by name: ``goodput_time``
    ``{"TOTAL": s}``, ``badput_time`` ``{name: s | {TYPE: s}}``, ``max_productive_step``,
    ``total_elapsed_time`` (s), ``disruption_count``, ``step_time_deviation`` ``{step: s}``,
    ``ideal_step_time`` (s, 0.0 when unknown), ``total_excluded_time`` (s); for an elastic
    job with slice counts also ``stepping_slice_efficiency`` and
    ``available_slice_efficiency`` (fractions).

    ``result``: an :class:`~.definitions.mgm.MgmResult` (mgm's numbers) or a
    :class:`~goodput_processor.results.job.JobResult` (this project's, buckets named by
    :data:`BUCKET_NAMES`).
    ``share``: an :class:`~.definitions.mgm.MgmResult`'s own ``step_deviation_s`` (one
    entry per step: for callers that only read it), not a copy.
    """
    from ..definitions.mgm import MgmResult

    if isinstance(result, MgmResult):
        out = {
            "goodput_time": {"TOTAL": result.productive_time_s},
            "badput_time": mgm_badput_seconds(result),
            "max_productive_step": int(result.max_productive_step),
            "total_elapsed_time": result.total_time_s,
            "disruption_count": int(result.disruptions),
            "step_time_deviation": (result.step_deviation_s if share
                                    else dict(result.step_deviation_s)),
            "ideal_step_time": result.ideal_step_time_s or 0.0,
            "total_excluded_time": excluded_s,
        }
        if result.slice_efficiency is not None:
            out["stepping_slice_efficiency"] = result.slice_efficiency[0]
            out["available_slice_efficiency"] = result.slice_efficiency[1]
        return out
    import numpy as np

    from ..read.rows import NONE

    st = result.steps
    sel = (st.step != NONE) & ~np.isnan(st.deviation_s)
    out = {
        "goodput_time": {"TOTAL": result.productive_time_s},
        "badput_time": native_breakdown(result.buckets_ns, result.async_work_s, 1 / _NS),
        "max_productive_step": int(result.max_productive_step or 0),
        "total_elapsed_time": result.total_time_s,
        "disruption_count": int(result.disruptions),
        "step_time_deviation": {int(s): abs(float(d)) for s, d in zip(
            st.step[sel], st.deviation_s[sel], strict=True)},
        "ideal_step_time": result.ideal_step_time_s or 0.0,
        "total_excluded_time": result.excluded_time_s or excluded_s,
    }
    if result.slice_efficiency is not None:
        out["stepping_slice_efficiency"] = result.slice_efficiency.stepping
        out["available_slice_efficiency"] = result.slice_efficiency.available
    return out


def interval_details(result, size_s: int) -> dict:
    """mgm's ``IntervalWorkloadMetricDetails``, keyed by name: ``interval_goodput``
    ``{"TOTAL": percent}``, ``interval_badput`` ``{name: percent | {TYPE: percent}}``,
    ``interval_size`` (``size_s``, whole seconds), and the slice efficiencies when known.

    ``result``: an :class:`~.definitions.mgm.MgmResult` of the interval, a
    :class:`~goodput_processor.account.windows.WindowResult` (this project's numbers), or None (the
    interval has no
    number: empty goodput and badput, as mgm answers then).
    """
    from ..definitions.mgm import MgmResult

    out: dict = {"interval_goodput": {}, "interval_badput": {}, "interval_size": int(size_s)}
    if result is None:
        return out
    if isinstance(result, MgmResult):
        out["interval_goodput"] = {"TOTAL": result.goodput_percent}
        out["interval_badput"] = {k: dict(v) if isinstance(v, dict) else v
                                  for k, v in result.badput_percent.items()}
        if result.slice_efficiency is not None:
            out["stepping_slice_efficiency"] = result.slice_efficiency[0]
            out["available_slice_efficiency"] = result.slice_efficiency[1]
        return out
    out["interval_goodput"] = {"TOTAL": result.goodput * 100}
    out["interval_badput"] = native_breakdown(result.buckets_ns, {}, 100 / result.total_ns)
    return out


# --- the series ----------------------------------------------------------------------------


@dataclass
class WorkloadOptions:
    """Where the series go, as mgm's ``GCPOptions`` says: ``project_id`` (the request's
    ``projects/<id>``), ``location`` and ``replica_id`` (resource labels), ``acc_type``
    (the ``accelerator_type`` label), ``cluster_name`` (a ``cluster_name`` label when set),
    ``include_slice_efficiency`` (``ElasticGoodputMonitor``'s option)."""

    project_id: str
    location: str
    replica_id: str = "0"
    acc_type: str | None = None
    cluster_name: str | None = None
    include_slice_efficiency: bool = False


def _labels(opts: WorkloadOptions, labels: dict) -> dict:
    out = dict(labels)
    if opts.cluster_name:
        out["cluster_name"] = opts.cluster_name
    return out


def _series(opts, job, name, value, kind, labels=None) -> dict:
    return {"metric_type": METRIC_PREFIX + name, "value": value, "value_type": kind,
            "metric_labels": labels or {}, "resource_type": RESOURCE_TYPE,
            "resource_labels": {"location": opts.location, "workload_id": job,
                                "replica_id": opts.replica_id}}


def _flatten(badput: dict) -> list[tuple[str, float]]:
    """mgm's ``_flatten_badput_dict``: nested custom types become ``NAME.TYPE``."""
    out = []
    for name, v in badput.items():
        if isinstance(v, dict):
            out += [(f"{name}.{sub.upper()}", x) for sub, x in v.items()]
        else:
            out.append((name, v))
    return out


def percentile(values, q: float) -> float:
    """mgm's ``compute_percentile``: linear interpolation between the sorted values at
    ``(n - 1) * q / 100`` (0.0 for no value)."""
    s = sorted(values)
    if not s:
        return 0.0
    idx = (len(s) - 1) * (q / 100.0)
    lo = int(idx)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (idx - lo)


def step_deviation_from_baseline(deviations: dict[int, float], mode: str = "cumulative",
                                 recent: int = 100, baseline: int = 1000,
                                 spike_percentile: float = 90) -> float:
    """mgm's ``compute_step_deviation_from_baseline`` (seconds): the mean absolute deviation
    below 100 steps; else the ``spike_percentile`` of the last ``recent`` absolute
    deviations, minus (``mode="cumulative"``, with ``recent + baseline`` steps or more) the
    median of the ``baseline`` before them.

    Raises:
        ValueError: ``mode`` is not ``"cumulative"`` or ``"interval"``.
    """
    if mode not in ("cumulative", "interval"):
        raise ValueError(f"unsupported MonitoringWindowType mode: {mode!r}")
    last = getattr(deviations, "last_values", None)  # (definitions.mgm_steps.Deviation)
    if ((isinstance(deviations, dict) or last is not None) and len(deviations) >= 100
            and isinstance(recent, int) and isinstance(baseline, int) and recent > 0
            and baseline >= 0):
        # only the last recent + baseline deviations are read: not every step of the job
        devs = [abs(d) for d in (last(recent + baseline) if last is not None else
                                 itertools.islice(reversed(deviations.values()),
                                                  recent + baseline))]
        if last is None:
            devs.reverse()
        n = len(deviations)
    else:
        devs = [abs(d) for d in deviations.values()]
        n = len(devs)
    if not devs:
        return 0.0
    if n < 100:
        return sum(devs) / len(devs)
    spike = percentile(devs[-recent:], spike_percentile)
    if mode == "interval" or n < recent + baseline:
        return spike
    return spike - statistics.median(devs[-(recent + baseline):-recent])


def cumulative_series(job: str, d: dict, opts: WorkloadOptions) -> list[dict]:
    """The series of one cumulative upload (mgm's ``_upload_goodput_metrics_to_gcm``) from
    name-keyed details ``d`` (:func:`details`), in mgm's order. Each is a dict:
    ``metric_type``, ``value``, ``value_type`` (``"double"`` or ``"int64"``),
    ``metric_labels``, ``resource_type``, ``resource_labels``."""
    acc = opts.acc_type
    out = []
    for gtype, v in d["goodput_time"].items():
        if gtype not in _NOT_UPLOADED:
            out.append(_series(opts, job, "goodput_time", v, "double", _labels(
                opts, {"goodput_source": gtype, "accelerator_type": acc})))
    for label, v in _flatten(d["badput_time"]):
        if label not in _NOT_UPLOADED:
            out.append(_series(opts, job, "badput_time", v, "double", _labels(
                opts, {"badput_source": label, "accelerator_type": acc})))
    out.append(_series(opts, job, "disruptions", d["disruption_count"], "int64", _labels(
        opts, {"accelerator_type": acc, "window_type": "cumulative"})))
    out.append(_series(opts, job, "max_productive_steps", d["max_productive_step"], "int64",
                       _labels(opts, {"accelerator_type": acc})))
    if d.get("step_time_deviation"):
        out.append(_series(opts, job, "step_time_deviation",
                           step_deviation_from_baseline(d["step_time_deviation"]), "double",
                           _labels(opts, {"accelerator_type": acc})))
    out.append(_series(opts, job, "total_elapsed_time", d["total_elapsed_time"], "double",
                       _labels(opts, {"accelerator_type": acc, "window_type": "cumulative"})))
    out.append(_series(opts, job, "performance", d["ideal_step_time"], "double"))
    if opts.include_slice_efficiency:
        for key in ("stepping_slice_efficiency", "available_slice_efficiency"):
            if d.get(key) is not None:
                out.append(_series(opts, job, key, d[key], "double", _labels(opts, {
                    "accelerator_type": acc, "window_type": "CUMULATIVE",
                    "rolling_window_size": "0"})))
    return out


def interval_series(job: str, d: dict, opts: WorkloadOptions) -> list[dict]:
    """The series of one rolling-window upload (mgm's
    ``_upload_interval_goodput_metrics_to_gcm``) from :func:`interval_details`; none when
    the interval size is 0."""
    size = d.get("interval_size")
    if not size:
        return []
    acc, window = opts.acc_type, str(size)
    out = []
    for gtype, v in d.get("interval_goodput", {}).items():
        if gtype not in _NOT_UPLOADED:
            out.append(_series(opts, job, "interval_goodput", v, "double", _labels(opts, {
                "goodput_source": gtype, "accelerator_type": acc,
                "rolling_window_size": window})))
    for label, v in _flatten(d.get("interval_badput", {})):
        if label not in _NOT_UPLOADED:
            out.append(_series(opts, job, "interval_badput", v, "double", _labels(opts, {
                "badput_source": label, "accelerator_type": acc,
                "rolling_window_size": window})))
    if opts.include_slice_efficiency:
        for key in ("stepping_slice_efficiency", "available_slice_efficiency"):
            if d.get(key) is not None:
                out.append(_series(opts, job, key, d[key], "double", _labels(opts, {
                    "accelerator_type": acc, "rolling_window_size": window,
                    "window_type": "INTERVAL"})))
    return out


def step_deviation_series(job: str, deviations: dict[int, float],
                          opts: WorkloadOptions) -> list[dict]:
    """The step-deviation upload (mgm's ``_send_step_deviation_metric_to_gcp``):
    ``performance`` = the mean of the deviations (seconds), without metric labels; none
    for no deviation or a NaN mean."""
    if not deviations:
        return []
    mean = sum(deviations.values()) / len(deviations)
    if math.isnan(mean):
        return []
    return [_series(opts, job, "performance", mean, "double")]


def job_series(snap, opts: WorkloadOptions, definitions: str = "mgm", *, spans=None,
               ideal_step_time_s: float | None = None, memo=None) -> list[dict]:
    """Every series mgm uploads for one job: cumulative, then each rolling window.

    ``snap``: the job's :class:`~goodput_processor.exporters.metrics.JobSnapshot` (result and
    windows, this project's model); ``definitions``: ``"mgm"`` (the numbers from mgm's
    definitions, computed on ``spans``, the job's :class:`~goodput_processor.read.rows.JobSpans`,
    required
    then) or ``"goodput"`` (the snapshot's own numbers, buckets named by
    :data:`BUCKET_NAMES`). ``memo``: with ``"mgm"``, the job's
    :class:`~goodput_processor.model.memo.AccountingMemo` from earlier calls on the same live job
    (its rows only grown at the end since), as :func:`~.definitions.mgm.account_mgm_windows`
    takes it.

    Raises:
        ValueError: ``definitions`` is neither, or ``"mgm"`` without ``spans``.
    """
    job = snap.result.job
    if definitions == "mgm":
        if spans is None:
            raise ValueError("definitions='mgm' needs the job's spans")
        from ..definitions.mgm import account_mgm_windows

        whole, parts = account_mgm_windows(
            spans, [(w.start_ns, w.end_ns) for w in snap.windows],
            ideal_step_time_s=ideal_step_time_s, memo=memo)
        d = details(whole, share=True)  # (read only)
        windows = [interval_details(m, int(w.window_s))
                   for m, w in zip(parts, snap.windows, strict=True)]
    elif definitions == "goodput":
        d = details(snap.result)
        windows = [interval_details(w, int(w.window_s)) for w in snap.windows]
    else:
        raise ValueError(f"definitions must be 'mgm' or 'goodput', got {definitions!r}")
    series = cumulative_series(job, d, opts)
    for w in windows:
        series += interval_series(job, w, opts)
    return series


class WorkloadSender:
    """Sends series (:func:`cumulative_series`, ...) to Cloud Monitoring in one
    ``CreateTimeSeries`` request per call, every point stamped with the time of the call.

    Args:
        project_id: the project (``projects/<id>``).
        client: a ``google.cloud.monitoring_v3.MetricServiceClient`` (default: one built
            with Application Default Credentials on first send).

    Never raises from :meth:`send`: a series that cannot be built (a label or resource
    label that is None, as mgm's ``GCPMetrics`` finds) is left out and logged, a failed
    request is logged; both are counted in :attr:`errors`.
    """

    def __init__(self, project_id: str, client=None):
        self.project_id = project_id
        self._client = client
        self.errors = 0
        self.requests = 0

    def _time_series(self, s: dict, seconds: int, nanos: int):
        """One ``google.monitoring.v3.TimeSeries`` of series ``s`` with one point at
        ``seconds``/``nanos``: the raw protobuf message (proto-plus' own wrapper costs about
        ten times more to build; the client takes either)."""
        from google.cloud import monitoring_v3

        bad = [k for k, v in {**s["metric_labels"], **s["resource_labels"]}.items()
               if v is None]
        if bad:
            raise ValueError(f"label(s) {', '.join(bad)} of {s['metric_type']} are None")
        ts = monitoring_v3.TimeSeries.pb()()
        ts.metric.type = s["metric_type"]
        ts.resource.type = s["resource_type"]
        ts.resource.labels.update({k: str(v) for k, v in s["resource_labels"].items()})
        if s["metric_labels"]:
            ts.metric.labels.update({k: str(v) for k, v in s["metric_labels"].items()})
        point = ts.points.add()
        point.interval.end_time.seconds = seconds
        point.interval.end_time.nanos = nanos
        if s["value_type"] == "int64":
            point.value.int64_value = int(s["value"])
        else:
            point.value.double_value = float(s["value"])
        return ts

    def send(self, series: list[dict]) -> bool:
        """Send ``series`` in one request; True if it was sent (or there was none)."""
        now = time.time()
        seconds = int(now)
        nanos = int((now - seconds) * 1e9)
        built = []
        for s in series:
            try:
                built.append(self._time_series(s, seconds, nanos))
            except Exception as e:  # as mgm: one bad series does not stop the others
                self.errors += 1
                log.error("goodput: cannot build the time series %s: %s",
                          s.get("metric_type"), e)
        if not built:
            return not series
        try:
            if self._client is None:
                from google.cloud import monitoring_v3

                self._client = monitoring_v3.MetricServiceClient()
            self._client.create_time_series(name=f"projects/{self.project_id}",
                                            time_series=built)
            self.requests += 1
            return True
        except Exception as e:  # never into the caller's thread
            self.errors += 1
            log.error("goodput: sending %d series to Cloud Monitoring failed: %s",
                      len(built), e)
            return False
