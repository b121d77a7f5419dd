"""What the OTLP receivers of ``goodput serve`` share: gRPC ``TraceService/Export`` and
``LogsService/Export`` (:mod:`goodput_processor.serve.grpc_receiver`) and HTTP
``/v1/traces`` and ``/v1/logs`` (:mod:`goodput_processor.serve.http`) both import this
module, never the other way round. Log records, and spans of a foreign producer, are read
through the sources (:mod:`goodput_processor.serve.foreign`).

Both feed a :class:`~goodput_processor.serve.store.LiveStore` under the ceilings of
:class:`~goodput_processor.serve.limits.Limits`:

- Message size: requests over ``max_message_bytes`` are refused, by gRPC with
  ``RESOURCE_EXHAUSTED`` and by HTTP with ``413`` (also when a gzip body inflates past it).
- Calls and connections: at most ``max_connections`` gRPC calls in flight (more get
  ``RESOURCE_EXHAUSTED`` from gRPC itself) and HTTP connections open (more get ``503``).
- Bytes in flight: each request takes its size, plus what it inflates to and an estimate
  of its parsed form (:func:`parse_cost`), from the :class:`~goodput_processor.serve.
  limits.ByteBudget` shared by both receivers, and gives them back when done; a request
  that does not fit is refused with the retryable status (``UNAVAILABLE``, ``503`` +
  ``Retry-After``; ``refused_inflight``).
- Refusals of the store (:class:`~goodput_processor.serve.limits.Refused`: the write-ahead
  log cannot write, too many jobs, a job over its rate): retryable ones get
  ``UNAVAILABLE`` (with a ``RetryInfo`` of ``retry_after_s``) / ``503`` with
  ``Retry-After``, the others ``INVALID_ARGUMENT`` / ``400``. Any other error while taking
  a request in is logged and answered ``INTERNAL`` / ``500``: the receivers never die.
- Bearer token (optional): without ``Authorization: Bearer <token>`` a request gets
  ``UNAUTHENTICATED`` (gRPC) or ``401`` (HTTP, with ``WWW-Authenticate: Bearer``).
- Every refused request is counted in the store's ``stats`` as ``refused_<reason>``
  (``unauthenticated``, ``too_large``, ``malformed``, ``unsupported``, ``unavailable``,
  ``inflight``, ``connections``, ``timeout``, ``internal``, and the store's own reasons);
  a wrong or missing token is also logged (a warning, for the first 10 and then every
  1000th, with the client's address).
- A body that is not an ``ExportTraceServiceRequest`` gets ``INVALID_ARGUMENT`` (gRPC) or
  ``400`` (HTTP), with a message that says why.
- TLS (optional): PEM certificate chain and key files.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from .limits import SMALL_REQUEST_BYTES, ByteBudget, Refused
from .parse_budget import json_cost, protobuf_cost
from .store import LiveStore

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "Gate", "parse_cost"]

_log = logging.getLogger(__name__)
#: Default request size limit (bytes, after gzip decompression).
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20
_GRPC_CODES = {c.value[0]: c for c in grpc.StatusCode}
#: Signal -> (request message, response message, gRPC service, the LiveStore method that
#: takes the request in).
SIGNALS = {
    "traces": (trace_service_pb2.ExportTraceServiceRequest,
               trace_service_pb2.ExportTraceServiceResponse,
               "opentelemetry.proto.collector.trace.v1.TraceService", "ingest_request"),
    "logs": (logs_service_pb2.ExportLogsServiceRequest,
             logs_service_pb2.ExportLogsServiceResponse,
             "opentelemetry.proto.collector.logs.v1.LogsService", "ingest_logs"),
}


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _refused(store: LiveStore, reason: str, peer=None) -> None:
    """Count a refused request; log a wrong/missing token (first 10, then every 1000th)."""
    n = store.count("refused_" + reason)
    if reason == "unauthenticated" and (n <= 10 or n % 1000 == 0):
        _log.warning("goodput serve: refused request without the right bearer token from %s "
                     "(%d so far)", peer, n)


def _token_ok(header: str | None, token: str | None) -> bool:
    if token is None:
        return True
    expected = f"Bearer {token}".encode()
    return header is not None and hmac.compare_digest(header.strip().encode(), expected)


def parse_cost(kind: str, body) -> int:
    """Upper bound on the bytes of memory that taking in ``body`` takes besides the body
    itself: the parse, the rows and the write-ahead log line (CPython 3.11, 64-bit;
    :mod:`~goodput_processor.serve.parse_budget`).

    Args:
        kind: ``"protobuf"`` (an ``ExportTraceServiceRequest``) or ``"json"`` (OTLP/JSON).
        body: the request, uncompressed (bytes-like).

    Returns:
        protobuf: :func:`~goodput_processor.serve.parse_budget.protobuf_cost`, from the
        counts of the bytes a sub-message can start with and of its ResourceSpans and
        ScopeSpans (about 13x the size of real spans; 96x for a request of empty spans,
        which takes 89x).
        JSON: :func:`~goodput_processor.serve.parse_budget.json_cost`, from the body's
        structure (~18x for OTLP/JSON, ~60x for ``[{},{},...]``).
    """
    if kind == "json":
        return json_cost(body)
    return protobuf_cost(body)


class Rejected(Exception):
    """A request answered with an error instead of being taken in (inside the receivers).

    Args:
        reason: counted as ``stats["refused_<reason>"]`` (None: not counted).
        status: the HTTP status.
        grpc_code: the ``google.rpc.Code`` number (the gRPC status code).
        message: one line for the client.
        close: HTTP: close the connection after the answer.
        retry_after: seconds for ``Retry-After`` / ``RetryInfo`` (None: none).
    """

    def __init__(self, reason: str | None, status: int, grpc_code: int, message: str, *,
                 close: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.reason, self.status, self.grpc_code, self.message = reason, status, grpc_code, message
        self.close, self.retry_after = close, retry_after

    @classmethod
    def from_refused(cls, e: Refused) -> Rejected:
        """The store's :class:`Refused`: ``503``/``UNAVAILABLE`` with ``Retry-After`` when
        retryable, else ``400``/``INVALID_ARGUMENT``."""
        if e.retryable:
            return cls(e.reason, 503, 14, e.message, retry_after=max(1, math.ceil(
                e.retry_after_s)))
        return cls(e.reason, 400, 3, e.message)

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return _GRPC_CODES.get(self.grpc_code, grpc.StatusCode.UNKNOWN)


class Held:
    """Bytes of the shared :class:`ByteBudget` one request holds; :meth:`release` gives all
    of them back (not thread-safe: one per request)."""

    def __init__(self, budget: ByteBudget):
        self.budget, self.n = budget, 0

    def take(self, n: int, what: str) -> None:
        """Take ``n`` more bytes for ``what``.

        Raises:
            Rejected: ``413`` / ``RESOURCE_EXHAUSTED`` (``too_large``) when the request
                would need more than the whole budget (it can never fit), else ``503`` /
                ``UNAVAILABLE`` (``inflight``, retry after 1 s) when it does not fit now.
        """
        if n <= 0:
            return
        cap = self.budget.capacity
        if self.n + n > cap:
            raise Rejected("too_large", 413, 8, f"{what} needs {self.n + n} bytes of memory, "
                           f"more than the limit of {cap} bytes in flight "
                           "(--max-inflight-bytes)", close=True)
        if not self.budget.acquire(n, small=self.n + n <= SMALL_REQUEST_BYTES, own=self.n):
            raise Rejected("inflight", 503, 14, f"too many bytes in flight: {what} needs {n} "
                           f"bytes, of {cap} (--max-inflight-bytes); retry later",
                           retry_after=1)
        self.n += n

    def give_back(self, n: int) -> None:
        """Give back ``n`` of the bytes held (at most all of them)."""
        n = min(n, self.n)
        if n > 0:
            self.budget.release(n)
            self.n -= n

    def release(self) -> None:
        """Give back everything held."""
        self.give_back(self.n)


def _retry_info(seconds: float) -> tuple:
    """Trailing metadata asking the client to retry after ``seconds`` (``RetryInfo``, which
    the OTLP/gRPC exporter follows)."""
    try:
        from google.rpc import error_details_pb2
    except ImportError:  # pragma: no cover - googleapis-common-protos comes with grpcio
        return ()
    info = error_details_pb2.RetryInfo()
    info.retry_delay.seconds = max(1, math.ceil(seconds))
    return (("google.rpc.retryinfo-bin", info.SerializeToString()),)


class Gate:
    """Counts requests in flight and refuses new ones once closed (for draining)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._open, self._inflight = True, 0

    def enter(self) -> bool:
        """Admit one request; False once :meth:`close` was called."""
        with self._cond:
            if not self._open:
                return False
            self._inflight += 1
            return True

    def leave(self) -> None:
        """One admitted request is done."""
        with self._cond:
            self._inflight -= 1
            self._cond.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Refuse new requests; wait up to ``timeout_s`` for those in flight. True if drained."""
        with self._cond:
            self._open = False
            return self._cond.wait_for(lambda: self._inflight == 0, timeout_s)


def _status_body(kind: str, code: int, message: str) -> tuple[bytes, str]:
    """A ``google.rpc.Status`` body in the request's encoding (protobuf/JSON), else text."""
    if kind == "json":
        return json.dumps({"code": code, "message": message}).encode(), "application/json"
    if kind == "protobuf":
        try:
            from google.rpc import status_pb2

            return (status_pb2.Status(code=code, message=message).SerializeToString(),
                    "application/x-protobuf")
        except ImportError:  # pragma: no cover - googleapis-common-protos comes with grpcio
            pass
    return (message + "\n").encode(), "text/plain; charset=utf-8"

