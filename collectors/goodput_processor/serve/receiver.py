"""OTLP trace receivers of ``goodput serve``: gRPC ``TraceService/Export`` and HTTP ``/v1/traces``.

Both feed a :class:`~goodput_processor.serve.store.LiveStore`. Limits and security:

- Message size: requests over ``max_message_bytes`` are refused, by gRPC with
  ``RESOURCE_EXHAUSTED`` and by HTTP with ``413`` (also when a gzip body inflates past it).
- Bearer token (optional): without ``Authorization: Bearer <token>`` a request gets
  ``UNAUTHENTICATED`` (gRPC) or ``401`` (HTTP, with ``WWW-Authenticate: Bearer``).
- Every refused request is counted in the store's ``stats`` (``refused_unauthenticated``,
  ``refused_too_large``, ``refused_malformed``, ``refused_unsupported``,
  ``refused_unavailable``); a wrong or missing token is also logged (a warning, for the
  first 10 and then every 1000th, with the client's address).
- A body that is not an ``ExportTraceServiceRequest`` gets ``INVALID_ARGUMENT`` (gRPC) or
  ``400`` (HTTP), with a message that says why.
- TLS (optional): PEM certificate chain and key files.

HTTP accepts ``application/x-protobuf`` and ``application/json`` (OTLP/JSON: hex ids)
bodies, optionally ``Content-Encoding: gzip``; errors carry a ``google.rpc.Status`` in the
request's encoding, as the OTLP/HTTP specification asks. ``GET /v1/report`` returns the
current report (``goodput report --format json``; ``?job=NAME`` for one job),
``GET /v1/report.html`` the HTML report (``docs/html-report.md``) and ``GET /healthz`` ``ok``.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import ssl
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from .limits import ByteBudget, Limits
from .store import LiveStore

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "GrpcReceiver", "HttpReceiver"]

_log = logging.getLogger(__name__)
#: Default request size limit (bytes, after gzip decompression).
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20


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


class _TraceService:
    """``TraceService/Export`` on raw bytes, so that a body that does not parse gets
    ``INVALID_ARGUMENT`` with the reason (gRPC's own deserializer answers ``INTERNAL``)."""

    def __init__(self, store: LiveStore, token: str | None, gate):
        self.store, self.token, self.gate = store, token, gate

    def Export(self, request: bytes, context):  # noqa: N802 - the gRPC method name
        if not _token_ok(dict(context.invocation_metadata()).get("authorization"), self.token):
            _refused(self.store, "unauthenticated", context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "goodput serve: missing or wrong bearer token (Authorization header)")
        if not self.gate.enter():
            _refused(self.store, "unavailable")
            context.abort(grpc.StatusCode.UNAVAILABLE, "goodput serve is shutting down")
        try:
            req = trace_service_pb2.ExportTraceServiceRequest()
            try:
                req.ParseFromString(request)
            except DecodeError as e:
                _refused(self.store, "malformed")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"goodput serve: request of "
                              f"{len(request)} bytes is not a protobuf ExportTraceServiceRequest "
                              f"({e})")
            self.store.ingest_request(req, "otlp-grpc")
        finally:
            self.gate.leave()
        return trace_service_pb2.ExportTraceServiceResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        export = grpc.unary_unary_rpc_method_handler(
            self.Export, request_deserializer=None,
            response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString)
        return grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": export})


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


class GrpcReceiver:
    """OTLP/gRPC ``TraceService`` on ``host:port`` (port 0 = any free port; see :attr:`port`).

    Raises:
        RuntimeError: the address cannot be bound.
        OSError: a TLS file cannot be read.
    """

    def __init__(self, store: LiveStore, host: str = "127.0.0.1", port: int = 4317, *,
                 token: str | None = None, tls: tuple[str, str] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, workers: int = 8,
                 gate: Gate | None = None, limits: Limits | None = None,
                 budget: ByteBudget | None = None):
        self.gate = gate or Gate()
        opts = [("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", 1 << 20), ("grpc.so_reuseport", 0)]
        self.server = grpc.server(ThreadPoolExecutor(workers, "goodput-serve-grpc"), options=opts)
        self.server.add_generic_rpc_handlers((_TraceService(store, token, self.gate).handler(),))
        addr = _hostport(host, port)
        if tls:
            with open(tls[0], "rb") as c, open(tls[1], "rb") as k:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            self.port = self.server.add_secure_port(addr, creds)
        else:
            self.port = self.server.add_insecure_port(addr)
        if not self.port:
            raise RuntimeError(f"cannot listen for OTLP/gRPC on {addr}")
        self.host = host

    def start(self) -> GrpcReceiver:
        """Start serving; returns ``self``."""
        self.server.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Refuse new RPCs, let those in flight finish for up to ``timeout_s`` seconds."""
        self.gate.close(timeout_s)
        self.server.stop(grace=timeout_s).wait(timeout_s)


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


class _Handler(BaseHTTPRequestHandler):
    server_version = "goodput-serve"
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a client may stall a connection
    # Headers and body go out in two writes: with Nagle's algorithm on, a keep-alive
    # client's delayed ACK held every response with a body (JSON, errors) for ~40 ms.
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        _log.debug("goodput serve http: " + format, *args)

    def _reply(self, status: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, grpc_code: int, kind: str, message: str, close=False) -> None:
        body, ctype = _status_body(kind, grpc_code, f"goodput serve: {message}")
        extra = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
        if close:
            self.close_connection = True
            extra["Connection"] = "close"
        self._reply(status, body, ctype, extra)

    def _authorized(self, kind: str) -> bool:
        if _token_ok(self.headers.get("Authorization"), self.server.app.token):
            return True
        _refused(self.server.app.store, "unauthenticated", self.client_address[0])
        self._error(401, 16, kind, "missing or wrong bearer token (Authorization header)", True)
        return False

    def _refuse(self, reason: str, status: int, grpc_code: int, kind: str, message: str,
                close=False) -> None:
        _refused(self.server.app.store, reason)
        self._error(status, grpc_code, kind, message, close)

    def do_GET(self):  # noqa: N802
        url = urlsplit(self.path)
        if url.path == "/healthz":
            return self._reply(200, b"ok\n", "text/plain")
        if url.path not in ("/v1/report", "/v1/report.html"):
            return self._error(404, 5, "text", f"no such path {url.path!r} (GET /v1/report, "
                               "/v1/report.html)")
        if not self._authorized("json"):
            return
        job = parse_qs(url.query).get("job", [None])[0]
        html = url.path.endswith(".html")
        try:
            if html:  # the HTML report of docs/html-report.md
                from ..html import live_report_html

                body = live_report_html(self.server.app.store, job=job).encode()
            else:
                body = self.server.app.store.report_json(job=job).encode()
        except KeyError as e:
            return self._error(404, 5, "json", e.args[0])
        except ImportError as e:
            return self._error(501, 12, "text", f"the HTML report needs plotly ({e})")
        self._reply(200, body, "text/html; charset=utf-8" if html else "application/json")

    def do_POST(self):  # noqa: N802
        app = self.server.app
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        kind = {"application/x-protobuf": "protobuf", "application/json": "json"}.get(ctype)
        if urlsplit(self.path).path != "/v1/traces":
            return self._error(404, 5, kind or "text", f"no such path {self.path!r} "
                               "(POST /v1/traces)", close=True)
        if not self._authorized(kind or "text"):
            return
        if kind is None:
            return self._refuse("unsupported", 415, 3, "text", f"unsupported Content-Type "
                                f"{ctype!r}: expected application/x-protobuf or application/json",
                                close=True)
        try:
            length = int(self.headers.get("Content-Length", ""))
            if length < 0:
                raise ValueError(length)
        except ValueError:
            return self._refuse("unsupported", 411, 3, kind, "a Content-Length header "
                                "(a number >= 0) is required", close=True)
        limit = app.max_message_bytes
        if length > limit:
            return self._refuse("too_large", 413, 8, kind, f"request of {length} bytes is over "
                                f"the limit of {limit} bytes (--max-message-bytes)", close=True)
        body = self.rfile.read(length)
        if len(body) < length:
            return self._refuse("malformed", 400, 3, kind, f"body ended after {len(body)} of "
                                f"{length} bytes (Content-Length)", close=True)
        enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc == "gzip":
            body, why = _gunzip(body, limit)
            if why:
                reason, status, code, msg = why
                return self._refuse(reason, status, code, kind, f"gzip body {msg}")
        elif enc != "identity":
            return self._refuse("unsupported", 415, 3, kind, f"unsupported Content-Encoding "
                                f"{enc!r} (gzip or none)")
        if not app.gate.enter():
            return self._refuse("unavailable", 503, 14, kind, "shutting down", close=True)
        try:
            if kind == "protobuf":
                req = trace_service_pb2.ExportTraceServiceRequest()
                try:
                    req.ParseFromString(body)
                except DecodeError as e:
                    return self._refuse("malformed", 400, 3, kind, f"body of {len(body)} bytes "
                                        f"is not a protobuf ExportTraceServiceRequest ({e})")
                app.store.ingest_request(req, "otlp-http")
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                return self._reply(200, out, "application/x-protobuf")
            try:
                app.store.ingest_json(json.loads(body), ("otlp-http", self.client_address[0]))
            except (ValueError, RecursionError) as e:
                return self._refuse("malformed", 400, 3, kind, f"body of {len(body)} bytes is "
                                    f"not an OTLP JSON ExportTraceServiceRequest ({e})")
            return self._reply(200, b"{}", "application/json")
        finally:
            app.gate.leave()


def _gunzip(body: bytes, limit: int) -> tuple[bytes, tuple | None]:
    """Inflate a gzip body (one or more members) to at most ``limit`` bytes.

    Returns ``(data, None)``, or ``(b"", (reason, http status, grpc code, why))``.
    """
    out, size = [], 0
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            part = d.decompress(body, limit + 1 - size)
        except zlib.error as e:
            return b"", ("malformed", 400, 3, f"not valid gzip ({e})")
        size += len(part)
        out.append(part)
        if size > limit or d.unconsumed_tail:
            return b"", ("too_large", 413, 8, f"inflates to more than the limit of {limit} "
                         "bytes (--max-message-bytes)")
        if not d.eof:
            return b"", ("malformed", 400, 3, "truncated (the gzip stream does not end)")
        body = d.unused_data
        if not body:
            return b"".join(out), None


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    app: HttpReceiver

    def handle_error(self, request, client_address):
        """A client that went away is not an error of ours; anything else is logged."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            _log.debug("goodput serve http: %s went away", client_address)
        else:
            _log.exception("goodput serve http: request from %s failed", client_address)


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6


class HttpReceiver:
    """OTLP/HTTP ``POST /v1/traces`` and ``GET /v1/report`` on ``host:port`` (0 = any port).

    Raises:
        OSError: the address cannot be bound, or a TLS file cannot be read.
    """

    def __init__(self, store: LiveStore, host: str = "127.0.0.1", port: int = 4318, *,
                 token: str | None = None, tls: tuple[str, str] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, gate: Gate | None = None,
                 limits: Limits | None = None, budget: ByteBudget | None = None,
                 metrics=None):
        self.store, self.token, self.max_message_bytes = store, token, max_message_bytes
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
