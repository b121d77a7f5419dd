"""The default local *metrics spool* of a run: its metrics as OTLP JSON lines beside the
span spool (:class:`SpoolMetricExporter`, one file per process and attempt:
:func:`spool_path`), written by the OpenTelemetry SDK's periodic reader, and the encoding
of the SDK's metrics data as an OTLP ``ExportMetricsServiceRequest``
(:func:`encode_metrics_request`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    MetricExporter,
    MetricExportResult,
    Sum,
)

from goodput.spool import encode_attributes

__all__ = ["SpoolMetricExporter", "encode_metrics_request", "spool_path"]

_log = logging.getLogger("goodput.diagnostics.metrics")


def _number(value) -> dict:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"asInt": str(value)}
    value = float(value)
    if math.isfinite(value):
        return {"asDouble": value}
    return {"asDouble": "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")}


def _double(value) -> float | str:
    value = float(value)
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _point_times(p) -> dict:
    out = {"timeUnixNano": str(p.time_unix_nano)}
    if p.start_time_unix_nano:
        out["startTimeUnixNano"] = str(p.start_time_unix_nano)
    return out


def _encode_metric(metric) -> dict | None:
    out = {"name": metric.name}
    if metric.description:
        out["description"] = metric.description
    if metric.unit:
        out["unit"] = metric.unit
    data = metric.data
    if isinstance(data, Gauge):
        out["gauge"] = {"dataPoints": [
            {"attributes": encode_attributes(p.attributes), **_point_times(p), **_number(p.value)}
            for p in data.data_points]}
    elif isinstance(data, Sum):
        out["sum"] = {
            "dataPoints": [{"attributes": encode_attributes(p.attributes), **_point_times(p),
                            **_number(p.value)} for p in data.data_points],
            "aggregationTemporality": int(data.aggregation_temporality),
            "isMonotonic": bool(data.is_monotonic),
        }
    elif isinstance(data, Histogram):
        points = []
        for p in data.data_points:
            point = {"attributes": encode_attributes(p.attributes), **_point_times(p),
                     "count": str(p.count), "sum": _double(p.sum),
                     "bucketCounts": [str(c) for c in p.bucket_counts],
                     "explicitBounds": [_double(b) for b in p.explicit_bounds]}
            if p.count:
                point["min"], point["max"] = _double(p.min), _double(p.max)
            points.append(point)
        out["histogram"] = {"dataPoints": points,
                            "aggregationTemporality": int(data.aggregation_temporality)}
    else:
        return None
    return out


def encode_metrics_request(metrics_data) -> dict:
    """SDK ``MetricsData`` as an OTLP/JSON ``ExportMetricsServiceRequest`` dict.

    Gauges, sums and explicit-bucket histograms; other kinds (exponential histograms)
    are left out. 64-bit integers are decimal strings, non-finite doubles the strings
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (the protobuf JSON mapping).
    """
    resource_metrics = []
    for rm in metrics_data.resource_metrics:
        scope_metrics = []
        for sm in rm.scope_metrics:
            encoded = [m for m in (_encode_metric(x) for x in sm.metrics) if m is not None]
            if not encoded:
                continue
            scope = {"name": sm.scope.name}
            if sm.scope.version:
                scope["version"] = sm.scope.version
            scope_metrics.append({"scope": scope, "metrics": encoded})
        if scope_metrics:
            resource_metrics.append({
                "resource": {"attributes": encode_attributes(rm.resource.attributes)},
                "scopeMetrics": scope_metrics,
            })
    return {"resourceMetrics": resource_metrics}


def spool_path(run_dir: str, process_index: int, attempt: int) -> str:
    """``<run_dir>/metrics-p<index:05d>-a<attempt:04d>-<pid>.jsonl`` (prefix
    :data:`goodput.schema.METRICS_SPOOL_PREFIX`: span readers skip these files); the pid
    keeps processes that share an index (no rank variable set) in files of their own."""
    from goodput import schema

    name = f"{schema.METRICS_SPOOL_PREFIX}p{process_index:05d}-a{attempt:04d}-{os.getpid()}.jsonl"
    return os.path.join(run_dir, name)


class SpoolMetricExporter(MetricExporter):
    """Appends one OTLP/JSON ``ExportMetricsServiceRequest`` per export to ``path``.

    The format of the OpenTelemetry Collector's ``file`` exporter (readable by its
    ``otlpjsonfile`` receiver). The file is opened lazily (nothing is written for an
    export with no points); I/O errors never raise: the export returns ``FAILURE``,
    :attr:`failures` counts it and the first is logged.

    Args:
        path: the file (str or os.PathLike); its directory is created.
    """

    def __init__(self, path):
        super().__init__()
        self.path = os.fspath(path)
        self.failures = 0
        self.exported = 0
        self._file = None
        self._lock = threading.Lock()
        self._closed = False

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        """Write ``metrics_data`` as one line. Returns SUCCESS or FAILURE (never raises)."""
        with self._lock:
            if self._closed:
                self.failures += 1
                return MetricExportResult.FAILURE
            try:
                request = encode_metrics_request(metrics_data)
                if not request["resourceMetrics"]:
                    return MetricExportResult.SUCCESS
                line = json.dumps(request, separators=(",", ":"), allow_nan=False)
                if self._file is None:
                    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                self.failures += 1
                if self.failures == 1:
                    _log.warning("goodput: cannot write metrics spool %s: %s", self.path, exc)
                return MetricExportResult.FAILURE
            self.exported += 1
            return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Lines are flushed when written; nothing to do."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        """Close the file (fsync first); later exports fail."""
        with self._lock:
            self._closed = True
            if self._file is not None:
                try:
                    self._file.flush()
                    os.fsync(self._file.fileno())
                    self._file.close()
                except (OSError, ValueError):
                    pass
                self._file = None
