"""ml-goodput-measurement's Cloud Monitoring series from ``goodput serve``.

With ``--workload-project`` and ``--workload-location``, serve writes, every
``--workload-interval`` seconds and for every job it tracks, the series Google's
``ml-goodput-measurement`` 0.2.3 uploads (``compute.googleapis.com/workload/*`` on the
monitored resource ``compute.googleapis.com/Workload``;
:mod:`goodput_processor.exporters.workload`),
so the dashboards and alerts users already have keep working when the uploads move from
each training job into the processor. The job name is the resource's ``workload_id``.
This project's own metrics (OTLP, Prometheus) are unaffected.
"""

from __future__ import annotations

import logging
import threading

from ..exporters import workload as wl
from .store import LiveStore

__all__ = ["WorkloadPublisher"]

_log = logging.getLogger(__name__)


class WorkloadPublisher:
    """Sends every job's mgm series from ``store`` (a :class:`LiveStore`).

    Args:
        store: the live jobs.
        opts: project, location, replica, accelerator type, cluster name
            (:class:`~goodput_processor.exporters.workload.WorkloadOptions`).
        interval_s: seconds between rounds (> 0).
        windows_s: rolling windows of the ``interval_*`` series, seconds.
        definitions: ``"mgm"`` (mgm's numbers, default) or ``"goodput"`` (this project's).
        client: a ``google.cloud.monitoring_v3.MetricServiceClient`` (default: one built
            with Application Default Credentials at the first send).

    One job whose series cannot be computed is logged and counted in :attr:`errors`; the
    other jobs are sent. Sending never raises (see
    :class:`~goodput_processor.exporters.workload.WorkloadSender`).

    Raises:
        ValueError: ``interval_s`` not > 0, or bad ``definitions``.
    """

    def __init__(self, store: LiveStore, opts: wl.WorkloadOptions, *, interval_s: float = 60.0,
                 windows_s=(60, 300, 900), definitions: str = "mgm", client=None):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        if definitions not in ("mgm", "goodput"):
            raise ValueError(f"definitions must be 'mgm' or 'goodput', got {definitions!r}")
        self.store, self.opts, self.interval_s = store, opts, float(interval_s)
        self.windows_s, self.definitions = tuple(windows_s), definitions
        self.sender = wl.WorkloadSender(opts.project_id, client)
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish_once(self) -> int:
        """Send one round now; returns the number of series sent."""
        series = []
        for name in self.store.jobs():
            try:
                snap = self.store.snapshot_windows(name, self.windows_s)
                if snap.result.error is not None:
                    raise RuntimeError(snap.result.error)
                spans = self.store.snapshot(name) if self.definitions == "mgm" else None
                series += wl.job_series(snap, self.opts, self.definitions, spans=spans,
                                        ideal_step_time_s=self.store.ideal_step_time_s)
            except KeyError:  # left meanwhile
                continue
            except Exception:  # one job never stops the others
                self.errors += 1
                _log.exception("goodput serve: the workload series of job %r failed", name)
        for i in range(0, len(series), 200):  # CreateTimeSeries takes 200 series a request
            self.sender.send(series[i : i + 200])
        return len(series)

    def start(self) -> WorkloadPublisher:
        """Publish every ``interval_s`` on a daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self._run, name="goodput-serve-gcm",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.publish_once()
            except Exception:  # the service carries on
                _log.exception("goodput serve: a workload metrics round failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (a round in progress is given ``timeout_s`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
