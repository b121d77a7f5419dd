"""The spool's lines back to SDK spans, for the exporters that are not the spool.

The recorder writes OTLP/JSON text (:mod:`goodput.encode`); an exporter other than the spool
(:mod:`goodput.forward`) takes SDK ``ReadableSpan`` objects, decoded from those lines by
:func:`decode_line`: ids from hex, 64-bit integers from decimal strings, the resource and
scope of each ``resourceSpans``/``scopeSpans`` entry on each of its spans.
"""

from __future__ import annotations

import json

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _value(v: dict):
    if "stringValue" in v:
        return v["stringValue"]
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "arrayValue" in v:
        return tuple(_value(x) for x in v["arrayValue"].get("values", []))
    return None


def _attrs(items) -> dict:
    out = {}
    for kv in items or ():
        value = _value(kv.get("value", {}))
        if value is not None:
            out[kv["key"]] = value
    return out


def _ctx(trace_hex: str, span_hex: str) -> SpanContext:
    return SpanContext(int(trace_hex, 16), int(span_hex, 16), is_remote=False,
                       trace_flags=_SAMPLED)


def decode_line(line: bytes | str) -> list[ReadableSpan]:
    """The spans of one spool line (an OTLP/JSON ``ExportTraceServiceRequest``).

    Raises:
        ValueError: the line is not JSON or not in that shape (the message says why).
    """
    try:
        request = json.loads(line)
        spans = []
        for rs in request.get("resourceSpans", []):
            resource = Resource(_attrs(rs.get("resource", {}).get("attributes")))
            for ss in rs.get("scopeSpans", []):
                sc = ss.get("scope", {})
                scope = InstrumentationScope(sc.get("name", ""), sc.get("version") or None)
                for sp in ss.get("spans", []):
                    parent = sp.get("parentSpanId")
                    status = sp.get("status") or {}
                    code = int(status.get("code", 0))
                    spans.append(ReadableSpan(
                        name=sp["name"],
                        context=_ctx(sp["traceId"], sp["spanId"]),
                        parent=_ctx(sp["traceId"], parent) if parent else None,
                        resource=resource,
                        attributes=_attrs(sp.get("attributes")),
                        events=[Event(e.get("name", ""), _attrs(e.get("attributes")),
                                      int(e["timeUnixNano"])) for e in sp.get("events", [])],
                        links=[Link(_ctx(ln["traceId"], ln["spanId"]), _attrs(ln.get("attributes")))
                               for ln in sp.get("links", [])],
                        kind=SpanKind(max(int(sp.get("kind", 1)) - 1, 0)),
                        status=Status(StatusCode(code), status.get("message") if code == 2
                                      else None),
                        start_time=int(sp["startTimeUnixNano"]),
                        end_time=int(sp["endTimeUnixNano"]),
                        instrumentation_scope=scope,
                    ))
        return spans
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"not an OTLP JSON line: {type(exc).__name__}: {exc}") from exc
