"""OTLP JSON lines of SDK spans: the attribute encoding, and a file exporter.

The spool format: one OTLP ``ExportTraceServiceRequest`` per line in the OTLP/JSON
encoding (the format of the OpenTelemetry Collector's ``file`` exporter, readable by its
``otlpjsonfile`` receiver): ``traceId``/``spanId`` as lowercase hex, 64-bit integers as
decimal strings, enums as integers. Only the standard library is used, so the training
side needs no protobuf.

The recorder no longer builds SDK spans: it encodes its records straight to this format
(:mod:`goodput.encode`) and writes its spool with :mod:`goodput.segments`.
:class:`SpoolSpanExporter` remains an SDK ``SpanExporter`` that writes SDK spans as such
lines (one line per export call), for a tracer of one's own; :func:`encode_value` and
:func:`encode_attributes` are the attribute encoding both use.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_log = logging.getLogger(__name__)


def encode_value(value) -> dict:
    """One attribute value as an OTLP/JSON ``AnyValue`` dict (bool before int: bool is an int)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [encode_value(v) for v in value]}}
    return {"stringValue": str(value)}


def encode_attributes(attributes) -> list[dict]:
    """A mapping of attributes as an OTLP/JSON ``KeyValue`` list."""
    if not attributes:
        return []
    return [{"key": k, "value": encode_value(v)} for k, v in attributes.items()]


def encode_span(span: ReadableSpan) -> dict:
    """One SDK span as an OTLP/JSON ``Span`` dict."""
    ctx = span.context
    out = {
        "traceId": format(ctx.trace_id, "032x"),
        "spanId": format(ctx.span_id, "016x"),
        "name": span.name,
        "kind": span.kind.value + 1,  # SDK INTERNAL=0; OTLP SPAN_KIND_INTERNAL=1
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
    }
    if span.parent is not None:
        out["parentSpanId"] = format(span.parent.span_id, "016x")
    attrs = encode_attributes(span.attributes)
    if attrs:
        out["attributes"] = attrs
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(e.timestamp),
                "name": e.name,
                "attributes": encode_attributes(e.attributes),
            }
            for e in span.events
        ]
    if span.links:
        out["links"] = [
            {
                "traceId": format(link.context.trace_id, "032x"),
                "spanId": format(link.context.span_id, "016x"),
                "attributes": encode_attributes(link.attributes),
            }
            for link in span.links
        ]
    code = span.status.status_code.value
    out["status"] = {"code": code, "message": span.status.description} if code else {}
    return out


def encode_request(spans: Sequence[ReadableSpan]) -> dict:
    """Spans grouped by resource and scope as an OTLP/JSON ``ExportTraceServiceRequest``."""
    by_resource: dict[int, tuple] = {}
    for span in spans:
        res = span.resource
        entry = by_resource.setdefault(id(res), (res, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        entry[1].setdefault(key, []).append(encode_span(span))
    resource_spans = []
    for res, scopes in by_resource.values():
        scope_spans = []
        for (name, version), encoded in scopes.items():
            scope = {"name": name}
            if version:
                scope["version"] = version
            scope_spans.append({"scope": scope, "spans": encoded})
        resource_spans.append(
            {
                "resource": {"attributes": encode_attributes(res.attributes)},
                "scopeSpans": scope_spans,
            }
        )
    return {"resourceSpans": resource_spans}


class SpoolSpanExporter(SpanExporter):
    """Appends spans to ``path`` as OTLP JSON lines, one line per export call.

    The file is opened lazily in append mode and its directory created. Each
    export is written and flushed to the OS at once, so a process killed with
    SIGKILL loses nothing that was exported; :meth:`sync` also asks the OS to
    write it to disk (``fsync``). I/O errors never raise: the export returns
    ``FAILURE``, :attr:`failures` counts it, and the first one is logged. A write
    cut short (disk full) may leave part of a line; the next write starts on a new
    line, so only that line is torn and the ones after it stay readable.

    Args:
        path: file to append to (str or os.PathLike).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.failures = 0
        self.exported = 0
        self._file = None
        self._lock = threading.Lock()
        self._closed = False
        self._torn = False  # a write failed part-way: start the next one on a new line

    def _open(self):
        if self._file is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115
        return self._file

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write ``spans`` as one line. Returns ``SUCCESS`` or ``FAILURE`` (never raises)."""
        if not spans:
            return SpanExportResult.SUCCESS
        with self._lock:
            if self._closed:
                self.failures += 1
                return SpanExportResult.FAILURE
            try:
                line = json.dumps(encode_request(spans), separators=(",", ":")) + "\n"
                data = memoryview(("\n" + line if self._torn else line).encode("utf-8"))
                f = self._open()
                while data:  # unbuffered: what write() did not take was not written
                    data = data[f.write(data) :]
                self._torn = False
            except (OSError, ValueError, TypeError) as exc:
                if self._file is not None and isinstance(exc, OSError):
                    self._torn = True
                self.failures += 1
                if self.failures == 1:
                    _log.warning("goodput: cannot write spool file %s: %s", self.path, exc)
                return SpanExportResult.FAILURE
            self.exported += len(spans)
            return SpanExportResult.SUCCESS

    def sync(self) -> None:
        """Flush and ``fsync`` the file, so the spans survive a machine crash."""
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            except (OSError, ValueError) as exc:
                self.failures += 1
                _log.debug("goodput: fsync of %s failed: %s", self.path, exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Everything is written at export time; this only syncs to disk."""
        self.sync()
        return True

    def shutdown(self) -> None:
        """Sync and close the file; later exports fail."""
        self.sync()
        with self._lock:
            self._closed = True
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
