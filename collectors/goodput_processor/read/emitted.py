"""The goodput spans a source made, read into the reader's rows straight.

A source's :class:`~goodput_processor.importers.sources.base.Emitter` hands its spans over
as :class:`~goodput_processor.importers.sources.base.EmittedSpans` (one process's spans as
tuples). :func:`ingest_emitted` appends their rows (:data:`goodput_processor.read.rows.
COLUMNS`) to a reader (a :class:`goodput_processor.read.reader._Reader`) without making the
OTLP JSON dicts first and reading them again: the same rows, skips and counts as
``reader._request`` of :meth:`EmittedSpans.resource_spans` gives (``goodput report`` of a
foreign directory, ``goodput serve``'s intake of a foreign producer's spans, and the
write-ahead log's replay of them all agree). What is not clean (a span id that is not 16
hex digits, an attribute of another type than the reader's slot takes, a value out of the
int64 range, an unsupported schema) goes the OTLP JSON way, where the reader counts it.

Takes a reader object; imports nothing of the reader's module but its tables.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from goodput import schema

from . import rows as tl
from .spans import _I64_MAX, _KIND_ATTRS, _KIND_CODES, _U64, STRUCTURE, flag_bit

__all__ = ["ingest_emitted"]

#: The schema major version the reader reads (``reader._SUPPORTED_MAJOR``).
_MAJOR = schema.SCHEMA_VERSION.split(".")[0]


def _rows(batch, kind_codes=_KIND_CODES, kind_attrs=_KIND_ATTRS):
    """``(rows, strings, unknown)`` of ``batch``'s spans (``rows``: flat ints, nine a span,
    its string slot -1; ``strings``: ``(row number, value, kind)``; ``unknown``: spans of
    no kind that are no structure), or None when a span is not clean; where the batch holds
    spans in bulk (``SpanColumns``), see :func:`_column_rows`."""
    if batch.columns:
        return _column_rows(batch)
    out: list[int] = []
    extend = out.extend
    strings = []
    unknown = 0
    none, i64_max, u64 = tl.NONE, _I64_MAX, _U64
    f_error = tl.F_ERROR
    n = 0
    for name, start, end, attrs, span_id, error in batch.spans:
        kind = kind_codes.get(name)
        if kind is None:
            if name not in STRUCTURE:
                unknown += 1
            continue
        if not 0 <= start <= end <= i64_max or len(span_id) != 16:
            return None
        try:  # as the reader reads a span id (int(spanId, 16) of 16 characters)
            sid = int(span_id, 16)
        except ValueError:
            return None
        ival = aux = none
        flags = f_error if error else 0
        if attrs:
            wanted = kind_attrs[kind]
            for key, v in attrs.items():
                slot = wanted.get(key)
                if slot is None:
                    continue
                if slot < 2:
                    if type(v) is not int or not none <= v <= i64_max:
                        return None
                    if slot:
                        aux = v
                    else:
                        ival = v
                elif slot == 2:
                    if type(v) is not str:
                        return None
                    strings.append((n, v, kind))
                elif type(v) is bool:
                    flags |= flag_bit(slot, v)
                else:
                    return None
        if sid > i64_max:
            sid -= u64
        extend((start, end, kind, ival, aux, flags, -1, 0, sid))
        n += 1
    return out, strings, unknown


def _column_rows(batch):
    """:func:`_rows` of a batch that holds ``SpanColumns`` among its tuples: the same rows
    (an ``(n, NCOLS)`` int64 array where the batch is one ``SpanColumns`` alone), or None
    when a span is not clean."""
    out: list[int] = []
    strings, unknown, n, run = [], 0, 0, []
    for item in [*batch.spans, None]:
        if type(item) is tuple:
            run.append(item)
            continue
        if run:  # the tuples before these columns
            got = _rows(SimpleNamespace(spans=run, columns=False))
            if got is None:
                return None
            out.extend(got[0])
            strings.extend((i + n, v, k) for i, v, k in got[1])
            unknown += got[2]
            n, run = n + len(got[0]) // tl.NCOLS, []
        if item is None:
            break
        kind = _KIND_CODES.get(item.name)
        slot = None if kind is None else _KIND_ATTRS[kind].get(item.attr)
        if slot not in (0, 1) or not len(item):
            return None  # (no such columns are made: the OTLP JSON way reads them)
        value = item.value + item.add
        if not ((item.start >= 0).all() and (item.start <= item.end).all()
                and (value >= item.value).all()):  # (past 2**63: wrapped below)
            return None
        rows = np.empty((len(item), tl.NCOLS), np.int64)
        rows[:, tl.C_START], rows[:, tl.C_END], rows[:, tl.C_KIND] = item.start, item.end, kind
        rows[:, tl.C_IVAL] = value if slot == 0 else tl.NONE
        rows[:, tl.C_AUX] = value if slot == 1 else tl.NONE
        rows[:, tl.C_FLAGS] = tl.F_ERROR if item.error else 0
        rows[:, tl.C_SIDX], rows[:, tl.C_TIDX], rows[:, tl.C_SID] = -1, 0, item.sid
        if len(batch.spans) == 1:
            return rows, strings, unknown
        out.extend(rows.ravel().tolist())
        n += len(item)
    return out, strings, unknown


def ingest_emitted(reader, batch, where) -> object:
    """Append the rows of ``batch`` (one process's :class:`EmittedSpans`) to ``reader``;
    returns its job (a ``JobSpans``), as ``reader._request`` of the batch's OTLP JSON
    would. ``where`` names the input in skip examples."""
    got = _rows(batch)
    version = batch.resource.get(schema.RES_SCHEMA_VERSION)
    if got is None or version is not None and str(version).split(".")[0] != _MAJOR:
        return reader._request({"resourceSpans": [batch.resource_spans()]}, where)
    job, proc, _, _ = reader.resource_attrs(dict(batch.resource))
    if reader._range_jobs is not None:
        reader._range_jobs.add(job.name)
    reader._flush()
    out, strings, unknown = got
    ncols = tl.NCOLS
    if type(out) is not list:  # one SpanColumns' rows (_column_rows)
        tidx = reader._trace_ids.setdefault(batch.trace_id, len(reader._trace_ids))
        out[:, tl.C_TIDX] = tidx
        proc._buf.frombytes(out.tobytes())
    elif out:
        trace_ids = reader._trace_ids
        tidx = trace_ids.get(batch.trace_id)
        if tidx is None:
            tidx = trace_ids[batch.trace_id] = len(trace_ids)
        out[tl.C_TIDX::ncols] = [tidx] * (len(out) // ncols)
        if strings:
            drop = []
            for i, value, kind in strings:
                sidx = reader.type_sid(job, value, kind)
                if sidx is None:  # a custom badput type past goodput serve's limit
                    drop.append(i)
                else:
                    out[i * ncols + tl.C_SIDX] = sidx
            if drop:
                job.skipped["over_limit"] += len(drop)
                for i in reversed(drop):
                    del out[i * ncols:(i + 1) * ncols]
        proc._buf.fromlist(out)
    if unknown:
        job.skipped["unknown"] += unknown
    return job

