"""Loopback stand-ins for the services spans are exported to; each records what it receives.

- :class:`FakeCloudTrace`: ``google.devtools.cloudtrace.v2.TraceService`` over gRPC
  (``BatchWriteSpans``), built from the ``google-cloud-trace`` package's messages.
- :class:`FakeOtlpGrpc`: OTLP ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.
- :class:`FakeOtlpHttp`: OTLP/HTTP ``POST /v1/traces`` with a protobuf body.

They are real servers on 127.0.0.1 (port chosen by the OS); the exporters under test talk
to them over real sockets. :func:`otlp_json_lines` writes received OTLP requests in the
spool's format (OTLP JSON lines) so ``goodput report`` can read them.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import empty_pb2, json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class _Recorder:
    def __init__(self):
        self.requests: list = []
        self._cond = threading.Condition()

    def _add(self, item) -> None:
        with self._cond:
            self.requests.append(item)
            self._cond.notify_all()

    def wait_for(self, predicate, timeout_s: float = 20.0) -> bool:
        """Wait until ``predicate(self)`` is true; returns whether it became true."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


class FakeCloudTrace(_Recorder):
    """Cloud Trace API v2 on loopback; ``requests`` holds ``BatchWriteSpansRequest`` objects."""

    SERVICE = "google.devtools.cloudtrace.v2.TraceService"

    def __init__(self):
        super().__init__()
        from google.cloud.trace_v2.types import BatchWriteSpansRequest, Span

        def batch_write(request, context):
            self._add(request)
            return empty_pb2.Empty()

        def create_span(request, context):
            self._add(request)
            return request

        handlers = {
            "BatchWriteSpans": grpc.unary_unary_rpc_method_handler(
                batch_write, request_deserializer=BatchWriteSpansRequest.deserialize,
                response_serializer=empty_pb2.Empty.SerializeToString),
            "CreateSpan": grpc.unary_unary_rpc_method_handler(
                create_span, request_deserializer=Span.deserialize,
                response_serializer=Span.serialize),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(self.SERVICE, handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def client(self):
        """A real ``TraceServiceClient`` whose transport is an insecure channel to this fake."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.trace_v2 import TraceServiceClient
        from google.cloud.trace_v2.services.trace_service.transports import (
            TraceServiceGrpcTransport,
        )

        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        transport = TraceServiceGrpcTransport(channel=channel, credentials=AnonymousCredentials())
        return TraceServiceClient(transport=transport)

    @property
    def spans(self) -> list:
        """Every received ``google.cloud.trace_v2.types.Span``."""
        return [s for r in self.requests for s in getattr(r, "spans", [r])]

    def stop(self) -> None:
        self.server.stop(0)


class _OtlpServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: FakeOtlpGrpc):
        self.sink = sink

    def Export(self, request, context):  # noqa: N802 - the generated gRPC method name
        self.sink._add(request)
        self.sink.metadata.append(dict(context.invocation_metadata()))
        return trace_service_pb2.ExportTraceServiceResponse()


class FakeOtlpGrpc(_Recorder):
    """An OTLP/gRPC trace receiver; ``requests`` holds ``ExportTraceServiceRequest``."""

    def __init__(self):
        super().__init__()
        self.metadata: list[dict] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_OtlpServicer(self),
                                                                  self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(0)


class FakeOtlpHttp(_Recorder):
    """An OTLP/HTTP trace receiver; ``requests`` holds ``(path, headers, request)``."""

    def __init__(self):
        super().__init__()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's method name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                sink._add((self.path, {k.lower(): v for k, v in self.headers.items()}, req))
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def otlp_spans(requests) -> list[dict]:
    """Flatten OTLP ``ExportTraceServiceRequest`` messages into dicts, one per span:
    ``name``, ``trace_id``/``span_id``/``parent`` (hex, parent ``""`` for a root),
    ``start``/``end`` (ns), ``attrs`` and ``res`` (Python values), ``links`` (hex pairs)."""
    out = []
    for req in requests:
        for rs in req.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    out.append({
                        "name": sp.name, "trace_id": sp.trace_id.hex(),
                        "span_id": sp.span_id.hex(), "parent": sp.parent_span_id.hex(),
                        "start": sp.start_time_unix_nano, "end": sp.end_time_unix_nano,
                        "attrs": {a.key: _value(a.value) for a in sp.attributes},
                        "res": res, "scope": ss.scope.name,
                        "links": [(ln.trace_id.hex(), ln.span_id.hex()) for ln in sp.links],
                    })
    return out


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def otlp_json_lines(requests, path) -> None:
    """Write OTLP requests as OTLP JSON lines (hex ids, int64 as strings, enums as ints)."""
    with open(path, "w", encoding="utf-8") as f:
        for req in requests:
            d = json_format.MessageToDict(req, use_integers_for_enums=True)
            for rs in d.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        for key in ("traceId", "spanId", "parentSpanId"):
                            if key in sp:
                                sp[key] = base64.b64decode(sp[key]).hex()
                        for link in sp.get("links", []):
                            for key in ("traceId", "spanId"):
                                link[key] = base64.b64decode(link[key]).hex()
            f.write(json.dumps(d, separators=(",", ":")) + "\n")
