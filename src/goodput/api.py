"""The process-wide recorder and the lifecycle calls (configure, job start/end, flush)."""

from __future__ import annotations

import logging
import threading
import time

from goodput import config
from goodput.recorder import Recorder

_log = logging.getLogger(__name__)
_RECORDER: Recorder | None = None
_LOCK = threading.Lock()


def configure(
    job_name: str | None = None,
    *,
    run_dir=None,
    process_index: int | None = None,
    process_count: int | None = None,
    flush_interval_s: float | None = None,
    exporters=None,
    spool: bool | None = None,
    handle_signals: bool | None = None,
    start: bool = True,
    start_time=None,
    traces_exporter=None,
    trace_window_s: float | None = None,
    trace_window_spans: int | None = None,
    resource_attributes=None,
) -> Recorder:
    """Set up recording for this process and (by default) begin an attempt.

    Call it once, as early as possible (before importing the training framework).
    Calling it again shuts the previous recorder down (ending its attempt) first.

    Args:
        job_name: the job's name; ``OTEL_SERVICE_NAME`` or ``GOODPUT_JOB_NAME`` win.
        run_dir: spool directory (default ``GOODPUT_RUN_DIR`` or ``./goodput-runs/<job>``).
        process_index, process_count: this host process's rank and the job's size
            (default from ``GOODPUT_PROCESS_INDEX``/``RANK``/``JAX_PROCESS_ID``/
            ``LOCAL_RANK`` and ``GOODPUT_PROCESS_COUNT``/``WORLD_SIZE``/
            ``JAX_NUM_PROCESSES``); replaced by ``torch.distributed``'s or JAX's rank and
            size once the framework is initialised.
        flush_interval_s: seconds between spool writes (default 1).
        exporters: extra OpenTelemetry ``SpanExporter`` objects.
        traces_exporter: exporter names, e.g. ``"gcp_trace"`` or ``["otlp", "console"]``
            (see ``docs/exporting.md``); default ``GOODPUT_TRACES_EXPORTER``, else
            ``OTEL_TRACES_EXPORTER``; none: the spool only.
        trace_window_s, trace_window_spans: a new trace (window) every this many
            seconds (default 60) or child spans (default 500).
        spool: write the local spool (default yes).
        handle_signals: ignored, kept for compatibility: goodput installs no signal handler,
            so SIGTERM and SIGINT end the process exactly as they would without it (see
            ``docs/recording.md``).
        start: begin an attempt now. Pass False if you call :func:`job_start` yourself.
        start_time: the attempt's start (datetime or epoch seconds); default: when
            this OS process started (Linux), else when ``goodput`` was imported.
        resource_attributes: extra OpenTelemetry resource attributes on every span
            (e.g. the ML run's name and configs, :mod:`goodput.diagnostics`); the
            schema's own attributes win on conflicts.

    Returns:
        The :class:`~goodput.recorder.Recorder`.

    Raises:
        ValueError: ``flush_interval_s``, ``trace_window_s`` or ``trace_window_spans`` is
            not > 0, ``start_time`` is invalid, or ``traces_exporter`` names an exporter
            that is unknown, not installed or cannot be created (the message names it).
    """
    from goodput.phases import to_ns  # phases imports this module

    global _RECORDER
    at = to_ns(start_time, "start_time") if start_time is not None else config.process_start_ns()
    rec = Recorder(
        job_name=job_name,
        run_dir=run_dir,
        process_index=process_index,
        process_count=process_count,
        flush_interval_s=flush_interval_s,
        exporters=exporters,
        spool=spool,
        handle_signals=handle_signals,
        traces_exporter=traces_exporter,
        trace_window_s=trace_window_s,
        trace_window_spans=trace_window_spans,
        resource_attributes=resource_attributes,
    )
    with _LOCK:
        old, _RECORDER = _RECORDER, rec
    if old is not None:
        old.shutdown()
    rec.start()
    if start:
        rec.job_start(at)
    return rec


def current_recorder() -> Recorder | None:
    """The configured recorder, or None (unlike :func:`get_recorder`, never configures one)."""
    return _RECORDER


def get_recorder() -> Recorder:
    """The process's recorder; configured with defaults (and an attempt begun) on first use."""
    rec = _RECORDER
    if rec is None:
        with _LOCK:
            rec = _RECORDER
        if rec is None:
            _log.info("goodput: not configured; using defaults (call goodput.configure())")
            rec = configure()
    return rec


def _at(at, name: str):
    from goodput.phases import to_ns

    if at is None:
        return None
    try:
        return to_ns(at, name)
    except (TypeError, ValueError) as exc:
        get_recorder().error("%s", exc)
        return False


def job_start(at=None) -> None:
    """Begin a new attempt at ``at`` (datetime or epoch seconds; default now).

    An attempt that is still open ends there (reason ``restart``). The start
    marker is written to the spool before this returns.
    """
    t = _at(at, "job_start(at)")
    if t is not False:
        get_recorder().job_start(t)


def job_end(at=None) -> None:
    """End the open attempt at ``at`` (default now) and write everything recorded.

    Not needed in most scripts: interpreter exit ends it too, and after a kill or SIGTERM
    the processor ends it at the process's last flushed sign of life.
    """
    t = _at(at, "job_end(at)")
    if t is not False:
        get_recorder().job_end(t)


def step_start(step: int, at=None) -> None:
    """Step ``step`` starts now (or ``at``); the previous step ends here.

    For frameworks with asynchronous dispatch (JAX), where step time is measured
    between step starts. The last step ends at the next ``step_start`` or at the
    attempt's end.
    """
    rec = get_recorder()
    if at is None:
        rec.step_start(step, time.time_ns())
        return
    t = _at(at, "step_start(at)")
    if t is not False:
        rec.step_start(step, t)


def flush(timeout_s: float = 5.0) -> bool:
    """Write everything recorded so far to the exporters now (blocking, bounded)."""
    return get_recorder().flush(timeout_s)


def shutdown() -> None:
    """End the open attempt and stop recording (also done at interpreter exit)."""
    global _RECORDER
    with _LOCK:
        rec, _RECORDER = _RECORDER, None
    if rec is not None:
        rec.shutdown()
