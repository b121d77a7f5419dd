"""The ``goodput serve`` service: receivers, spool tailers and the live store, with shutdown.

:class:`GoodputServer` starts what was asked for (OTLP gRPC, OTLP HTTP, spool tailing) in
front of one :class:`~goodput_processor.serve.store.LiveStore` and stops it gracefully:
stop accepting, drain requests in flight, read the spools once more, then compute the
final results, all within one ``timeout_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from ..report import JobResult
from .limits import ByteBudget, Limits
from .receiver import DEFAULT_MAX_MESSAGE_BYTES, Gate, GrpcReceiver, HttpReceiver
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
        max_message_bytes: largest request accepted, after decompression (overrides
            ``limits.max_message_bytes``).
        poll_s: seconds between spool polls.
        limits: the ceilings (:class:`~goodput_processor.serve.limits.Limits`; default
            its defaults).
        metrics: a callable returning ``(body bytes, content type)`` of the Prometheus
            text exposition, served at ``GET /metrics`` on the HTTP port (None: 404).

    Raises:
        RuntimeError, OSError: a port cannot be bound or a TLS file cannot be read (what
            was already started is stopped).
        ValueError: bad ``poll_s`` or ``max_message_bytes``.
    """

    def __init__(self, store: LiveStore | None = None, *, host: str = "127.0.0.1",
                 grpc_port: int | None = 4317, http_port: int | None = 4318,
                 spool_dirs=(), token: str | None = None, tls: tuple[str, str] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, poll_s: float = 0.5,
                 limits: Limits | None = None, metrics=None):
        if not max_message_bytes > 0:
            raise ValueError(f"max_message_bytes must be > 0, got {max_message_bytes!r}")
        self.store = store or LiveStore()
        self.limits = replace(limits or Limits(), max_message_bytes=max_message_bytes)
        self.budget = ByteBudget(self.limits.max_inflight_bytes)
        self.gate = Gate()
        self.grpc = self.http = self.tailer = None
        self._stopped = threading.Event()
        kw = dict(token=token, tls=tls, max_message_bytes=max_message_bytes, gate=self.gate,
                  limits=self.limits, budget=self.budget)
        try:
            if grpc_port is not None:
                self.grpc = GrpcReceiver(self.store, host, grpc_port, **kw).start()
            if http_port is not None:
                self.http = HttpReceiver(self.store, host, http_port, metrics=metrics,
                                         **kw).start()
            if spool_dirs:
                self.tailer = SpoolTailer(self.store, spool_dirs, poll_s)
                self.tailer.poll()  # what is there already, before serving results
                self.tailer.start()
        except BaseException:
            self.stop(1.0, final=False)
            raise

    def addresses(self) -> dict[str, str]:
        """What is listening: ``{"grpc": "host:port", "http": "http://host:port"}``."""
        out = {}
        if self.grpc:
            out["grpc"] = f"{self.grpc.host}:{self.grpc.port}"
        if self.http:
            host = f"[{self.http.host}]" if ":" in self.http.host else self.http.host
            out["http"] = f"{self.http.scheme}://{host}:{self.http.port}"
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
