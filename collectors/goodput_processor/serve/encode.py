"""OTLP JSON lines for the write-ahead log: the requests ``goodput serve`` takes in, split by job.

The write-ahead log (:mod:`.wal`) holds what was acknowledged in the spool's own format,
OTLP JSON lines (``{"resourceSpans": [...]}`` per line, hex ids, int64 as strings), so
that ``goodput report`` reads a job's log directory as it reads a spool and the
Collector's ``otlpjsonfile`` receiver can replay it. A request is split by job (one line
per job it holds), because the log keeps one segment per job.

Spans of other instrumentation scopes are never read by the processor: they are kept as
empty objects (``{}``), three bytes each, so that a replay counts them again
(``skipped.unknown``) and the state after a restart is exactly the state before it.
"""

from __future__ import annotations

import json

from goodput import schema

from ..reader import job_name, json_resource_attrs
from .decode import pb_value

try:  # a dependency; the standard library's json is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["json_job_name", "json_line", "pb_line", "split_json", "split_pb"]


def _pb_job(rs) -> str:
    return job_name({kv.key: pb_value(kv.value) for kv in rs.resource.attributes})


def json_job_name(rs) -> str:
    """The job of one OTLP JSON ``ResourceSpans`` dict, as the reader names it
    (``unknown_job`` if unreadable)."""
    try:
        return job_name(json_resource_attrs(rs))
    except (AttributeError, TypeError):
        return job_name({})


def _pb_any(v):
    which = v.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": v.string_value}
    if which == "int_value":
        return {"intValue": str(v.int_value)}
    if which == "bool_value":
        return {"boolValue": v.bool_value}
    if which == "double_value":
        d = v.double_value
        return {"doubleValue": d if d == d and abs(d) != float("inf") else str(d)}
    if which == "bytes_value":
        import base64

        return {"bytesValue": base64.b64encode(v.bytes_value).decode()}
    if which == "array_value":
        return {"arrayValue": {"values": [_pb_any(x) for x in v.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": _pb_attrs(v.kvlist_value.values)}}
    return {}


def _pb_attrs(kvs) -> list:
    return [{"key": kv.key, "value": _pb_any(kv.value)} for kv in kvs]


def _pb_span(sp) -> dict:
    d = {"traceId": sp.trace_id.hex(), "spanId": sp.span_id.hex(), "name": sp.name,
         "startTimeUnixNano": str(sp.start_time_unix_nano),
         "endTimeUnixNano": str(sp.end_time_unix_nano)}
    if sp.parent_span_id:
        d["parentSpanId"] = sp.parent_span_id.hex()
    if sp.kind:
        d["kind"] = sp.kind
    if sp.attributes:
        d["attributes"] = _pb_attrs(sp.attributes)
    if sp.status.code or sp.status.message:
        d["status"] = {"code": sp.status.code, **({"message": sp.status.message}
                                                  if sp.status.message else {})}
    return d


def _pb_resource_spans(rs) -> dict:
    scopes = []
    for ss in rs.scope_spans:
        scope = {"name": ss.scope.name}
        if ss.scope.version:
            scope["version"] = ss.scope.version
        if ss.scope.name == schema.SCOPE_NAME:
            spans = [_pb_span(sp) for sp in ss.spans]
        else:
            spans = [{}] * len(ss.spans)
        scopes.append({"scope": scope, "spans": spans})
    return {"resource": {"attributes": _pb_attrs(rs.resource.attributes)},
            "scopeSpans": scopes}


def _line(resource_spans: list) -> bytes:
    if _orjson is not None:
        try:
            return _orjson.dumps({"resourceSpans": resource_spans}) + b"\n"
        except TypeError:  # e.g. an integer beyond 64 bits from a JSON request
            pass
    return json.dumps({"resourceSpans": resource_spans}, separators=(",", ":"),
                      ensure_ascii=False).encode() + b"\n"


def split_pb(req) -> dict[str, tuple[list, int]]:
    """Split a protobuf ``ExportTraceServiceRequest`` by job.

    Returns ``{job: (its ResourceSpans messages, spans in them)}`` in first-seen order.
    """
    out: dict[str, tuple[list, int]] = {}
    for rs in req.resource_spans:
        name = _pb_job(rs)
        rss, n = out.get(name, ([], 0))
        rss.append(rs)
        out[name] = (rss, n + sum(len(ss.spans) for ss in rs.scope_spans))
    return out


def pb_line(rss: list) -> bytes:
    """One OTLP JSON line (ending in a newline) holding the ResourceSpans ``rss``."""
    return _line([_pb_resource_spans(rs) for rs in rss])


def split_json(req: dict) -> dict[str, tuple[list, int]]:
    """Split an OTLP JSON request (a dict with ``resourceSpans``) by job, as :func:`split_pb`.

    Raises:
        TypeError, AttributeError: ``resourceSpans`` is not a list of objects.
    """
    out: dict[str, tuple[list, int]] = {}
    for rs in req["resourceSpans"] or ():
        name = json_job_name(rs)
        rss, n = out.get(name, ([], 0))
        rss.append(rs)
        spans = 0
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
            spans += len(ss.get("spans") or ())
        out[name] = (rss, n + spans)
    return out


def json_line(rss: list) -> bytes:
    """One OTLP JSON line holding the JSON ResourceSpans ``rss`` (other scopes' spans as
    ``{}``)."""
    kept = []
    for rs in rss:
        key = "scopeSpans" if "scopeSpans" in rs else "instrumentationLibrarySpans"
        scopes = []
        for ss in rs.get(key) or ():
            scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {})
            if scope.get("name") != schema.SCOPE_NAME and ss.get("spans"):
                ss = {**ss, "spans": [{}] * len(ss["spans"])}
            scopes.append(ss)
        kept.append({**rs, key: scopes})
    return _line(kept)
