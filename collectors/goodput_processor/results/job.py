"""The report's result data classes: a job's :class:`JobResult`, its attempts'
:class:`AttemptResult` and its :class:`StepTimeSummary`.

Made by the accounting (:mod:`goodput_processor.account.accounting`); read by the JSON and
table forms (:mod:`.report_json`, :mod:`.table`), the exporters, the HTML report and
``goodput serve``. Durations are float seconds; absolute times integer ns since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..analysis.step_arrays import StepArrays
from ..model.warnings import ReportWarning

if TYPE_CHECKING:
    from ..analysis.attribution import HostBadput
    from ..analysis.elastic import SliceEfficiency
    from ..analysis.recovery import Recovery
    from ..analysis.stragglers import StragglerReport

__all__ = ["AttemptResult", "JobResult", "StepTimeSummary"]


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
