"""OTLP/HTTP receiver of ``goodput serve``: ``POST /v1/traces``, ``POST /v1/logs`` and the
operations endpoints.

One thread per connection, at most ``limits.max_connections`` of them: a connection over
the cap is answered ``503`` (``Retry-After: 1``, ``Connection: close``) by the accepting
thread itself, without waiting on the client, and closed. Each request must arrive whole
(request line, headers and body) within ``limits.request_timeout_s`` seconds of its first
byte, and an idle keep-alive connection is closed after as long: a client that trickles
or stalls is dropped (counted as ``refused_timeout``).

Memory: before a body of ``Content-Length`` L is read, L bytes are taken from the
:class:`~goodput_processor.serve.limits.ByteBudget` shared with the gRPC receiver, then,
as a gzip body inflates, what it inflates to, then an estimate of its parsed form
(:func:`parse_cost`). Whatever does not fit is refused ``503`` with ``Retry-After``
(``refused_inflight``) without reading more; a body that could never fit (over
``max_message_bytes``, or an estimate over the whole budget) gets ``413``. The budget is
given back when the request is done.

Endpoints (errors carry a ``google.rpc.Status`` in the request's encoding):

- ``POST /v1/traces``: ``application/x-protobuf`` or ``application/json`` (OTLP/JSON, hex
  ids), optionally ``Content-Encoding: gzip``. 200 when taken in; 400 (not an
  ``ExportTraceServiceRequest``, or refused for good by the store), 401 (token), 404, 411
  (no ``Content-Length``), 413, 415 (content type or encoding), 500 (an unexpected error,
  logged), 503 + ``Retry-After`` (shutting down, over a ceiling, or the store refused it
  for now: :class:`~goodput_processor.serve.limits.Refused`).
- ``POST /v1/logs``: the same, for an ``ExportLogsServiceRequest``, read through the
  sources (:mod:`goodput_processor.serve.foreign`); records no source takes are counted
  (``log_records_ignored``) and the request is answered 200.
- ``GET /v1/report``: the JSON of ``goodput report --format json``, one page of jobs
  sorted by name (``?limit=N``, default 100, at most 1000; ``?page_token=NAME`` starts
  after job NAME) with a top-level ``"next_page_token"`` (null on the last page);
  ``?job=NAME`` for one job; a top-level ``"sources"`` once a foreign producer's records
  were seen (``LiveStore.sources_summary``). ``GET /v1/report.html``: the HTML report.
  Token required.
- ``GET /metrics``: the Prometheus text exposition (token required when one is set; 404
  when the server has no metrics).
- ``GET /healthz``: ``ok`` while the process serves; ``GET /readyz``: ``ready``, or ``503``
  with the reason (``LiveStore.ready()``). No token. Here they share the connection cap
  with ingest; :mod:`~goodput_processor.serve.health` answers them on a port of their own
  (``--health-port``), which ingest connections cannot starve.
"""

from __future__ import annotations

import io
import logging
import math
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .http_ingest import _READ_STEP, IngestEndpoints
from .http_reports import ReportEndpoints
from .limits import ByteBudget, Limits
from .receiver import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Gate,
    Rejected,
    _refused,
    _status_body,
    _token_ok,
)
from .store import LiveStore

__all__ = ["HttpReceiver"]

_log = logging.getLogger("goodput_processor.serve.receiver")
#: Seconds spent, at most, reading and discarding the rest of a refused body, so that the
#: client (still sending it) gets to read the answer instead of a connection reset.
_LINGER_S = 2.0
#: ``socket.MSG_TRUNC`` where the kernel drops TCP data with it uncopied (Linux), else 0.
_MSG_TRUNC = getattr(socket, "MSG_TRUNC", 0) if sys.platform.startswith("linux") else 0
#: Where bytes dropped with ``MSG_TRUNC`` would go: never written (so shared by threads).
_SINK = memoryview(bytearray(1 << 20))


class _DeadlineReader(io.RawIOBase):
    """The connection's raw reads, each given only the time left to its request.

    The handler's ``_deadline`` (monotonic seconds) is None while the connection waits for
    a request (then each read may wait ``request_timeout_s``); the first bytes of a request
    set it to ``request_timeout_s`` later. A read past it raises :class:`TimeoutError`
    and marks the handler ``_timed_out``.
    """

    def __init__(self, raw, sock, handler: _Handler):
        super().__init__()
        self._raw, self._sock, self._h = raw, sock, handler

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        h, limit = self._h, self._h.server.app.limits.request_timeout_s
        left = limit if h._deadline is None else h._deadline - time.monotonic()
        if left <= 0:
            h._timed_out = True
            raise TimeoutError(f"request not complete within {limit:g} s")
        self._sock.settimeout(left)
        try:
            n = self._raw.readinto(b)
        except TimeoutError:
            h._timed_out = True
            raise
        if n and h._deadline is None:
            h._deadline = time.monotonic() + limit
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Handler(IngestEndpoints, ReportEndpoints, BaseHTTPRequestHandler):
    """One connection: its deadlines and answers (here), ``POST`` (:class:`~goodput_processor.
    serve.http_ingest.IngestEndpoints`) and ``GET`` (:class:`~goodput_processor.serve.
    http_reports.ReportEndpoints`)."""

    server_version = "goodput-serve"
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm on, a keep-alive
    # client's delayed ACK held every response with a body (JSON, errors) for ~40 ms.
    disable_nagle_algorithm = True
    server: _HttpServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        _log.debug("goodput serve http: " + format, *args)

    # --- connection: deadlines --------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(
            _DeadlineReader(self.rfile.detach(), self.connection, self))
        self._deadline: float | None = None
        self._timed_out, self._requests = False, 0

    def handle_one_request(self) -> None:
        self._deadline, self._timed_out, self._expect_continue = None, False, False
        super().handle_one_request()  # catches TimeoutError and closes
        if self._timed_out:
            self.close_connection = True
            # a request begun, or a connection that never sent one; not an idle keep-alive
            if self._deadline is not None or self._requests == 0:
                _refused(self.server.app.store, "timeout")
                _log.debug("goodput serve http: %s dropped after %g s (request timeout)",
                           self.client_address[0], self.server.app.limits.request_timeout_s)
        self._requests += 1

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue``: say continue only once the body has its budget."""
        self._expect_continue = True
        return True

    # --- answers -------------------------------------------------------------------

    def _reply(self, status: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
        self.connection.settimeout(self.server.app.limits.request_timeout_s)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, grpc_code: int, kind: str, message: str, close=False,
               retry_after: float | None = None) -> None:
        body, ctype = _status_body(kind, grpc_code, f"goodput serve: {message}")
        extra = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
        if retry_after is not None:
            extra["Retry-After"] = str(max(1, math.ceil(retry_after)))
        if close:
            self.close_connection = True
            extra["Connection"] = "close"
        self._reply(status, body, ctype, extra)

    def _reject(self, r: Rejected, kind: str, unread: int = 0) -> None:
        """Count and answer ``r``; then discard up to ``unread`` bytes of body still coming
        (so that a client still sending reads the answer, not a connection reset). A small
        body (at most ``_READ_STEP`` bytes, not held back for ``Expect: 100-continue``) of a
        request that may keep its connection is discarded first, and the connection kept:
        an exporter refused ``503`` for the byte budget keeps its place under the connection
        cap for its retry."""
        if r.reason is not None:
            _refused(self.server.app.store, r.reason,
                     self.client_address[0] if r.reason == "unauthenticated" else None)
        if (0 < unread <= _READ_STEP and not r.close and not self._expect_continue
                and self._discard(unread)):
            unread = 0
        self._error(r.status, r.grpc_code, kind, r.message, r.close or unread > 0,
                    r.retry_after)
        if unread > 0:
            self._discard(unread)

    def _discard(self, n: int) -> bool:
        """Read and drop up to ``n`` bytes for at most ``_LINGER_S`` seconds (no memory);
        whether all ``n`` were.

        What the connection's reader holds goes first; the rest is dropped by the kernel
        (``MSG_TRUNC``: a TCP socket on Linux drops it without copying it out), so that a
        refused body costs serve no copy (issue 38: 15 MiB bodies refused for the byte
        budget, read and dropped, took a sixth of serve's CPU under the abuse mix)."""
        end = time.monotonic() + _LINGER_S
        self._deadline = end if self._deadline is None else min(self._deadline, end)
        try:
            if n > 0:  # (what the reader holds, or one read of the socket)
                n -= len(self.rfile.read1(min(n, _READ_STEP)))
            sock = self.connection
            if _MSG_TRUNC and not isinstance(sock, ssl.SSLSocket):
                while n > 0 and (left := end - time.monotonic()) > 0:
                    sock.settimeout(left)
                    k = sock.recv_into(_SINK, min(n, len(_SINK)), _MSG_TRUNC)
                    if not k:
                        break
                    n -= k
            while n > 0:
                chunk = self.rfile.read1(min(n, _READ_STEP))
                if not chunk:
                    break
                n -= len(chunk)
        except (OSError, ValueError):  # TimeoutError included: the connection is closed
            pass  # anyway (ValueError: a socket that takes no flags)
        self._timed_out = False  # lingering is ours, not the client's fault
        return n <= 0

    def _check_token(self) -> None:
        """Raises :class:`Rejected` (401) without the right bearer token."""
        if not _token_ok(self.headers.get("Authorization"), self.server.app.token):
            raise Rejected("unauthenticated", 401, 16, "missing or wrong bearer token "
                           "(Authorization header)", close=True)


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s")


class _HttpServer(ThreadingHTTPServer):
    """A thread per connection, ``app.limits.max_connections`` at most."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # listen backlog: a burst of connects is not dropped
    app: HttpReceiver

    def verify_request(self, request, client_address) -> bool:
        """Take a connection slot, or answer ``503`` at once (never waiting on the client)."""
        if self.app.slots.acquire(blocking=False):
            return True
        n = self.app.limits.max_connections
        _refused(self.app.store, "connections")
        if not isinstance(request, ssl.SSLSocket):  # TLS: no handshake here; just closed
            msg = f"goodput serve: too many connections (--max-connections {n})\n".encode()
            try:
                request.settimeout(0)
                request.send(_BUSY % (len(msg), msg))
                while request.recv(_READ_STEP):  # what the client sent, so close() is a FIN
                    pass
            except OSError:
                pass
        return False

    def process_request(self, request, client_address) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.app.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.app.slots.release()

    def handle_error(self, request, client_address):
        """A client that went away is not an error of ours; anything else is logged."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError,
                                          TimeoutError)):
            _log.debug("goodput serve http: %s went away", client_address)
        else:
            _log.exception("goodput serve http: request from %s failed", client_address)


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6


class HttpReceiver:
    """OTLP/HTTP ``POST /v1/traces``, ``GET /v1/report`` and the operations endpoints on
    ``host:port`` (0 = any port; see :attr:`port`). See the module docstring.

    Args:
        store: where spans go.
        token: bearer token required for ``/v1/traces``, ``/v1/report`` and ``/metrics``.
        tls: ``(cert_file, key_file)`` PEM paths.
        max_message_bytes: largest request, after gzip (used when ``limits`` is None;
            else ``limits.max_message_bytes``).
        gate: shared with the gRPC receiver, for draining at shutdown.
        limits: the ceilings (default :class:`Limits` with ``max_message_bytes``).
        budget: bytes in flight, shared with the gRPC receiver (default: its own, of
            ``limits.max_inflight_bytes``).
        metrics: ``() -> (body bytes, content type)`` or None, served at ``/metrics``.

    Raises:
        OSError: the address cannot be bound, or a TLS file cannot be read.
    """

    def __init__(self, store: LiveStore, host: str = "127.0.0.1", port: int = 4318, *,
                 token: str | None = None, tls: tuple[str, str] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, gate: Gate | None = None,
                 limits: Limits | None = None, budget: ByteBudget | None = None,
                 metrics=None):
        self.store, self.token, self.metrics = store, token, metrics
        self.limits = limits or Limits(max_message_bytes=max_message_bytes)
        self.max_message_bytes = self.limits.max_message_bytes
        self.budget = budget or ByteBudget(self.limits.max_inflight_bytes)
        self.slots = threading.BoundedSemaphore(self.limits.max_connections)
        self.gate = gate or Gate()
        self.httpd = (_HttpServer6 if ":" in host else _HttpServer)((host, port), _Handler)
        self.httpd.app = self
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls[0], tls[1])
            # handshake on the handler thread, not in accept()
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True,
                                                do_handshake_on_connect=False)
        self.host, self.port = host, self.httpd.server_address[1]
        self.scheme = "https" if tls else "http"
        self._thread: threading.Thread | None = None

    def start(self) -> HttpReceiver:
        """Serve on a daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={
            "poll_interval": 0.1}, name="goodput-serve-http", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Stop accepting, wait up to ``timeout_s`` for requests in flight, close the socket."""
        self.httpd.shutdown()
        self.gate.close(timeout_s)
        self.httpd.server_close()
