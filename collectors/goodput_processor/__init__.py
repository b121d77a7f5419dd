"""Goodput processor: turns goodput spans (OTLP JSON lines) into goodput and badput.

Reads the spool files the training side writes (``docs/span-schema.md``), groups spans
into job -> attempt -> process, and accounts every nanosecond of a job into one bucket
(``docs/accounting.md``)::

    from goodput_processor import report_run_dir, to_json

    results = report_run_dir("goodput-runs/my-job", ideal_step_time_s=0.25)
    print(results[0].goodput, results[0].badput_s["wasted_progress"])

The command line is ``goodput report RUN_DIR`` and ``goodput serve``
(:mod:`goodput_processor.cli`); metrics, TensorBoard scalars and the in-process
monitor are in :mod:`.metrics`, :mod:`.tensorboard` and :mod:`.monitor`
(``docs/metrics.md``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("goodput-otel")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

from .accounting import (  # noqa: E402
    AttemptResult,
    JobResult,
    StepArrays,
    StepTimeSummary,
    account,
    report_run_dir,
)
from .reader import ReadError, RunDirError, SpoolFormatError, read_run_dir  # noqa: E402
from .report import format_duration, render_table, to_json, to_json_dict  # noqa: E402
from .timeline import JobSpans, ProcessSpans, SpanSet  # noqa: E402
from .windows import WindowResult, account_interval, account_windows  # noqa: E402

__all__ = [
    "AttemptResult",
    "JobResult",
    "JobSpans",
    "ProcessSpans",
    "ReadError",
    "RunDirError",
    "SpanSet",
    "SpoolFormatError",
    "StepArrays",
    "StepTimeSummary",
    "WindowResult",
    "__version__",
    "account",
    "account_interval",
    "account_windows",
    "format_duration",
    "read_run_dir",
    "render_table",
    "report_run_dir",
    "to_json",
    "to_json_dict",
]
