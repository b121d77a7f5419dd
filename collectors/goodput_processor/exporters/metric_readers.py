"""Where the goodput metrics go: metric readers for the usual backends.

Each function gives an OpenTelemetry metric reader for a ``MeterProvider`` on which
:class:`~goodput_processor.exporters.metrics.GoodputMetrics` registers its gauges
(``docs/metrics.md``): OTLP (:func:`otlp_reader`), Cloud Monitoring
(:func:`cloud_monitoring_reader`, the ``gcp`` extra) and a Prometheus scrape endpoint
(:func:`prometheus_reader`). Each backend's exporter is imported when its reader is made.
"""

from __future__ import annotations

import math

__all__ = ["cloud_monitoring_reader", "otlp_reader", "prometheus_reader"]


def _interval_ms(interval_s: float) -> float:
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"export interval must be a number of seconds > 0, got {interval_s}")
    return interval_s * 1000.0


def otlp_reader(endpoint: str | None = None, *, interval_s: float = 60.0,
                insecure: bool | None = None, protocol: str = "grpc", **exporter_kw):
    """A periodic reader exporting over OTLP (gRPC, or ``protocol="http/protobuf"``).

    ``endpoint`` None: the ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` / ``..._ENDPOINT``
    variables (default ``localhost:4317`` / ``http://localhost:4318/v1/metrics``).
    Needs the ``otlp`` extra. Raises ValueError for a bad interval or protocol.
    """
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(endpoint=endpoint, insecure=insecure, **exporter_kw)
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HTTPExporter,
        )

        exporter = HTTPExporter(endpoint=endpoint, **exporter_kw)
    else:
        raise ValueError(f"OTLP protocol must be 'grpc' or 'http/protobuf', got {protocol!r}")
    return PeriodicExportingMetricReader(exporter, export_interval_millis=_interval_ms(interval_s))


def cloud_monitoring_reader(project_id: str | None = None, *, interval_s: float = 60.0,
                            client=None, prefix: str = "workload.googleapis.com"):
    """A periodic reader exporting to Google Cloud Monitoring (the ``gcp`` extra).

    Cloud Monitoring accepts one point per time series every 5 s at most: keep
    ``interval_s`` >= 10. ``project_id`` None: from Application Default Credentials.
    ``client``: a ``MetricServiceClient`` (default: the exporter's own). Metric types
    are ``<prefix>/<metric name>``, e.g. ``workload.googleapis.com/goodput.goodput``.
    Raises ValueError for a bad interval.
    """
    import warnings

    from opentelemetry.exporter.cloud_monitoring import CloudMonitoringMetricsExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    ms = _interval_ms(interval_s)
    with warnings.catch_warnings():  # the class is marked deprecated in favour of OTLP
        warnings.simplefilter("ignore", DeprecationWarning)
        exporter = CloudMonitoringMetricsExporter(project_id=project_id, client=client,
                                                  prefix=prefix)
    return PeriodicExportingMetricReader(exporter, export_interval_millis=ms)


def prometheus_reader(port: int | None = 9464, addr: str = "127.0.0.1", registry=None):
    """A Prometheus pull reader, and (when ``port`` is not None) its scrape endpoint.

    Returns ``(reader, server)``: ``server`` is the ``prometheus_client`` HTTP server
    (``server.server_port`` is the port; ``port=0`` picks a free one; call
    ``server.shutdown()`` to stop it) or None. ``registry``: a
    ``prometheus_client.CollectorRegistry`` (default the global one). Metric names
    follow the exporter's rules: ``goodput.badput_time`` (unit s) is scraped as
    ``goodput_badput_time_seconds``, ``goodput.goodput`` (unit 1) as ``goodput_goodput``.
    Raises OSError if the port cannot be bound.
    """
    import prometheus_client
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    registry = registry or prometheus_client.REGISTRY
    reader = PrometheusMetricReader(registry=registry)
    server = None
    if port is not None:
        server, _thread = prometheus_client.start_http_server(port, addr, registry=registry)
    return reader, server
