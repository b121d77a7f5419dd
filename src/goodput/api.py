"""The process-wide recorder and the lifecycle calls (configure, job start/end, flush)."""

from __future__ import annotations

import logging
import math
import operator
import threading
import time

from goodput import config
from goodput.clock import to_ns
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
        flush_interval_s: seconds between spool writes (default 1; 0.01 to 3600, a value
            above is capped, with a warning).
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

    Never raises: a bad setting (argument or environment variable) is warned about once,
    naming it and the default used instead (``docs/recording.md``, "Settings"); an unknown
    or uninstalled exporter is warned about and left out (the spool still works). Called
    after phases were recorded (with the defaults, or by an earlier ``configure``), it says
    where those went and where what follows goes.
    """

    global _RECORDER
    at = None
    if start_time is not None:
        try:
            at = to_ns(start_time, "start_time")
        except Exception as exc:
            config.bad_setting("start_time", start_time, str(exc),
                               "the process start")
    if at is None:
        at = config.process_start_ns()
    kwargs = dict(job_name=job_name, run_dir=run_dir, process_index=process_index,
                  process_count=process_count, flush_interval_s=flush_interval_s,
                  exporters=exporters, spool=spool, handle_signals=handle_signals,
                  traces_exporter=traces_exporter, trace_window_s=trace_window_s,
                  trace_window_spans=trace_window_spans,
                  resource_attributes=resource_attributes)
    try:
        rec = Recorder(**kwargs)
    except Exception as exc:  # not expected: every setting is checked; the defaults then
        _log.warning("goodput: configure(%s) failed (%r): recording with the defaults",
                     ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None), exc)
        rec = Recorder()
    with _LOCK:
        old, _RECORDER = _RECORDER, rec
    if old is not None:
        old.shutdown()
        _said_before(old, rec)
    rec.start()
    try:
        begin = bool(start)
    except Exception:
        config.bad_setting("start", start, "not a bool", True)
        begin = True
    if begin:
        rec.job_start(at)
    return rec


def _said_before(old: Recorder, new: Recorder) -> None:
    """Warn when ``configure`` comes after ``old`` (shut down) recorded phases: they stay in
    its job and attempt; the new recorder's are another attempt, or another job."""
    try:
        n = old.stats()["recorded"]
    except Exception:
        return
    if not n:
        return
    how = ("with the defaults (goodput.configure() had not been called yet)"
           if getattr(old, "_auto", False) else "by the goodput.configure() before this one")
    before = f"job {old.job_name!r} in {old.run_dir or 'no spool'}"
    after = f"job {new.job_name!r} in {new.run_dir or 'no spool'}"
    if before != after:
        what = (f"they stay in {before}, and what follows goes to {after}: the run is split "
                "into two jobs")
    else:
        what = (f"they stay in the attempt it ended, and a new attempt of {after} begins: "
                "the report shows a restart")
    _log.warning("goodput: configure() called after %d phase(s) were recorded %s: %s. "
                 "Call goodput.configure() once, before the first phase.", n, how, what)

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
            rec._auto = True  # configured by default (see _said_before)
    return rec


#: Step numbers are below 2^63 (an OTLP ``intValue`` is an int64).
MAX_STEP = 1 << 63


def step_number(value, what: str = "goodput.step", then: str = "not recorded"):
    """``value`` as a step number (an int, 0 <= n < 2^63), else None after counting and logging an
    error (:meth:`Recorder.error`) that names ``what`` and says ``then`` (what happens
    instead): ints, numpy and 0-d torch integers and integral floats (``3.0``) are step
    numbers; bools, strings, other floats, negative numbers and anything else are not.
    Never raises."""
    if type(value) is int and 0 <= value < MAX_STEP:
        return value
    n = None
    if not isinstance(value, (bool, str, bytes)):
        try:
            n = int(operator.index(value))
        except Exception:
            try:
                f = float(value)
                n = int(f) if math.isfinite(f) and f.is_integer() else None
            except Exception:
                n = None
    if n is not None and 0 <= n < MAX_STEP:
        return n
    try:
        shown = repr(value)[:80]
    except Exception:
        shown = type(value).__name__
    _recorder_or_none_error("%s: %s (%s) is not a step number (an integer >= 0): %s", what,
                            shown, type(value).__name__, then)
    return None


def _recorder_or_none_error(message: str, *args) -> None:
    """Count and log an error on the recorder (configured with the defaults if need be)."""
    try:
        get_recorder().error(message, *args)
    except Exception:
        _log.warning("goodput: " + message, *args)


def _at(at, name: str):

    if at is None:
        return None
    try:
        return to_ns(at, name)
    except Exception as exc:
        _recorder_or_none_error("%s", exc)
        return False


def job_start(at=None) -> None:
    """Begin a new attempt at ``at`` (datetime or epoch seconds; default now).

    An attempt that is still open ends there (reason ``restart``). The start
    marker is written to the spool before this returns. A bad ``at`` is logged and
    counted (nothing begins); never raises.
    """
    try:
        t = _at(at, "job_start(at)")
        if t is not False:
            get_recorder().job_start(t)
    except Exception as exc:
        _recorder_or_none_error("job_start failed: %r", exc)


def job_end(at=None) -> None:
    """End the open attempt at ``at`` (default now) and write everything recorded.

    Not needed in most scripts: interpreter exit ends it too, and after a kill or SIGTERM
    the processor ends it at the process's last flushed sign of life. A bad ``at`` is
    logged and counted (nothing ends); never raises.
    """
    try:
        t = _at(at, "job_end(at)")
        if t is not False:
            get_recorder().job_end(t)
    except Exception as exc:
        _recorder_or_none_error("job_end failed: %r", exc)


def step_start(step: int, at=None) -> None:
    """Step ``step`` (an int >= 0; see :func:`step_number`) starts now (or ``at``); the
    previous step ends here.

    For frameworks with asynchronous dispatch (JAX), where step time is measured
    between step starts. The last step ends at the next ``step_start`` or at the
    attempt's end. A bad ``step`` or ``at`` is logged and counted, and that start not
    recorded; never raises.
    """
    try:
        rec = _RECORDER or get_recorder()
        if type(step) is not int or not 0 <= step < MAX_STEP:
            step = step_number(step, "goodput.step_start")
            if step is None:
                return
        if at is None:
            rec.step_start(step, time.time_ns())
            return
        t = _at(at, "step_start(at)")
        if t is not False:
            rec.step_start(step, t)
    except Exception as exc:
        _recorder_or_none_error("step_start failed: %r", exc)


def flush(timeout_s: float = 5.0) -> bool:
    """Write everything recorded so far to the exporters now (blocking, at most
    ``timeout_s`` seconds, a finite number >= 0, at most 3600; another value: 5 s, or 3600
    above it, with a warning). Returns False if that did not finish in time or failed;
    never raises."""
    try:
        t = float(timeout_s)
        if not (math.isfinite(t) and t >= 0) or isinstance(timeout_s, bool):
            raise ValueError
    except Exception:
        config.bad_setting("flush(timeout_s)", timeout_s, "not a finite number >= 0", "5")
        t = 5.0
    if t > 3600:
        config.bad_setting("flush(timeout_s)", timeout_s, "above 3600", "3600")
        t = 3600.0
    try:
        return get_recorder().flush(t)
    except Exception as exc:
        _recorder_or_none_error("flush failed: %r", exc)
        return False


def shutdown() -> None:
    """End the open attempt and stop recording (also done at interpreter exit). Never
    raises."""
    global _RECORDER
    with _LOCK:
        rec, _RECORDER = _RECORDER, None
    if rec is not None:
        try:
            rec.shutdown()
        except Exception as exc:
            _log.warning("goodput: shutdown failed: %r", exc)
