"""Decode a protobuf OTLP ``ExportTraceServiceRequest`` into the reader's span columns.

The OTLP JSON path (spool lines, ``POST /v1/traces`` with a JSON body) goes through
:meth:`goodput_processor.read.reader._Reader._request`; this module is the same thing for the
protobuf message the gRPC and HTTP/protobuf receivers get, producing the very same int64
rows (:data:`goodput_processor.read.rows.COLUMNS`) so that live results equal
``goodput report`` of the same spans. Trace ids are keyed by their lowercase hex, as in
the JSON encoding, so a span received both ways (spool tailing and OTLP) is kept once.

The cost is linear in the request: each span becomes one row appended to its process's
growable ``array('q')`` buffer; nothing already stored is touched.
"""

from __future__ import annotations

from goodput import schema

from ..read import reader as rd
from ..read import rows as tl

__all__ = ["ingest_pb", "pb_value"]


def pb_value(value):
    """Python value of an OTLP protobuf ``AnyValue`` (None for arrays, maps and bytes)."""
    which = value.WhichOneof("value")
    if which in ("int_value", "string_value", "bool_value", "double_value"):
        return getattr(value, which)
    return None


def ingest_pb(reader: rd._Reader, req, where: tuple) -> int:
    """Add the goodput spans of ``req`` (an ``ExportTraceServiceRequest``) to ``reader``.

    ``where`` names the source in skip examples, e.g. ``("otlp-grpc", "request 12")``.
    Returns the number of spans in the request (of any scope). Never raises on bad spans:
    they are counted by reason in the job's ``skipped`` (see :mod:`goodput_processor.read.reader`).
    """
    n = 0
    for rs in req.resource_spans:
        attrs = {}
        for kv in rs.resource.attributes:
            attrs[kv.key] = pb_value(kv.value)
        job, proc, ok, version = reader.resource_attrs(attrs)
        for ss in rs.scope_spans:
            spans = ss.spans
            if not spans:
                continue
            n += len(spans)
            if ss.scope.name != schema.SCOPE_NAME:
                job.skipped["unknown"] += len(spans)
            elif not ok:
                reader._skip(job, "unsupported_schema", where, f"schema version {version!r} "
                             f"not supported (this processor reads {rd._SUPPORTED_MAJOR}.x)",
                             len(spans))
            else:
                _spans(reader, spans, job, proc, where)
    return n


def _spans(reader: rd._Reader, spans, job, proc, where) -> None:
    out: list[int] = []
    extend = out.extend
    kind_codes, kind_attrs, trace_ids = rd._KIND_CODES, rd._KIND_ATTRS, reader._trace_ids
    none, i64_max, u64 = tl.NONE, rd._I64_MAX, rd._U64
    unknown = 0
    last_tid, tidx = None, -1
    for sp in spans:
        kind = kind_codes.get(sp.name)
        if kind is None:
            if sp.name not in rd.STRUCTURE:
                unknown += 1
            continue
        try:
            start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
            if end < start:
                raise ValueError("end before start")
            if start > i64_max or end > i64_max:
                raise ValueError("time out of int64 range")
            if len(sp.span_id) != 8 or len(sp.trace_id) != 16:
                raise ValueError("spanId must be 8 bytes and traceId 16 bytes")
            sid = int.from_bytes(sp.span_id, "big")
            tid = sp.trace_id
            if tid != last_tid:
                key = tid.hex()
                tidx = trace_ids.get(key)
                if tidx is None:
                    tidx = trace_ids[key] = len(trace_ids)
                last_tid = tid
            ival = aux = none
            flags = 0
            sidx = -1
            if sp.attributes:
                wanted = kind_attrs[kind]
                for kv in sp.attributes:
                    slot = wanted.get(kv.key)
                    if slot is None:
                        continue
                    v = pb_value(kv.value)
                    if slot < 2:
                        x = rd._as_int(v)
                        if slot:
                            aux = x
                        else:
                            ival = x
                    elif slot == 2:
                        sidx = reader.type_sid(job, str(v), kind)
                    else:
                        flags |= rd.flag_bit(slot, v)
            if sp.status.code == 2:
                flags |= tl.F_ERROR
        except (TypeError, ValueError, OverflowError) as e:
            reader._skip(job, "invalid_span", where, f"invalid {sp.name} span ({e!r})")
            continue
        if sidx is None:  # a custom badput type past goodput serve's limit
            job.skipped["over_limit"] += 1
            continue
        if sid > i64_max:
            sid -= u64
        extend((start, end, kind, ival, aux, flags, sidx, tidx, sid))
    proc._buf.fromlist(out)  # every value checked to be in int64 range above
    if unknown:
        job.skipped["unknown"] += unknown
