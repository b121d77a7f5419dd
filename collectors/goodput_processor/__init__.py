"""Goodput processor: turns goodput spans (OTLP JSON lines) into goodput and badput.

Reads the spool files the training side writes (``docs/span-schema.md``), groups spans
into job -> attempt -> process, and accounts every nanosecond of a job into one bucket
(``docs/accounting.md``)::

    from goodput_processor import report_run_dir, to_json

    results = report_run_dir("goodput-runs/my-job", ideal_step_time_s=0.25)
    print(results[0].goodput, results[0].badput_s["wasted_progress"])

The folders follow the pipeline (``docs/architecture.md``): ``read/`` (spool files to span
rows), ``model/`` (attempts and processes), ``analysis/`` (step times, stragglers,
recovery, attribution), ``results/`` (result types, JSON, table), ``account/`` (buckets,
windows, warnings), ``definitions/`` (other tools' definitions), ``exporters/`` (metrics,
TensorBoard, Cloud Monitoring series), ``html/``, ``importers/``, ``serve/`` (the live
service and the in-process monitor) and the command line :mod:`goodput_processor.cli`
(``goodput report RUN_DIR``, ``goodput serve``, ``goodput import``).
"""

from __future__ import annotations

from .account.accounting import (
    AttemptResult,
    JobResult,
    StepArrays,
    StepTimeSummary,
    account,
)
from .account.run_dir import report_run_dir
from .account.windows import WindowResult, account_interval, account_windows
from .read.reader import ReadError, RunDirError, SpoolFormatError, read_run_dir
from .read.rows import JobSpans, ProcessSpans, SpanSet
from .results.report_json import to_json, to_json_dict
from .results.table import format_duration, render_table


def __getattr__(name: str):
    """``__version__``: the installed distribution's version (``0+unknown`` from a source
    tree), read from its metadata on first use (``importlib.metadata`` costs a report
    ~60 ms at import).

    Raises:
        AttributeError: any other name.
    """
    if name != "__version__":
        raise AttributeError(f"module 'goodput_processor' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("goodput-otel")
    except PackageNotFoundError:  # running from a source tree
        value = "0+unknown"
    globals()["__version__"] = value
    return value


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
