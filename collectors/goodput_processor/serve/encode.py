"""OTLP JSON lines for the write-ahead log: the requests ``goodput serve`` takes in, split by job.

The write-ahead log (:mod:`.wal`) holds what was acknowledged in the spool's own format,
OTLP JSON lines (``{"resourceSpans": [...]}`` per line, hex ids, int64 as strings), so
that ``goodput report`` reads a job's log directory as it reads a spool and the
Collector's ``otlpjsonfile`` receiver can replay it. A request is split by job (one line
per job it holds), because the log keeps one segment per job.

**The log holds what the accounting reads, cut to the limits** (issue 38), so that its
size follows what is kept, not what a client sent, and a replay gives exactly the state
before it (``tests/serve/test_serve_wal.py``, ``tests/serve/test_serve_parse_budget.py``):

- A ``ResourceSpans`` with no span is not taken in at all (:func:`split_pb`,
  :func:`split_json`): it touches no job and costs nothing in the log.
- Resource attributes: scalar values (an array, a map or bytes is written as an empty
  ``AnyValue``: the reader reads them as nothing); a string longer than
  ``max_string`` (``--max-attribute-bytes``) is cut to ``max_string + 1`` characters, so
  that the replay cuts it to ``max_string`` and counts it ``over_limit`` again, exactly as
  the request did.
- Spans of this project's scope: name, ids (and a parent id), kind, times, the attributes
  the span's kind reads (values canonical: an int as ``intValue``, a string cut as above,
  a flag as its first 8 lower-case characters; an int or a flag once) and an error status,
  in the recorder's order. A span the reader finds invalid is written as its name
  and its ids (invalid again on replay), a span of no kind as ``{}`` in a scope of no name
  (counted ``unknown`` again), a structure span as its ids and name. Events, links, status
  messages and other attributes are not read and not kept.
- Spans of other instrumentation scopes are never read by the processor: they are kept
  as empty objects (``{}``), three bytes each, so that a replay counts them again
  (``skipped.unknown``).

A line is built a chunk of spans at a time (:data:`_CHUNK` span objects live at once), so
encoding a request takes about twice its line in memory, not a Python object per field.
"""

from __future__ import annotations

import json
import math

from goodput import schema

from ..read.reader import job_name, json_resource_attrs
from ..read.spans import _KIND_ATTRS, _KIND_CODES, STRUCTURE, _as_int, _attr_value
from .decode import pb_value

try:  # a dependency; the standard library's json is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["json_job_name", "json_line", "pb_line", "split_json", "split_pb"]

_I64_MAX = (1 << 63) - 1
#: Spans encoded at once while a line is built.
_CHUNK = 1024
_UNKNOWN = b""  # a span of no kind: counted ``unknown`` on replay (see _scope_parts)
_OWN = schema.SCOPE_NAME


def _dumps(obj) -> bytes:
    if _orjson is not None:
        try:
            return _orjson.dumps(obj)
        except TypeError:  # e.g. an integer beyond 64 bits, a lone surrogate
            pass
    return json.dumps(obj, separators=(",", ":")).encode()


def _cut(s: str, max_string: int | None) -> str:
    """``s``, or its first ``max_string + 1`` characters: the reader cuts it again and
    counts it over the limit, as it did when the request came in."""
    return s if max_string is None or len(s) <= max_string else s[: max_string + 1]


def _kept_key(key: str, max_string: int | None) -> bool:
    """A resource attribute key the reader may read (the keys it reads are short: one
    longer than ``max_string`` is never one of them, and is not kept)."""
    return max_string is None or len(key) <= max_string


def _canon(v, max_string: int | None) -> dict:
    """A canonical OTLP JSON ``AnyValue`` of the Python value ``v`` (as
    :func:`~goodput_processor.read.spans._attr_value` gives it back)."""
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v if math.isfinite(v) else str(v)}
    return {"stringValue": _cut(str(v), max_string)}


def _wanted(slot: int, value, max_string: int | None, pb: bool) -> dict:
    """The canonical value of a span attribute the reader reads in ``slot`` (see
    ``read_spans._KIND_ATTRS``): ``value`` is the Python value (``pb``) or the JSON
    ``AnyValue``, read the way the decoder of that encoding reads it.

    Raises:
        TypeError, ValueError, AttributeError, OverflowError: the reader finds the span
            invalid.
    """
    if slot < 2:
        if pb:
            return {"intValue": str(_as_int(value))}
        x = value.get("intValue")
        return {"intValue": str(_as_int(_attr_value(value)) if x is None else int(x))}
    text = str(value if pb else _attr_value(value))
    if slot == 2:
        return {"stringValue": _cut(text, max_string)}
    return {"stringValue": text.lower()[:8]}


#: Per flag slot, the values that set its bit (``read_spans.flag_bit``).
_SETS = {3: ("false", "0"), 4: ("true", "1")}


class _Attrs:
    """The attributes of one span that its kind reads, in canonical form. Slots 0-1 (an
    int: the last one counts) and 3-4 (a flag: any one sets it) are kept once each;
    slot-2 strings all (each is a string of the job and may be counted over a limit),
    as JSON bytes."""

    __slots__ = ("buf", "last")

    def __init__(self):
        self.buf, self.last = bytearray(), {}

    def add(self, key: str, slot: int, value: dict) -> None:
        if slot == 2:
            self.buf += b"," if self.buf else b""
            self.buf += _dumps({"key": key, "value": value})
        elif slot < 2:
            self.last.pop(key, None)
            self.last[key] = value
        elif key not in self.last or value["stringValue"] in _SETS[slot]:
            self.last[key] = value

    def bytes_into(self, d: dict, error: bool) -> bytes:
        """The span ``d`` (a dict of its other fields) as JSON, with these attributes and
        an error status if ``error``, in the recorder's order (``read_template``'s)."""
        if not self.buf and not self.last and not error:
            return _dumps(d)
        out = _dumps(d)[:-1]
        if self.buf or self.last:
            out += b',"attributes":['
            if self.last:
                out += _dumps([{"key": k, "value": v} for k, v in self.last.items()])[1:-1]
                out += b"," if self.buf else b""
            out += self.buf + b"]"
        return out + (b',"status":{"code":2}}' if error else b"}")


def _named(tid, sid, name: str) -> bytes:
    """A span the reader reads past (a structure span) or finds invalid (no times): its
    name, and its ids where they are ids (hex strings of 32 and 16 digits)."""
    if isinstance(tid, str) and isinstance(sid, str) and len(tid) == 32 and len(sid) == 16:
        return _dumps({"traceId": tid, "spanId": sid, "name": name})
    return _dumps({"name": name})


def _pb_span(sp, max_string: int | None) -> bytes:
    name = sp.name
    kind = _KIND_CODES.get(name)
    if kind is None:
        if name not in STRUCTURE:
            return _UNKNOWN
        return _named(sp.trace_id[:17].hex(), sp.span_id[:9].hex(), name)
    start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
    if end < start or end > _I64_MAX or len(sp.span_id) != 8 or len(sp.trace_id) != 16:
        # invalid for the decoder: invalid again on replay
        return _named(sp.trace_id[:17].hex(), sp.span_id[:9].hex(), name)
    d = {"traceId": sp.trace_id.hex(), "spanId": sp.span_id.hex()}
    if len(sp.parent_span_id) == 8:
        d["parentSpanId"] = sp.parent_span_id.hex()
    d["name"] = name
    if sp.kind:
        d["kind"] = sp.kind
    d["startTimeUnixNano"], d["endTimeUnixNano"] = str(start), str(end)
    attrs = _Attrs()
    if sp.attributes:
        wanted = _KIND_ATTRS[kind]
        for kv in sp.attributes:
            slot = wanted.get(kv.key)
            if slot is not None:
                try:
                    attrs.add(kv.key, slot, _wanted(slot, pb_value(kv.value), max_string, True))
                except (TypeError, ValueError, OverflowError):
                    return _named(sp.trace_id.hex(), sp.span_id.hex(), name)
    return attrs.bytes_into(d, sp.status.code == 2)


def _json_span(sp: dict, max_string: int | None) -> bytes:
    """The canonical form of a JSON span object, read as ``read_spans._spans_slow`` reads
    it (the same verdict on replay)."""
    if "name" not in sp:
        return b"{}"
    name = sp["name"]
    try:
        kind = _KIND_CODES.get(name)
    except TypeError:  # an unhashable name: invalid
        return b"{}"
    if kind is None:
        if name not in STRUCTURE:
            return _UNKNOWN
        return _named(sp.get("traceId"), sp.get("spanId"), name)
    attrs = _Attrs()
    try:
        start, end = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
        hsid, tid = sp["spanId"], sp["traceId"]
        int(hsid, 16)
        if not 0 <= start <= end or len(hsid) != 16 or len(tid) != 32:
            raise ValueError
        hash(tid)
        raw = sp.get("attributes")
        if raw:
            wanted = _KIND_ATTRS[kind]
            for a in raw:
                slot = wanted.get(a["key"])
                if slot is not None:
                    attrs.add(a["key"], slot, _wanted(slot, a["value"], max_string, False))
        status, error = sp.get("status"), False
        if status:
            code = status.get("code")
            error = code == 2 or code == "STATUS_CODE_ERROR"
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        # invalid for the reader: invalid again on replay (no times)
        return _named(sp.get("traceId"), sp.get("spanId"), name)
    d = {"traceId": tid, "spanId": hsid}
    parent, span_kind = sp.get("parentSpanId"), sp.get("kind")
    if isinstance(parent, str) and len(parent) == 16:
        d["parentSpanId"] = parent
    d["name"] = name
    if type(span_kind) is int and 0 < span_kind < 16:
        d["kind"] = span_kind
    d["startTimeUnixNano"], d["endTimeUnixNano"] = str(start), str(end)
    return attrs.bytes_into(d, error)


def _scope_parts(out: bytearray, name, spans, own: bool, span, max_string) -> None:
    """Append to ``out`` the JSON of one ``ScopeSpans``: this project's spans each encoded
    by ``span``, those of no kind (:data:`_UNKNOWN`) as ``{}`` in a scope of no name of
    their own (three bytes each: counted ``unknown`` on replay as they were), other
    scopes' spans as ``{}``."""
    n = len(spans)
    if own:
        out += b'{"scope":{"name":"' + _OWN.encode() + b'"},"spans":['
        first, unknown = True, 0
        for i in range(0, n, _CHUNK):
            for j in range(i, min(n, i + _CHUNK)):
                b = span(spans[j])
                if b is _UNKNOWN:
                    unknown += 1
                    continue
                if not first:
                    out += b","
                out += b
                first = False
        out += b"]}"
        if not unknown:
            return
        out += b","
        name, n = "", unknown
    out += b'{"scope":' + _dumps({"name": _cut(name, max_string)}) + b',"spans":['
    out += b"{}," * (n - 1)  # (n >= 1: scopes without spans are left out)
    out += b"{}]}"


def _rs_parts(out: bytearray, attrs: list, scopes) -> None:
    """Append to ``out`` the JSON of one ``ResourceSpans``: ``scopes`` yields
    ``(name, spans, own)`` of its scopes with spans."""
    out += b'{"resource":{"attributes":' + _dumps(attrs) + b'},"scopeSpans":['
    for i, (name, spans, own, span, max_string) in enumerate(scopes):
        if i:
            out += b","
        _scope_parts(out, name, spans, own, span, max_string)
    out += b"]}"


def _line(rss, parts_of) -> bytes:
    """The line of the ResourceSpans ``rss``: what ``parts_of(out, rs)`` appends to one
    ``bytearray`` (the line is in memory about twice while it is built; ``bytes.join``
    of many small parts would take 80 bytes per part)."""
    out = bytearray(b'{"resourceSpans":[')
    for i, rs in enumerate(rss):
        if i:
            out += b","
        parts_of(out, rs)
    out += b"]}\n"
    return bytes(out)


def _pb_job(rs) -> str:
    return job_name({kv.key: pb_value(kv.value) for kv in rs.resource.attributes})


def json_job_name(rs) -> str:
    """The job of one OTLP JSON ``ResourceSpans`` dict, as the reader names it
    (``unknown_job`` if unreadable)."""
    try:
        return job_name(json_resource_attrs(rs))
    except (AttributeError, TypeError):
        return job_name({})


def split_pb(req) -> dict[str, tuple[list, int]]:
    """Split a protobuf ``ExportTraceServiceRequest`` by job; a ``ResourceSpans`` without
    spans is left out (it touches no job).

    Returns ``{job: (its ResourceSpans messages, spans in them)}`` in first-seen order.
    """
    out: dict[str, tuple[list, int]] = {}
    for rs in req.resource_spans:
        if not rs.scope_spans:
            continue
        n = sum(len(ss.spans) for ss in rs.scope_spans)
        if not n:
            continue
        name = _pb_job(rs)
        rss, m = out.get(name, ([], 0))
        rss.append(rs)
        out[name] = (rss, m + n)
    return out


def pb_line(rss: list, max_string: int | None = None) -> bytes:
    """One OTLP JSON line (ending in a newline) of the ResourceSpans ``rss``, as the
    module docstring says: what the reader reads, strings cut past ``max_string``
    characters (None: not cut)."""
    def span(sp):
        return _pb_span(sp, max_string)

    def parts_of(out: bytearray, rs) -> None:
        res = {kv.key: kv.value for kv in rs.resource.attributes}  # the last one counts
        attrs = [{"key": k, "value": _canon(pb_value(v), max_string)}
                 for k, v in res.items() if _kept_key(k, max_string)]
        _rs_parts(out, attrs, ((ss.scope.name, ss.spans, ss.scope.name == _OWN, span,
                                max_string) for ss in rs.scope_spans if len(ss.spans)))

    return _line(rss, parts_of)


def _json_scopes(rs: dict):
    return rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ()


def split_json(req: dict) -> dict[str, tuple[list, int]]:
    """Split an OTLP JSON request (a dict with ``resourceSpans``, checked by
    :func:`~goodput_processor.serve.malformed.check_traces_json`) by job, as
    :func:`split_pb` (a ``ResourceSpans`` without spans is left out).

    Raises:
        TypeError, AttributeError: ``resourceSpans`` is not a list of objects.
    """
    out: dict[str, tuple[list, int]] = {}
    for rs in req["resourceSpans"] or ():
        spans = 0
        for ss in _json_scopes(rs):
            spans += len(ss.get("spans") or ())
        if not spans:
            continue
        name = json_job_name(rs)
        rss, n = out.get(name, ([], 0))
        rss.append(rs)
        out[name] = (rss, n + spans)
    return out


def json_line(rss: list, max_string: int | None = None) -> bytes:
    """One OTLP JSON line of the JSON ResourceSpans ``rss`` (checked by
    :func:`~goodput_processor.serve.malformed.check_traces_json`), as :func:`pb_line`."""
    def span(sp):
        return _json_span(sp, max_string) if isinstance(sp, dict) else {}

    def scopes(rs):
        for ss in _json_scopes(rs):
            spans = ss.get("spans") or ()
            if spans:
                name = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name")
                yield (name if isinstance(name, str) else "", spans, name == _OWN, span,
                       max_string)

    def parts_of(out: bytearray, rs) -> None:
        attrs = [{"key": k, "value": _canon(v, max_string)}
                 for k, v in json_resource_attrs(rs).items() if _kept_key(k, max_string)]
        _rs_parts(out, attrs, scopes(rs))

    return _line(rss, parts_of)
