"""In-process goodput monitor for single-machine users (``docs/metrics.md``).

:class:`GoodputMonitor` runs a daemon thread in the training process that, every
``interval_s`` seconds, takes in what the recorder has appended to the run directory
since the last cycle (the spool tailer of ``goodput serve``), accounts every job (with
rolling windows) and publishes the result: OpenTelemetry metrics through the
given meter provider or metric readers, and TensorBoard scalars::

    import goodput
    from goodput_processor.serve.monitor import GoodputMonitor

    goodput.configure(run_dir="goodput-runs/my-job")
    with GoodputMonitor("goodput-runs/my-job", interval_s=30, tensorboard_dir="tb"):
        train()

It never raises into the training process once constructed: failures of a cycle are
logged and counted in :attr:`GoodputMonitor.errors`. ``stop(timeout_s)`` does one final
cycle and flush, and returns within about ``timeout_s`` seconds whatever happens.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Sequence

from ..account.windows import check_windows
from ..exporters.metrics import DEFAULT_WINDOWS_S, GoodputMetrics, JobSnapshot
from ..model.memo import AccountingMemo
from ..read.reader import RunDirError
from .store import LiveStore
from .tail import SpoolTailer

__all__ = ["GoodputMonitor"]

log = logging.getLogger(__name__)


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and value > 0
    ):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


class GoodputMonitor:
    """Background uploader of goodput metrics and TensorBoard scalars.

    Args:
        run_dir: the run directory the recorder writes (``goodput.configure(run_dir=...)``).
        interval_s: seconds between cycles (> 0).
        meter_provider: publish :class:`~.metrics.GoodputMetrics` gauges on this provider
            (the caller owns it and shuts it down).
        metric_readers: or: metric readers (e.g.
            :func:`~goodput_processor.exporters.metric_readers.otlp_reader`) for a provider
            the monitor creates, flushes on :meth:`stop` and shuts down.
        tensorboard_dir: write TensorBoard scalars under
            ``tensorboard_dir/goodput/<job>`` (None: no TensorBoard).
        windows_s: rolling windows in seconds for the ``goodput.window.*`` gauges.
        ideal_step_time_s: ideal step time (None: median of kept steps).
        job: monitor only this job (None: every job in the run directory).
        include_badput, include_step_deviation: TensorBoard tags to write.
        workload: also write ml-goodput-measurement's Cloud Monitoring series
            (``compute.googleapis.com/workload/*`` on ``compute.googleapis.com/Workload``,
            :mod:`.workload`) for every job, each cycle, to this project and location (a
            :class:`~.workload.WorkloadOptions`); the native metrics are unaffected.
        workload_definitions: the numbers of those series: ``"mgm"`` (default, the
            incumbent's definitions, as its dashboards had them) or ``"goodput"``.
        workload_client: the ``MetricServiceClient`` to send them with (default: one made
            with Application Default Credentials).

    Raises:
        ValueError: a bad interval, window or ideal step time; both ``meter_provider`` and
            ``metric_readers`` given; ``workload_definitions`` not ``"mgm"`` or ``"goodput"``;
            ``workload`` without ``acc_type`` (every series carries it as its
            ``accelerator_type`` label: without it each would be left out, every cycle).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        interval_s: float = 30.0,
        meter_provider=None,
        metric_readers: Sequence = (),
        tensorboard_dir: str | os.PathLike | None = None,
        windows_s: Sequence[float] = DEFAULT_WINDOWS_S,
        ideal_step_time_s: float | None = None,
        job: str | None = None,
        include_badput: bool = True,
        include_step_deviation: bool = True,
        workload=None,
        workload_definitions: str = "mgm",
        workload_client=None,
    ):
        self.run_dir = os.fspath(run_dir)
        self.windows_s = check_windows(windows_s)
        self.interval_s = _positive("interval_s", interval_s)
        if ideal_step_time_s is not None:
            _positive("ideal_step_time_s", ideal_step_time_s)
        if meter_provider is not None and metric_readers:
            raise ValueError("give either meter_provider or metric_readers, not both")
        self._own_provider = None
        if metric_readers:
            from opentelemetry.sdk.metrics import MeterProvider

            self._own_provider = meter_provider = MeterProvider(metric_readers=list(metric_readers))
        self.metrics = None
        if meter_provider is not None:
            self.metrics = GoodputMetrics(lambda: self._snaps, meter_provider,
                                          windows_s=windows_s, min_refresh_s=0)
        self.windows_s = check_windows(windows_s)
        self._ideal = ideal_step_time_s
        self._job = job
        self._tb_dir = None if tensorboard_dir is None else os.fspath(tensorboard_dir)
        self._tb_opts = dict(include_badput=include_badput,
                             include_step_deviation=include_step_deviation)
        self._tb: dict[str, object] = {}
        if workload_definitions not in ("mgm", "goodput"):
            raise ValueError(f"workload_definitions must be 'mgm' or 'goodput', got "
                             f"{workload_definitions!r}")
        if workload is not None and not workload.acc_type:
            raise ValueError(
                "workload needs acc_type, the accelerator_type label of every series (e.g. "
                "WorkloadOptions(project, location, acc_type='TPU-v5p')): a series without "
                "it is left out, so none would be written")
        self._workload = workload
        self._workload_definitions = workload_definitions
        self._mgm_memos: dict = {}  # job -> AccountingMemo of its mgm series
        self._sender = None
        if workload is not None:
            from ..exporters.workload import WorkloadSender

            self._sender = WorkloadSender(workload.project_id, workload_client)
        self._snaps: list[JobSnapshot] = []
        # Spool lines are read once: each cycle takes in only what is new.
        self._store = LiveStore(ideal_step_time_s)
        self._tailer = SpoolTailer(self._store, [self.run_dir])
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cycle_lock = threading.Lock()
        #: Completed cycles, failed cycles (or failed TensorBoard writes), and the
        #: duration of the last cycle in seconds.
        self.cycles = 0
        self.errors = 0
        self.last_cycle_s: float | None = None

    # -- public ----------------------------------------------------------------------
    @property
    def snapshots(self) -> list[JobSnapshot]:
        """The jobs as of the last completed cycle (empty before the first)."""
        return list(self._snaps)

    def start(self) -> GoodputMonitor:
        """Start the background thread (a no-op, logged, if it is already running)."""
        if self._thread is not None and self._thread.is_alive():
            log.warning("goodput monitor for %s is already running", self.run_dir)
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="goodput-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0, final: bool = True) -> bool:
        """Stop the thread: one final cycle (unless ``final`` is False) and a flush.

        Returns within about ``timeout_s`` seconds; True if everything finished in time.
        Never raises.
        """
        try:
            return self._stop_impl(max(0.0, float(timeout_s)), final)
        except Exception:  # never into the training process
            self.errors += 1
            log.exception("goodput monitor: stop failed")
            return False

    def run_once(self) -> bool:
        """Run one cycle now (read, account, publish); True on success. Never raises."""
        with self._cycle_lock:
            return self._cycle()

    def __enter__(self) -> GoodputMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.run_once()

    def _stop_impl(self, timeout_s: float, final: bool) -> bool:
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        ok = True
        t = self._thread
        if t is not None:
            t.join(timeout_s)  # the thread finishes its current cycle, if any
            ok = not t.is_alive()
            self._thread = None
        if final and ok:
            ok = self._run_bounded(deadline) and ok
        left_ms = max(0.0, deadline - time.monotonic()) * 1000
        if self._own_provider is not None:
            ok = bool(self._own_provider.force_flush(left_ms)) and ok
            self._own_provider.shutdown(timeout_millis=max(left_ms, 1.0))
        for tb in self._tb.values():
            try:
                tb.close()
            except Exception:
                self.errors += 1
                log.exception("goodput monitor: closing TensorBoard writer failed")
        self._tb.clear()
        if not ok:
            log.warning("goodput monitor: final flush did not finish within %.1f s", timeout_s)
        return ok

    def _run_bounded(self, deadline: float) -> bool:
        """Final cycle in a helper daemon thread, waited for until ``deadline``."""
        done = threading.Event()

        def final():
            self.run_once()
            done.set()

        threading.Thread(target=final, name="goodput-monitor-final", daemon=True).start()
        return done.wait(max(0.0, deadline - time.monotonic()))

    def _cycle(self) -> bool:
        t0 = time.perf_counter()
        try:
            if not os.path.isdir(self.run_dir):
                raise RunDirError(f"run directory {self.run_dir!r} does not exist or is not "
                                  "a directory")
            self._tailer.poll()
            names = self._store.jobs()
            if not names:
                raise RunDirError(f"run directory {self.run_dir!r} holds no goodput spans yet")
            if self._job is not None:
                names = [n for n in names if n == self._job]
            snaps = [self._store.snapshot_windows(n, self.windows_s) for n in names]
        except Exception as e:  # counted and logged, never raised
            self.errors += 1
            log.warning("goodput monitor: reading %s failed: %s", self.run_dir, e)
            return False
        self._snaps = snaps
        ok = True
        failed = [s.result.job for s in snaps if s.result.error is not None]
        if failed:  # reported failed (and left out of the gauges); the others go on
            ok = False
            self.errors += len(failed)
            log.warning("goodput monitor: accounting failed for job(s) %s", ", ".join(failed))
            snaps = [s for s in snaps if s.result.error is None]
        if self._tb_dir is not None:
            for s in snaps:
                try:
                    self._writer(s.result.job).write(s.result)
                except Exception:
                    ok = False
                    self.errors += 1
                    log.exception("goodput monitor: TensorBoard write failed")
        if self._sender is not None:
            for s in snaps:
                try:
                    self._send_workload(s)
                except Exception:
                    ok = False
                    self.errors += 1
                    log.exception("goodput monitor: Cloud Monitoring (workload) upload failed")
        self.cycles += 1
        self.last_cycle_s = time.perf_counter() - t0
        return ok

    def _send_workload(self, s: JobSnapshot) -> None:
        """ml-goodput-measurement's series of one job: cumulative, then each window."""
        from ..exporters import workload as wl

        spans = memo = None
        if self._workload_definitions == "mgm":
            spans = self._store.snapshot(s.result.job)
            # (the store's rows only grow: what new spans cannot change is kept per job)
            memo = self._mgm_memos.setdefault(s.result.job, AccountingMemo())
        self._sender.send(wl.job_series(s, self._workload, self._workload_definitions,
                                        spans=spans, ideal_step_time_s=self._ideal,
                                        memo=memo))

    def _writer(self, job: str):
        w = self._tb.get(job)
        if w is None:
            from ..exporters.tensorboard import TensorBoardWriter

            safe = re.sub(r"[^A-Za-z0-9._-]+", "_", job) or "_"
            w = self._tb[job] = TensorBoardWriter(os.path.join(self._tb_dir, "goodput", safe),
                                                  **self._tb_opts)
        return w
