"""``ml_goodput_measurement.monitoring`` (0.2.3): ``GoodputMonitor``.

Same constructor (positional order, keywords, defaults) and methods as the incumbent's::

    from goodput.mgm import monitoring        # was: from ml_goodput_measurement import monitoring

    monitor = monitoring.GoodputMonitor(
        job_name=run_name, logger_name=f"goodput_{run_name}", tensorboard_dir=tb_dir,
        upload_interval=30, monitoring_enabled=True, include_badput_breakdown=True,
        include_step_deviation=True, gcp_options=monitoring.GCPOptions(...))
    monitor.start_goodput_uploader()
    ...
    monitor.stop_goodput_uploader()

What it does, per uploader (each a daemon thread with its own calculator over the job's run
directory: ``run_dir=``, else ``GOODPUT_RUN_DIR``, else ``goodput-runs/<job_name>``, where
the recorder writes; see :mod:`goodput.mgm.goodput`):

- ``start_goodput_uploader``: every ``upload_interval`` seconds, the cumulative goodput
  (and with ``include_badput_breakdown`` the breakdown) as TensorBoard scalars under
  ``tensorboard_dir/goodput`` with the incumbent's tags (``goodput/goodput``,
  ``badput/<type>``, ``badput/custom_badput_events/<type>``; percent, at step = last
  productive step), and with ``GCPOptions.enable_gcp_goodput_metrics`` the incumbent's
  Cloud Monitoring series (:mod:`goodput_processor.exporters.workload`);
- ``start_step_deviation_uploader`` (with ``include_step_deviation``): every
  ``step_deviation_interval_seconds``, ``step_deviation`` per step (seconds), and
  ``performance`` with ``enable_gcp_step_deviation_metrics``;
- ``start_rolling_window_goodput_uploader(rolling_windows_seconds)``: every
  ``upload_interval``, ``interval_goodput`` / ``interval_badput`` per window to Cloud
  Monitoring; ``start_goodput_interval_uploader(window_size_seconds)`` (the name of
  releases before 0.2) is the same with one window.

Each ``stop_*`` asks for one final upload (unless ``skip_final_flush``), first writing what
this process's recorder of the job holds to the spool (so the final numbers count every
call recorded until then, as ``goodput report --definitions mgm`` and the calculator
would at that moment), and returns within
``final_flush_timeout_seconds`` (default 10) whatever happens: a stuck upload is abandoned on
its daemon thread, so the monitor never holds up the end of the job. Nothing raises into
the training program: failures are logged and counted in :attr:`GoodputMonitor.errors`.

The numbers are the incumbent's own definitions by default (``definitions="mgm"``, a
keyword of this project), so dashboards and TensorBoard curves continue where the
incumbent left them and equal ``goodput report --definitions mgm``;
``definitions="goodput"`` gives this project's model under the same names (plus
``badput/training_slowdown``).

``pathway_enabled`` is kept (the incumbent passes it to its calculator as
``using_pathways``, which its 0.2.3 calculator stores and does not otherwise use); the
same holds here. ``gcs_sync_interval_seconds``, ``cache_dir`` and
``max_logs_retention_period`` belong to the incumbent's Cloud Logging cache: accepted,
unused.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import threading

from goodput import api
from goodput.mgm import goodput, goodput_utils

__all__ = ["ACTIVITY_EXCLUSION_LIST", "BadputType", "GCPOptions", "GoodputCalculator",
           "GoodputMonitor", "IntervalMetricType", "IntervalWorkloadMetricDetails", "MetricType",
           "MonitoringWindowType", "UnproductiveTimeDict", "WorkloadMetricDetails"]

log = logging.getLogger(__name__)

BadputType = goodput_utils.BadputType
GCPOptions = goodput_utils.GCPOptions
GoodputCalculator = goodput.GoodputCalculator
IntervalMetricType = goodput_utils.IntervalMetricType
IntervalWorkloadMetricDetails = goodput_utils.IntervalWorkloadMetricDetails
MetricType = goodput_utils.MetricType
MonitoringWindowType = goodput_utils.MonitoringWindowType
UnproductiveTimeDict = goodput.UnproductiveTimeDict
WorkloadMetricDetails = goodput_utils.WorkloadMetricDetails
ACTIVITY_EXCLUSION_LIST = goodput_utils.ACTIVITY_EXCLUSION_LIST

_TENSORBOARD_GCS_SUBDIR = "goodput"
_TENSORBOARD_GOODPUT_LABEL = "goodput"
_TENSORBOARD_BADPUT_LABEL = "badput"
_TENSORBOARD_STEP_DEVIATION_LABEL = "step_deviation"
_PROCESS_TERMINATION_TIMEOUT_SECONDS = 10


def _names(d: dict) -> dict:
    """Enum-keyed details -> name-keyed (as :mod:`goodput_processor.exporters.workload`
    takes them)."""
    return {getattr(k, "name", k): (_names(v) if isinstance(v, dict) else v)
            for k, v in d.items()}


def _run_with_timeout(func, timeout_s: float | None, description: str) -> bool:
    """Run ``func`` on a daemon thread and wait for it up to ``timeout_s`` seconds (None:
    until done); a call still running then is abandoned (logged). True if it finished."""
    t = threading.Thread(target=func, name="goodput-mgm-final", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        log.warning("%s did not complete within %s seconds and is abandoned so as not to "
                    "hold up the job", description, timeout_s)
        return False
    return True


class _Uploader:
    """One periodic uploader: a daemon thread running ``cycle`` every ``interval_s`` seconds
    and once more at stop (the final flush) unless asked not to."""

    def __init__(self, name: str, interval_s: float, cycle, close):
        self.name, self.interval_s, self._cycle, self._close = name, interval_s, cycle, close
        self._stop = threading.Event()
        self._final = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"goodput-mgm-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self._cycle()
            if self._final.is_set():
                self._cycle()
        finally:
            self._close()

    def stop(self, final: bool, timeout_s: float | None) -> bool:
        """Ask for the final cycle (``final``) and stop; wait up to ``timeout_s`` (None:
        until done). True if the thread ended in time."""
        if final:
            self._final.set()
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("goodput %s uploader did not finish within %s s: abandoned so as not "
                        "to hold up the job; its final upload may be missing", self.name,
                        timeout_s)
            return False
        return True


class GoodputMonitor:
    """Drop-in for ``ml_goodput_measurement.monitoring.GoodputMonitor`` (module docstring).

    Args:
        job_name: the job (run) name, as given to the recorder.
        logger_name: the incumbent's log name: kept, not used to pick the run directory.
        tensorboard_dir: scalars go to ``tensorboard_dir/goodput``.
        upload_interval: seconds between cumulative (and rolling-window) uploads.
        monitoring_enabled: do anything at all (set it on one process, e.g. process 0).
        pathway_enabled: the calculator's ``using_pathways`` (module docstring).
        include_badput_breakdown: write the ``badput/*`` scalars.
        include_step_deviation: allow the step-deviation uploader.
        configured_ideal_step_time: ideal step time in seconds (None: estimated).
        step_deviation_interval_seconds: seconds between step-deviation uploads.
        gcp_options: :class:`GCPOptions`; project, location and accelerator type left None
            are read from the GCE metadata server; without a project and location, nothing
            goes to Cloud Monitoring (logged). The options are copied, not modified.
        skip_final_flush: default for the ``stop_*`` methods' ``skip_final_flush``.
        final_flush_timeout_seconds: the most a ``stop_*`` waits (None: until done).
        gcs_sync_interval_seconds, cache_dir, max_logs_retention_period: accepted, unused.
        run_dir: (keyword) the run directory (default: as the recorder's).
        definitions: (keyword) ``"mgm"`` (default) or ``"goodput"``.
        gcp_client: (keyword) a ``MetricServiceClient`` to send with (default: one made
            with Application Default Credentials).

    Raises:
        ValueError: a bad ``definitions``, or an interval that is not a number of seconds
            > 0 (only when ``monitoring_enabled``).
    """

    _calculator_class = goodput.GoodputCalculator
    _include_slice_efficiency = False

    def __init__(
        self,
        job_name: str,
        logger_name: str,
        tensorboard_dir: str,
        upload_interval: int,
        monitoring_enabled: bool = False,
        pathway_enabled: bool = False,
        include_badput_breakdown=False,
        include_step_deviation=False,
        configured_ideal_step_time=None,
        step_deviation_interval_seconds=10,
        gcp_options: GCPOptions = GCPOptions(),  # noqa: B008 - the incumbent's default
        skip_final_flush: bool = False,
        final_flush_timeout_seconds: float | None = _PROCESS_TERMINATION_TIMEOUT_SECONDS,
        gcs_sync_interval_seconds: int = 3600,
        cache_dir: str = "/tmp",
        max_logs_retention_period: datetime.timedelta | None = None,
        *,
        run_dir=None,
        definitions: str = "mgm",
        gcp_client=None,
    ):
        self.job_name = job_name
        self.logger_name = logger_name
        self.errors = 0
        if not monitoring_enabled:
            log.info("Monitoring is disabled. GoodputMonitor will not be initialized.")
            self._initialized = False
            return
        if definitions not in ("goodput", "mgm"):
            raise ValueError(f"definitions must be 'goodput' or 'mgm', got {definitions!r}")
        for name, v in (("upload_interval", upload_interval),
                        ("step_deviation_interval_seconds", step_deviation_interval_seconds)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {v!r}")
        self._initialized = True
        self._skip_final_flush = skip_final_flush
        self._final_flush_timeout_seconds = final_flush_timeout_seconds
        self.pathway_enabled = pathway_enabled
        self.tensorboard_dir = os.path.join(tensorboard_dir, _TENSORBOARD_GCS_SUBDIR)
        self.upload_interval = upload_interval
        self.step_deviation_interval_seconds = step_deviation_interval_seconds
        self.include_badput_breakdown = include_badput_breakdown
        self.include_step_deviation = include_step_deviation
        self.configured_ideal_step_time = configured_ideal_step_time
        self.rolling_windows: list = []
        self._run_dir = run_dir
        self._definitions = definitions
        self._gcp_options = opts = dataclasses.replace(gcp_options)
        self._sender = None
        if opts.enable_gcp_goodput_metrics or opts.enable_gcp_step_deviation_metrics:
            if not opts.project_id:
                opts.project_id = goodput_utils.get_gcp_project_id()
            if not opts.location:
                opts.location = goodput_utils.get_node_zone()
            if not opts.acc_type:
                opts.acc_type = goodput_utils.get_accelerator_type()
            if opts.project_id and opts.location:
                from goodput_processor.mgm_entry import WorkloadSender

                self._sender = WorkloadSender(opts.project_id, gcp_client)
            else:
                log.warning("Project ID or location could not be determined. Disabling GCP "
                            "Monitoring.")
                opts.enable_gcp_goodput_metrics = False
                opts.enable_gcp_step_deviation_metrics = False
        self._uploaders: dict[str, _Uploader | None] = {
            "goodput": None, "step_deviation": None, "rolling_window": None}
        self._tb_lock = threading.Lock()
        self._tb = None

    # --- pieces ---------------------------------------------------------------------------

    def _calculator(self):
        return self._calculator_class(self.job_name, self.logger_name,
                                      using_pathways=self.pathway_enabled,
                                      run_dir=self._run_dir, definitions=self._definitions)

    def _workload_options(self):
        from goodput_processor.mgm_entry import WorkloadOptions

        o = self._gcp_options
        return WorkloadOptions(o.project_id, o.location, o.replica_id, o.acc_type,
                               o.cluster_name, self._include_slice_efficiency)

    def _writer(self):
        """The TensorBoard writer, shared by the uploaders (made on first use)."""
        if self._tb is None:
            from goodput_processor.mgm_entry import ScalarWriter

            self._tb = ScalarWriter(self.tensorboard_dir)
        return self._tb

    def _failed(self, what: str, e: Exception) -> None:
        self.errors += 1
        log.warning("goodput monitor of job %s: %s failed (this does not affect the "
                    "workload): %s", self.job_name, what, e)

    def _goodput_cycle(self, calc) -> None:
        try:
            percent, badput, last_step = calc.get_job_goodput(
                include_badput_breakdown=self.include_badput_breakdown)
        except Exception as e:
            self._failed("querying goodput", e)
            return
        try:
            from goodput_processor.mgm_entry import mgm_badput_scalars

            points = mgm_badput_scalars(_TENSORBOARD_GOODPUT_LABEL,
                                        {_TENSORBOARD_GOODPUT_LABEL: percent})
            if self.include_badput_breakdown:
                points += mgm_badput_scalars(_TENSORBOARD_BADPUT_LABEL, _names(badput))
            with self._tb_lock:
                w = self._writer()
                for tag, value, display in points:
                    w.add_scalar(tag, value, last_step, display_name=display)
                w.flush()
        except Exception as e:
            self._failed("writing TensorBoard scalars", e)
        if self._gcp_options.enable_gcp_goodput_metrics and self._sender is not None:
            try:
                from goodput_processor.mgm_entry import cumulative_series

                d = _names(calc.get_job_goodput_details())
                if d["goodput_time"]:
                    self._sender.send(cumulative_series(self.job_name, d,
                                                        self._workload_options()))
            except Exception as e:
                self._failed("uploading to Cloud Monitoring", e)

    def _step_deviation_cycle(self, calc) -> None:
        try:
            deviation = calc.get_step_deviation(self.configured_ideal_step_time)
        except Exception as e:
            self._failed("querying step deviation", e)
            return
        try:
            with self._tb_lock:
                w = self._writer()
                for step, value in deviation.items():
                    w.add_scalar(_TENSORBOARD_STEP_DEVIATION_LABEL, float(value), step)
                w.flush()
        except Exception as e:
            self._failed("writing step deviation to TensorBoard", e)
        if self._gcp_options.enable_gcp_step_deviation_metrics and self._sender is not None:
            try:
                from goodput_processor.mgm_entry import step_deviation_series

                self._sender.send(step_deviation_series(self.job_name, deviation,
                                                        self._workload_options()))
            except Exception as e:
                self._failed("uploading step deviation", e)

    def _rolling_cycle(self, calc) -> None:
        if not (self._gcp_options.enable_gcp_goodput_metrics and self._sender is not None):
            return
        from goodput_processor.mgm_entry import interval_series

        now = datetime.datetime.now(datetime.timezone.utc)
        for window in self.rolling_windows:
            try:
                d = calc.get_interval_metric_details(
                    now - datetime.timedelta(seconds=window), now)
                self._sender.send(interval_series(self.job_name, _names(d),
                                                  self._workload_options()))
            except Exception as e:
                self._failed(f"rolling window {window} s", e)

    def _start(self, key: str, interval_s: float, cycle) -> None:
        up = self._uploaders[key]
        if up is not None and up.alive():
            log.warning("goodput %s uploader is already running.", key)
            return
        try:
            calc = self._calculator()
            up = _Uploader(key, interval_s, lambda: cycle(calc), lambda: None)
            up.start()
            self._uploaders[key] = up
        except Exception as e:
            self._failed(f"starting the {key} uploader", e)

    def _flush_recorder(self, timeout_s: float | None) -> None:
        """Write what this process's recorder of the job holds to the spool (within
        ``timeout_s`` seconds, at most 2), so that a final upload counts it."""
        try:
            rec = api.current_recorder()
            if (rec is not None and not getattr(rec, "_shut", False)
                    and rec.job_name == self.job_name):
                rec.flush(min(2.0, timeout_s or 2.0), exporters=False)
        except Exception as e:
            self._failed("writing the recorder's spool before the final upload", e)

    def _stop(self, key: str, skip_final_flush: bool | None, final_once) -> None:
        skip = self._skip_final_flush if skip_final_flush is None else skip_final_flush
        timeout = (_PROCESS_TERMINATION_TIMEOUT_SECONDS if skip
                   else self._final_flush_timeout_seconds)
        if not skip:
            self._flush_recorder(timeout)
        up, self._uploaders[key] = self._uploaders[key], None
        try:
            if up is not None:
                up.stop(not skip, timeout)
            elif not skip:  # never started: one bounded upload now, with a fresh calculator
                _run_with_timeout(lambda: final_once(self._calculator()), timeout,
                                  f"final {key} upload")
        except Exception as e:
            self._failed(f"stopping the {key} uploader", e)
        if all(u is None or not u.alive() for u in self._uploaders.values()):
            self._close_writer()

    def _close_writer(self) -> None:
        with self._tb_lock:
            if self._tb is not None:
                try:
                    self._tb.close()
                except Exception as e:
                    self._failed("closing the TensorBoard writer", e)
                self._tb = None

    # --- the incumbent's API -------------------------------------------------------------

    def start_goodput_uploader(self) -> None:
        """Start the cumulative goodput uploader (a warning if it is already running)."""
        if self._initialized:
            self._start("goodput", self.upload_interval, self._goodput_cycle)

    def stop_goodput_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stop it, after a final upload unless ``skip_final_flush`` (default: the
        constructor's); returns within ``final_flush_timeout_seconds``."""
        if self._initialized:
            self._stop("goodput", skip_final_flush, self._goodput_cycle)

    def start_step_deviation_uploader(self) -> None:
        """Start the step-deviation uploader (only with ``include_step_deviation``)."""
        if not self._initialized or not self.include_step_deviation:
            log.info("Step deviation monitoring is disabled.")
            return
        self._start("step_deviation", self.step_deviation_interval_seconds,
                    self._step_deviation_cycle)

    def stop_step_deviation_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stop it, after a final upload unless ``skip_final_flush``."""
        if self._initialized:
            self._stop("step_deviation", skip_final_flush, self._step_deviation_cycle)

    def start_rolling_window_goodput_uploader(self, rolling_windows_seconds: list[int]) -> None:
        """Start uploading interval goodput and badput over the last W seconds, for each W
        of ``rolling_windows_seconds``, to Cloud Monitoring.

        Raises:
            ValueError: a window is not a number of seconds > 0.
        """
        if not self._initialized:
            return
        windows = list(rolling_windows_seconds)
        for w in windows:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
                raise ValueError(f"rolling window must be a number of seconds > 0, got {w!r}")
        self.rolling_windows = windows
        self._start("rolling_window", self.upload_interval, self._rolling_cycle)

    def stop_rolling_window_goodput_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stop it, after a final upload unless ``skip_final_flush``."""
        if self._initialized:
            self._stop("rolling_window", skip_final_flush, self._rolling_cycle)

    def start_goodput_interval_uploader(self, window_size_seconds: float) -> None:
        """The interval uploader of releases before 0.2: the rolling-window uploader with
        the one window ``window_size_seconds``."""
        self.start_rolling_window_goodput_uploader([window_size_seconds])

    def stop_goodput_interval_uploader(self) -> None:
        """Stop the interval uploader (:meth:`stop_rolling_window_goodput_uploader`)."""
        self.stop_rolling_window_goodput_uploader()

    def __del__(self):
        if not getattr(self, "_initialized", False):
            return
        try:
            for key, up in list(getattr(self, "_uploaders", {}).items()):
                if up is not None and up.alive():
                    up.stop(False, 1.0)
                    self._uploaders[key] = None
        except Exception:  # noqa: S110 - never from a finaliser
            pass
