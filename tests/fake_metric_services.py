"""Real gRPC servers on loopback standing in for metric backends, recording what they get.

- :class:`FakeOtlpMetrics`: ``opentelemetry.proto.collector.metrics.v1.MetricsService``
  (``Export``), from the generated OTLP servicer.
- :class:`FakeCloudMonitoring`: ``google.monitoring.v3.MetricService``
  (``CreateTimeSeries``, ``CreateMetricDescriptor``), with the real request/response
  message types of ``google-cloud-monitoring``.

Both are context managers; ``address`` is ``127.0.0.1:<port>``; received requests are
appended to ``requests`` (thread-safe) and ``wait_for(pred, timeout_s)`` polls them.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc


class _Fake:
    def __init__(self):
        self.requests: list = []
        self._cv = threading.Condition()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def _record(self, req):
        with self._cv:
            self.requests.append(req)
            self._cv.notify_all()

    def wait_for(self, pred, timeout_s: float = 10.0) -> bool:
        """Wait until ``pred(self.requests)`` is true; returns whether it became true."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not pred(self.requests):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def __enter__(self):
        self._server.start()
        return self

    def __exit__(self, *exc):
        self._server.stop(grace=None).wait(5)


class FakeOtlpMetrics(_Fake):
    """OTLP ``MetricsService/Export``; ``requests`` holds ``ExportMetricsServiceRequest``s."""

    def __init__(self):
        super().__init__()
        from opentelemetry.proto.collector.metrics.v1 import (
            metrics_service_pb2 as pb,
        )
        from opentelemetry.proto.collector.metrics.v1 import (
            metrics_service_pb2_grpc as pb_grpc,
        )

        fake = self

        class Servicer(pb_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802 - gRPC method name
                fake._record(request)
                return pb.ExportMetricsServiceResponse()

        pb_grpc.add_MetricsServiceServicer_to_server(Servicer(), self._server)

    def points(self) -> list[tuple[str, dict, float]]:
        """Every received gauge point: ``(metric name, attributes, value)``."""
        out = []
        for req in list(self.requests):
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.gauge.data_points:
                            attrs = {kv.key: _any(kv.value) for kv in p.attributes}
                            v = p.as_double if p.HasField("as_double") else p.as_int
                            out.append((m.name, attrs, v))
        return out


def _any(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class FakeCloudMonitoring(_Fake):
    """``google.monitoring.v3.MetricService``: CreateTimeSeries and CreateMetricDescriptor.

    ``requests`` holds ``CreateTimeSeriesRequest``s, ``descriptors`` the
    ``CreateMetricDescriptorRequest``s. :meth:`client` builds a ``MetricServiceClient``
    talking to it over an insecure loopback channel (no credentials are looked up).
    """

    def __init__(self):
        super().__init__()
        from google.cloud.monitoring_v3.types import metric_service
        from google.protobuf import empty_pb2

        self.descriptors: list = []
        ms = metric_service

        def create_ts(request, context):
            self._record(request)
            return empty_pb2.Empty()

        def create_md(request, context):
            self.descriptors.append(request)
            return request.metric_descriptor

        handlers = {
            "CreateTimeSeries": grpc.unary_unary_rpc_method_handler(
                create_ts,
                request_deserializer=ms.CreateTimeSeriesRequest.deserialize,
                response_serializer=empty_pb2.Empty.SerializeToString,
            ),
            "CreateMetricDescriptor": grpc.unary_unary_rpc_method_handler(
                create_md,
                request_deserializer=ms.CreateMetricDescriptorRequest.deserialize,
                response_serializer=lambda d: d.SerializeToString(),
            ),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("google.monitoring.v3.MetricService",
                                                  handlers),))

    def client(self):
        """A real ``MetricServiceClient`` whose transport is an insecure loopback channel."""
        from google.cloud.monitoring_v3 import MetricServiceClient
        from google.cloud.monitoring_v3.services.metric_service.transports import (
            MetricServiceGrpcTransport,
        )

        channel = grpc.insecure_channel(self.address)
        return MetricServiceClient(transport=MetricServiceGrpcTransport(channel=channel))

    def resource_series(self) -> list[tuple[str, dict, dict, float]]:
        """Every received point: ``(metric type, metric labels, resource labels, value)``."""
        out = []
        for req in list(self.requests):
            for ts in req.time_series:
                for p in ts.points:
                    v = p.value
                    value = v.double_value if "double_value" in v else v.int64_value
                    out.append((ts.metric.type, dict(ts.metric.labels),
                                dict(ts.resource.labels), value))
        return out

    def series(self) -> list[tuple[str, dict, float]]:
        """Every received point: ``(metric type, metric labels, value)``."""
        out = []
        for req in list(self.requests):
            for ts in req.time_series:
                for p in ts.points:
                    v = p.value
                    value = v.double_value if "double_value" in v else v.int64_value
                    out.append((ts.metric.type, dict(ts.metric.labels), value))
        return out
