"""The ``goodput serve`` service: receivers, spool tailers and the live store, with shutdown.

:class:`GoodputServer` starts what was asked for (OTLP gRPC, OTLP HTTP, spool tailing) in
front of one :class:`~goodput_processor.serve.store.LiveStore`: the receivers first (so
``/healthz`` answers; requests get the retryable status until the store is ready), then
the replay of the store's write-ahead log, then the spool tailer. A maintenance thread
retires idle jobs, re-probes a write-ahead log that failed, packs the rows of processes
gone quiet and gives back the C heap's free pages once the process has grown. It stops
gracefully: stop accepting, drain requests in flight, read the spools once more, then
compute the final results, all within one ``timeout_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from ..results.job import JobResult
from .grpc_receiver import GrpcReceiver
from .health import HealthListener
from .http import HttpReceiver
from .limits import ByteBudget, Limits
from .receiver import Gate
from .store import LiveStore
from .tail import SpoolTailer

__all__ = ["GoodputServer"]

_log = logging.getLogger(__name__)


class GoodputServer:
    """Everything ``goodput serve`` runs, in-process.

    Args:
        store: the live state (default: a new :class:`LiveStore`).
        host: address to bind (default loopback ``127.0.0.1``; ``0.0.0.0`` for all).
        grpc_port, http_port: ports (0 = any free port, None = that receiver is off).
        spool_dirs: directories to tail (empty = no tailing).
        token: bearer token required from clients (None = none).
        tls: ``(cert_file, key_file)`` PEM paths (None = plaintext).
        max_message_bytes: largest request accepted, after decompression (default
            ``limits.max_message_bytes``, 16 MiB).
        poll_s: seconds between spool polls.
        limits: the ceilings (:class:`~goodput_processor.serve.limits.Limits`; default
            the store's).
        metrics: a callable returning ``(body bytes, content type)`` of the Prometheus
            text exposition, served at ``GET /metrics`` on the HTTP port (None: 404).
        on_retire: called with the final :class:`JobResult` of each job that leaves
            after the store's ``retention_s`` (e.g. to write it to a report file).
        maintain_s: seconds between maintenance rounds (retire idle jobs, probe a failed
            write-ahead log, pack quiet processes' rows).
        health_port: port of ``/healthz`` and ``/readyz`` apart from the receivers, on
            ``host`` (:mod:`~goodput_processor.serve.health`; 0 = any free port, None = none:
            they are answered on the HTTP port only, where ingest connections can starve
            them).

    Raises:
        RuntimeError, OSError: a port cannot be bound or a TLS file cannot be read (what
            was already started is stopped).
        ValueError: bad ``poll_s`` or ``max_message_bytes``.
    """

    def __init__(self, store: LiveStore | None = None, *, host: str = "127.0.0.1",
                 grpc_port: int | None = 4317, http_port: int | None = 4318,
                 spool_dirs=(), token: str | None = None, tls: tuple[str, str] | None = None,
                 max_message_bytes: int | None = None, poll_s: float = 0.5,
                 limits: Limits | None = None, metrics=None, on_retire=None,
                 maintain_s: float = 5.0, health_port: int | None = None):
        if max_message_bytes is not None and not max_message_bytes > 0:
            raise ValueError(f"max_message_bytes must be > 0, got {max_message_bytes!r}")
        self.store = store or LiveStore(limits=limits)
        self.limits = limits or self.store.limits
        if max_message_bytes is not None:
            self.limits = replace(self.limits, max_message_bytes=max_message_bytes)
        max_message_bytes = self.limits.max_message_bytes
        self.budget = ByteBudget(self.limits.max_inflight_bytes)
        self.gate = Gate()
        self.grpc = self.http = self.tailer = self.health = None
        self._stopped = threading.Event()
        self._maintainer: threading.Thread | None = None
        self.on_retire, self.maintain_s = on_retire, float(maintain_s)
        kw = dict(token=token, tls=tls, max_message_bytes=max_message_bytes, gate=self.gate,
                  limits=self.limits, budget=self.budget)
        try:
            if health_port is not None:  # first: it answers while the rest starts
                self.health = HealthListener(host, health_port, alive=self.alive,
                                             ready=self.store.ready).start()
            if grpc_port is not None:
                self.grpc = GrpcReceiver(self.store, host, grpc_port, **kw).start()
            if http_port is not None:
                self.http = HttpReceiver(self.store, host, http_port, metrics=metrics,
                                         **kw).start()
            if self.store.wal is not None and self.store.replayed is None:
                self.store.wal.start()
                self.store.replay()
            if spool_dirs:
                self.tailer = SpoolTailer(self.store, spool_dirs, poll_s)
                self.tailer.poll()  # what is there already, before serving results
                self.tailer.start()
            self._maintainer = threading.Thread(target=self._maintain, daemon=True,
                                                name="goodput-serve-maintain")
            self._maintainer.start()
        except BaseException:
            self.stop(1.0, final=False)
            raise

    def _maintain(self) -> None:
        while not self._stopped.wait(self.maintain_s):
            try:
                self.maintain()
            except Exception:  # the service carries on whatever one round ran into
                _log.exception("goodput serve: maintenance round failed")

    def maintain(self) -> list[JobResult]:
        """One maintenance round (the thread runs it every ``maintain_s``): retire idle
        jobs (returned, and given to ``on_retire``), re-probe a write-ahead log that
        failed, pack the rows of quiet processes (:meth:`LiveStore.compact`), and give the
        C heap's free pages back (:meth:`LiveStore.give_back_heap`: once after the first
        accounting that follows a compaction, else once the process has grown by
        :data:`~goodput_processor.read.heap.GROWTH_MARGIN_BYTES` since they last were; what a
        poll freed stays resident in glibc's heap until then; ``docs/benchmarks.md``,
        "The heap a poll left behind")."""
        wal = self.store.wal
        if wal is not None and wal.error:
            wal.probe()
        retired = self.store.retire_idle()
        self.store.compact()
        self.store.give_back_heap()
        for r in retired:
            if self.on_retire is not None:
                self.on_retire(r)
        return retired

    def alive(self) -> tuple[bool, str]:
        """``(True, "ok")`` while the process serves: the HTTP receiver's and the
        maintenance threads run (what ``/healthz`` of the health port answers); else
        ``(False, why)``. Takes no lock."""
        if self._stopped.is_set():
            return False, "stopping"
        http = self.http._thread if self.http is not None else None
        if http is not None and not http.is_alive():
            return False, "the OTLP/HTTP receiver stopped"
        if self._maintainer is not None and not self._maintainer.is_alive():
            return False, "the maintenance thread stopped"
        return True, "ok"

    def addresses(self) -> dict[str, str]:
        """What is listening: ``{"grpc": "host:port", "http": "http://host:port"}``, and
        ``"health": "http://host:port"`` with a health port."""
        out = {}
        if self.grpc:
            out["grpc"] = f"{self.grpc.host}:{self.grpc.port}"
        if self.http:
            host = f"[{self.http.host}]" if ":" in self.http.host else self.http.host
            out["http"] = f"{self.http.scheme}://{host}:{self.http.port}"
        if self.health:
            host = f"[{self.health.host}]" if ":" in self.health.host else self.health.host
            out["health"] = f"http://{host}:{self.health.port}"
        return out

    def stop(self, timeout_s: float = 10.0, final: bool = True) -> list[JobResult] | None:
        """Stop accepting, drain, read the spools once more, and compute the final results.

        Everything is bounded by ``timeout_s`` seconds in total. Returns the final results
        (sorted by job), or None when ``final`` is False or they could not be computed in
        the time left (logged). Safe to call twice (the second call returns None).
        """
        if self._stopped.is_set():
            return None
        self._stopped.set()
        deadline = time.monotonic() + timeout_s
        left = lambda: max(0.0, deadline - time.monotonic())  # noqa: E731
        for part in (self.grpc, self.http):
            if part is not None:
                part.stop(left() / 2)
        if self.tailer is not None:
            self.tailer.stop(left() / 2)
        if self._maintainer is not None:
            self._maintainer.join(left() / 4)
        if self.store.wal is not None:
            self.store.wal.close()  # fsynced: nothing acknowledged waits on a timer
        if self.health is not None:  # last: it answered (503, stopping) while the rest stopped
            self.health.stop(min(1.0, left()))
        if not final:
            return None
        box: list = []
        worker = threading.Thread(target=lambda: box.append(self.store.results(time.time_ns())),
                                  name="goodput-serve-final", daemon=True)
        worker.start()
        worker.join(left())
        if not box:
            _log.warning("goodput serve: final results not computed within %.1f s", timeout_s)
            return None
        return box[0]
