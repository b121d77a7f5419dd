"""``ml_goodput_measurement.goodput_utils`` (0.2.3): enums, options and helpers, same names.

Everything here has the incumbent's name, values, fields and defaults:

- :class:`GCPOptions` (``project_id``, ``location``, ``replica_id='0'``, ``acc_type``,
  ``cluster_name``, ``enable_gcp_goodput_metrics=True``,
  ``enable_gcp_step_deviation_metrics=True``): where and whether the monitor writes the
  incumbent's Cloud Monitoring series (``docs/metrics.md``);
- the enums :class:`BadputType`, :class:`GoodputType`, :class:`MetricType`,
  :class:`IntervalMetricType`, :class:`MonitoringWindowType`, and the ``TypedDict`` s of the
  details the calculator returns;
- :class:`GoodputInfo`, :class:`StepInfo`, :func:`compute_ideal_step_time`,
  :func:`compute_percentile`, :func:`compute_step_deviation_from_baseline`,
  :func:`get_timestamp_from_log_entry`, and the metadata-server helpers
  (:func:`get_gcp_project_id`, :func:`get_node_zone`, :func:`get_accelerator_type`,
  :func:`get_cluster_name`), which answer None (or ``'UNKNOWN'``) off Google Cloud.

``BadputType.TRAINING_SLOWDOWN`` (15) is this project's own (slow steps beyond the ideal
step time, which the incumbent counts as productive); it appears only in numbers of this
project's model (``definitions="goodput"``).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import logging
import statistics
from typing import Any, TypedDict

__all__ = [
    "ACTIVITY_EXCLUSION_LIST", "MACHINE_TYPE_TO_ACCELERATOR_TYPE_MAPPING", "BadputType",
    "ElasticIntervalWorkloadMetricDetails", "ElasticWorkloadMetricDetails", "GCPOptions",
    "GoodputInfo", "GoodputType", "IntervalMetricType", "IntervalWorkloadMetricDetails",
    "MetricType", "MonitoringWindowType", "StepInfo", "WorkloadMetricDetails",
    "compute_ideal_step_time", "compute_percentile", "compute_step_deviation_from_baseline",
    "get_accelerator_type", "get_anomalous_and_normal_step_times", "get_cluster_name",
    "get_extra_time_from_anomalous_steps", "get_gcp_metadata", "get_gcp_project_id",
    "get_node_zone", "get_timestamp_from_log_entry",
]

log = logging.getLogger(__name__)

_METADATA_SERVER_URL = "http://metadata.google.internal/computeMetadata/v1/"
_METADATA_HEADERS = {"Metadata-Flavor": "Google"}

#: GCE machine type prefix -> accelerator type label (the incumbent's table).
MACHINE_TYPE_TO_ACCELERATOR_TYPE_MAPPING = {
    "tpu7x": "TPU-7x",
    "ct6e": "TPU-v6e",
    "ct5p": "TPU-v5p",
    "ct5lp": "TPU-v5e",
    "ct5l": "TPU-v5e",
    "ct4p": "TPU-v4p",
    "ct3p": "TPU-v3",
    "ct3": "TPU-v3",
    "tpu-v2": "TPU-v2",
    "tpu": "TPU",
    "a3-edgegpu": "NVIDIA-H100",
    "a3-highgpu": "NVIDIA-H100",
    "a3-megagpu": "NVIDIA-H100",
    "a3-ultragpu": "NVIDIA-H200",
    "a2": "NVIDIA-A100",
    "gpu": "GPU",
}


@dataclasses.dataclass
class GCPOptions:
    """Cloud Monitoring options of the monitor (the incumbent's fields and defaults).

    ``project_id``/``location``/``acc_type``: None = read from the GCE metadata server when
    the monitor starts (off Google Cloud: no project, so nothing is written unless given).
    ``replica_id``: the ``replica_id`` resource label. ``cluster_name``: added as a
    ``cluster_name`` metric label when set. ``enable_gcp_goodput_metrics``: write the
    cumulative (and rolling-window) series; ``enable_gcp_step_deviation_metrics``: write
    ``performance`` from the step-deviation uploader.
    """

    project_id: str | None = None
    location: str | None = None
    replica_id: str = "0"
    acc_type: str | None = None
    cluster_name: str | None = None
    enable_gcp_goodput_metrics: bool = True
    enable_gcp_step_deviation_metrics: bool = True


class MetricType(enum.Enum):
    """Keys of the cumulative details (``get_job_goodput_details``)."""

    GOODPUT_TIME = "goodput_time"
    BADPUT_TIME = "badput_time"
    MAX_PRODUCTIVE_STEP = "max_productive_step"
    TOTAL_ELAPSED_TIME = "total_elapsed_time"
    DISRUPTION_COUNT = "disruption_count"
    STEP_TIME_DEVIATION = "step_time_deviation"
    IDEAL_STEP_TIME = "ideal_step_time"
    TOTAL_EXCLUDED_TIME = "total_excluded_time"


class IntervalMetricType(enum.Enum):
    """Keys of the interval details (``get_interval_metric_details``)."""

    INTERVAL_GOODPUT = "interval_goodput"
    INTERVAL_BADPUT = "interval_badput"
    INTERVAL_SIZE = "interval_size"


class GoodputType(enum.Enum):
    """Kinds of goodput (one, as in the incumbent)."""

    TOTAL = 1


class BadputType(enum.Enum):
    """Badput kinds: the incumbent's names and values, plus ``TRAINING_SLOWDOWN``."""

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


class WorkloadMetricDetails(TypedDict):
    """Cumulative details: seconds, except counts and steps."""

    goodput_time: dict[GoodputType, float]
    badput_time: dict[BadputType, float | dict[str, float]]
    max_productive_step: int
    total_elapsed_time: float
    disruption_count: int
    step_time_deviation: dict[int, float]
    ideal_step_time: float
    total_excluded_time: float


class IntervalWorkloadMetricDetails(TypedDict):
    """Interval details: percent of the interval, and its size in whole seconds."""

    interval_goodput: dict[GoodputType, float]
    interval_badput: dict[BadputType, float | dict[str, float]]
    interval_size: int


class ElasticWorkloadMetricDetails(WorkloadMetricDetails, total=False):
    """Cumulative details of an elastic job, with the slice efficiencies (fractions)."""

    stepping_slice_efficiency: float
    available_slice_efficiency: float


class ElasticIntervalWorkloadMetricDetails(IntervalWorkloadMetricDetails, total=False):
    """Interval details of an elastic job, with the slice efficiencies (fractions)."""

    stepping_slice_efficiency: float
    available_slice_efficiency: float


#: Badput kinds that are not badput (asynchronous data loading): not uploaded.
ACTIVITY_EXCLUSION_LIST = ["DATA_LOADING_ASYNC"]


class MonitoringWindowType(enum.Enum):
    """The ``window_type`` label of the Cloud Monitoring series."""

    CUMULATIVE = "cumulative"
    INTERVAL = "interval"


_DEFAULT_RECENT_WINDOW_SIZE = 100
_DEFAULT_BASELINE_WINDOW_SIZE = 1000
_DEFAULT_SPIKE_PERCENTILE = 90


class GoodputInfo:
    """Goodput information (the incumbent's cache record); seconds."""

    def __init__(self, total_productive_time: float = 0.0, total_elapsed_time: float = 0.0,
                 total_unproductive_time: dict | None = None, max_productive_step: int = 0,
                 last_recorded_step: int = 0,
                 last_updated_timestamp: datetime.datetime | None = None,
                 number_of_disruptions: int = 0, total_excluded_time: float = 0.0):
        self.total_productive_time = total_productive_time
        self.total_elapsed_time = total_elapsed_time
        self.total_unproductive_time = total_unproductive_time or {}
        self.max_productive_step = max_productive_step
        self.last_recorded_step = last_recorded_step
        self.last_updated_timestamp = last_updated_timestamp or datetime.datetime.now(
            datetime.timezone.utc)
        self.number_of_disruptions = number_of_disruptions
        self.total_excluded_time = total_excluded_time


class StepInfo:
    """Step information: ideal step time and per-step deviation, seconds."""

    def __init__(self, ideal_step_time: float, step_deviations: dict[int, float]):
        self.ideal_step_time = ideal_step_time
        self.step_deviations = step_deviations


def compute_percentile(values: list[float], percentile: float) -> float:
    """Linear-interpolation percentile of ``values`` (0.0 for none), as the incumbent
    (implemented by ``goodput_processor.exporters.workload.percentile``, imported when called)."""
    from goodput_processor.mgm_entry import percentile as _percentile

    return _percentile(values, percentile)


def compute_step_deviation_from_baseline(
    step_time_deviation: dict[int, float],
    mode: MonitoringWindowType = MonitoringWindowType.CUMULATIVE,
    recent_window_size: int = _DEFAULT_RECENT_WINDOW_SIZE,
    baseline_window_size: int = _DEFAULT_BASELINE_WINDOW_SIZE,
    spike_percentile: int = _DEFAULT_SPIKE_PERCENTILE,
) -> float:
    """The value of the ``step_time_deviation`` series (seconds), the incumbent's formula:
    the mean absolute deviation for fewer than 100 steps; else the ``spike_percentile``-th
    percentile of the last ``recent_window_size`` deviations, minus (cumulative mode, with
    enough history) the median of the ``baseline_window_size`` before them.

    Implemented by ``goodput_processor.exporters.workload.step_deviation_from_baseline`` (imported
    when called).

    Raises:
        ValueError: an unknown ``mode``.
    """
    from goodput_processor.mgm_entry import step_deviation_from_baseline as _baseline

    if not isinstance(mode, MonitoringWindowType):
        raise ValueError(f"unsupported MonitoringWindowType mode: {mode!r}")
    return float(_baseline(step_time_deviation, mode.value, recent_window_size,
                           baseline_window_size, spike_percentile))


def compute_ideal_step_time(step_times: list[float]) -> float | None:
    """The incumbent's ideal step time (seconds): step times under 1 s are dropped, then the
    mean of those at most median + 3 x MAD; None when none is left.

    The implementation is the processor's (``goodput_processor.definitions.mgm``), imported
    when called.
    """
    from goodput_processor.mgm_entry import compute_ideal_step_time as _ideal

    return _ideal(step_times)


def get_timestamp_from_log_entry(entry: dict[str, Any]) -> datetime.datetime | None:
    """The time of an incumbent log entry: its first key containing ``time`` (POSIX
    seconds) as a UTC datetime, or None."""
    for label, value in entry.items():
        if "time" in label:
            return datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
    return None


def get_gcp_metadata(category: str, attribute: str, timeout=5, retries=3) -> str | None:
    """``attribute`` of ``category`` from the GCE metadata server, or None (off Google
    Cloud, or after ``retries`` failures; the failure is logged)."""
    import urllib.error  # only here: importing goodput stays fast
    import urllib.request

    url = f"{_METADATA_SERVER_URL}{category}/{attribute}"
    last = None
    for _ in range(max(1, int(retries))):
        try:
            req = urllib.request.Request(url, headers=_METADATA_HEADERS)
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - fixed URL
                return resp.read().decode()
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = e
            if isinstance(e, urllib.error.URLError) and not isinstance(
                    e, urllib.error.HTTPError):
                break  # no such host: retrying cannot help
    log.warning("Failed to retrieve metadata for %s/%s: %s", category, attribute, last)
    return None


def get_gcp_project_id() -> str | None:
    """The project of this VM (metadata server), or None."""
    return get_gcp_metadata("project", "project-id")


def get_node_zone() -> str | None:
    """The zone of this VM (metadata server), e.g. ``us-central1-a``, or None."""
    zone = get_gcp_metadata("instance", "zone")
    return zone.rsplit("/", 1)[-1] if zone else None


def get_accelerator_type() -> str:
    """The accelerator type of this VM from its machine type, or ``'UNKNOWN'``."""
    url = get_gcp_metadata("instance", "machine-type")
    name = url.split("/")[-1] if url else None
    if not name:
        return "UNKNOWN"
    for prefix, acc in MACHINE_TYPE_TO_ACCELERATOR_TYPE_MAPPING.items():
        if prefix.lower() in name.lower():
            return acc
    return "UNKNOWN"


def get_cluster_name() -> str | None:
    """The GKE cluster name of this VM (metadata server), or None."""
    return get_gcp_metadata("instance", "attributes/cluster-name")


def get_anomalous_and_normal_step_times(step_times: list[Any]) -> tuple[list, list]:
    """Step times above median + 3 x MAD (anomalous) and the others (normal), as the
    incumbent splits them (unused by its 0.2.3 calculator, kept for API parity)."""
    med = statistics.median(step_times)
    mad = statistics.median(abs(x - med) for x in step_times)
    anomalous = [x for x in step_times if x > med + 3 * mad]
    normal = [x for x in step_times if x <= med + 3 * mad]
    return anomalous, normal


def get_extra_time_from_anomalous_steps(step_times: list[Any]) -> float:
    """Seconds of the anomalous step times beyond the mean normal step time (unused by the
    incumbent's 0.2.3 calculator, kept for API parity)."""
    anomalous, normal = get_anomalous_and_normal_step_times(step_times)
    return sum(anomalous) - len(anomalous) * (sum(normal) / len(normal))
