"""The reader's span records: OTLP JSON spans to :data:`~goodput_processor.read.rows.COLUMNS`
rows, and the tables and attribute decoding they need (shared with ``goodput serve``).

:class:`SpanRows` is the part of :class:`goodput_processor.read.reader._Reader` that makes rows of
spans lists: a batch at a time through :mod:`~goodput_processor.read.fast` and
:mod:`~goodput_processor.read.template` while :meth:`_Reader.read_range` reads a file, or
span by span (:meth:`SpanRows._spans_slow`, which counts every span it skips) for input that
is not clean. Both give the same rows, counts and examples.
"""

from __future__ import annotations

import json
import zlib

import numpy as np

from goodput import schema

from . import fast as read_fast
from . import rows as tl
from . import template as read_template
from .attrs import _KIND_ATTRS, _KIND_CODES, flag_bit
from .rows import JobSpans, ProcessSpans

try:  # a dependency (fast); the standard library's json is the fallback
    import orjson

    def _loads(data):
        """``json.loads``, through orjson when it can: orjson refuses what the standard
        library accepts beyond strict JSON (``NaN``, integers past 64 bits), and such a
        line is read as ``json.loads`` reads it."""
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return json.loads(data)

    def _loads_exact(data):
        """``(_loads(data), exact)``: ``exact`` when orjson parsed it, so that
        :func:`_dumps` of any part of it is that part's exact text (no ``NaN``, infinity
        or integer past 64 bits, which orjson refuses and would not write back as read).

        Raises:
            ValueError, RecursionError: as ``json.loads``.
        """
        try:
            return orjson.loads(data), True
        except orjson.JSONDecodeError:
            return json.loads(data), False

    _dumps = orjson.dumps
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

    def _loads_exact(data):
        return json.loads(data), False

    _dumps = None


#: Spans that only shape traces (``goodput.window``): read past, never counted.
STRUCTURE = frozenset(schema.STRUCTURE)
_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1
#: Spans read into rows at once (see SpanRows._spans).
_BATCH_SPANS = 4096
#: Lines read at once (for read_template.scan): up to this many, or this many bytes.
_CHUNK_LINES = 1024
_CHUNK_BYTES = 2 << 20


class ScanPolicy:
    """Whether a chunk of lines is worth :func:`read_template.scan`: it is when the scan
    takes (nearly) every span of the lines (a journal's lines of a flush each, an import's
    lines of 512 steps), not when a line's leading run of forms stops early and most of its
    spans are left in the skeleton, which is parsed as well (a compacted segment's lines of
    a batch window, cut by a heartbeat or a checkpoint: there the scan and the parse of the
    rest together cost about 1.3x parsing the whole line). The rows are the same either
    way (the scan gives exactly what parsing gives): this only decides the cost.

    After a scanned chunk where the scan took less than :attr:`MIN_TAKEN` of the spans
    (spans counted by their ``"traceId":"`` keys), the next :attr:`SKIP` chunks are
    parsed without it, then one is scanned again (a probe). The state is the process's
    (a reader worker reads many files, one chunk or a few each). The line between: a
    compacted segment of the incumbent's job shape (1 s steps, a checkpoint every 100) gives
    0.2 to 0.7 a segment, one of this project's (0.5 s steps, a checkpoint every 1,000) 0.8
    to 1.0, where the scan still pays.
    """

    MIN_TAKEN = 0.75
    SKIP = 15

    def __init__(self) -> None:
        self.skip = 0

    def reset(self) -> None:
        """Scan the next chunk (a new read: :func:`~.reader.read_run_dir` starts with it)."""
        self.skip = 0

    def wanted(self) -> bool:
        """Scan the next chunk?"""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def saw(self, lines: list[bytes], found: list) -> None:
        """What the scan of ``lines`` gave (``found``, :func:`read_template.scan`'s)."""
        taken = left = 0
        for line, got in zip(lines, found, strict=True):
            if got is None:
                left += line.count(b'"traceId":"')
            else:
                taken += got[1].n
                left += got[0].count(b'"traceId":"')
        if taken < self.MIN_TAKEN * (taken + left):
            self.skip = self.SKIP


#: The reader's :class:`ScanPolicy` (one per process).
SCAN_POLICY = ScanPolicy()


_VALUE_TYPES = (("intValue", int), ("stringValue", str), ("boolValue", bool),
                ("doubleValue", float))


def _attr_value(value):
    """Python value of an OTLP ``AnyValue`` dict (int64 may be a JSON string or number)."""
    for key, convert in _VALUE_TYPES:
        if key in value:
            return convert(value[key])
    return None


def _as_int(v) -> int:
    r = int(v)  # floats truncate; NaN and infinities raise
    if not tl.NONE < r <= _I64_MAX:
        raise ValueError("out of int64 range")
    return r


def json_resource_attrs(rs: dict) -> dict:
    """``{key: python value}`` of an OTLP JSON ``ResourceSpans``'s resource (unreadable
    attributes left out).

    Raises:
        AttributeError: ``rs`` or its resource is not a JSON object.
    """
    attrs = {}
    for a in (rs.get("resource") or {}).get("attributes") or ():
        try:
            attrs[a["key"]] = _attr_value(a.get("value") or {})
        except (TypeError, KeyError, ValueError):
            continue
    return attrs


def job_name(attrs: dict) -> str:
    """The job a resource belongs to, from its attributes ``{key: python value}``:
    ``goodput.job.name``, else ``service.name`` (the recorder sets it to the job name),
    else ``unknown_job``. A name sent as another type than a string is written with its
    type, ``int:5``, ``bool:True``, ``float:1.0``, so that it is never the job of the string
    ``"5"``, ``"True"`` or ``"1.0"``."""
    name = attrs.get(schema.RES_JOB_NAME) or attrs.get(schema.RES_SERVICE_NAME)
    if name is None or name == "":
        return "unknown_job"
    return name if isinstance(name, str) else f"{type(name).__name__}:{name}"


class SpanRows:
    """Spans lists to rows, for :class:`goodput_processor.read.reader._Reader` (a mixin: the
    reader's tables, limits and counters are its attributes)."""

    def _lines(self, f, left: int):
        """``(line number, line, read_template.scan's answer)`` of the lines of ``f``, at
        most ``left`` bytes of them (-1: all); read a chunk at a time, for the scan."""
        chunk: list = []
        scan = self._batch is not None
        size = 0
        try:
            for lineno, line in enumerate(f, 1):
                self.nlines = lineno
                if left >= 0:
                    if left == 0:
                        self.nlines -= 1
                        break
                    left -= len(line)
                chunk.append((lineno, line))
                size += len(line)
                if size >= _CHUNK_BYTES or len(chunk) == _CHUNK_LINES:
                    yield from self._scanned(chunk, scan)
                    chunk, size = [], 0
        except (OSError, EOFError, zlib.error):
            yield from self._scanned(chunk, scan)  # the lines before it are read, as before
            raise
        yield from self._scanned(chunk, scan)

    @staticmethod
    def _scanned(chunk: list, scan: bool):
        found = None
        if scan and SCAN_POLICY.wanted():
            lines = [line for _, line in chunk]
            found = read_template.scan(lines)
            SCAN_POLICY.saw(lines, found)
        for i, (lineno, line) in enumerate(chunk):
            yield lineno, line, found and found[i]

    def _spans(self, spans: list, job: JobSpans, proc: ProcessSpans, where,
               source: tuple | None = None, taken=None) -> None:
        """Read a spans list of ``proc``: now, or with the next ones of the same process
        (one batch of rows: fewer numpy calls), while nothing else can happen in between.

        ``source`` is (line, resource index, scope index), to parse the list again if the
        batch must be read span by span: a batch keeps a few objects per list, not the
        parsed lines (:mod:`~goodput_processor.read.fast`)."""
        batch = self._batch
        if batch is not None and source is not None and type(spans) is list:
            if batch and batch[-1][2] is not proc:
                self._flush()
            if self._fast.add(spans, taken):
                self._batch.append((source, job, proc, where))  # a new list after a flush
                if self._fast.total >= _BATCH_SPANS:
                    self._flush()
                return
        self._flush()
        if taken is not None:  # the whole list, as the whole line gives it
            spans = _parsed_spans(*source)
        self._spans_now(spans, job, proc, where)

    def _flush(self) -> None:
        """Make rows of the spans lists waiting in the batch (see :meth:`_spans`)."""
        batch = self._batch
        if not batch:
            return
        self._batch = []
        fast = self._fast.rows()
        self._fast.clear()
        if fast is not None:
            self._add_rows(fast, batch[0][1], batch[0][2])
            return
        for source, job, proc, where in batch:  # not clean: span by span
            self._spans_slow(_parsed_spans(*source), job, proc, where)

    def _spans_now(self, spans: list, job: JobSpans, proc: ProcessSpans, where) -> None:
        one = read_fast.Batch(_KIND_CODES, _KIND_ATTRS, _attr_value, _as_int, flag_bit)
        fast = one.rows() if type(spans) is list and one.add(spans) else None
        if fast is None:  # something to skip or count: span by span
            self._spans_slow(spans, job, proc, where)
        else:
            self._add_rows(fast, job, proc)

    def _add_rows(self, fast: read_fast.FastRows, job: JobSpans, proc: ProcessSpans) -> None:
        """Number the trace ids and strings of what :func:`read_fast.span_rows` read, in
        span order, and append its rows to ``proc``."""
        rows, trace_ids = fast.rows, self._trace_ids
        if len(rows):  # numbered in order of first appearance
            ids = [trace_ids.setdefault(t, len(trace_ids)) for t in fast.tids]
            rows[:, tl.C_TIDX] = ids[0] if fast.tcodes is None else np.array(ids)[fast.tcodes]
        if fast.strings:
            drop = []
            for i, values in fast.strings:
                for value, kind in values:
                    sidx = self.type_sid(job, value, kind)
                if sidx is None:  # a custom badput type past goodput serve's limit
                    job.skipped["over_limit"] += 1
                    drop.append(i)
                else:
                    rows[i, tl.C_SIDX] = sidx
            if drop:
                rows = np.delete(rows, drop, axis=0)
        proc._buf.frombytes(rows.data.cast("B"))  # a memoryview: no copy
        if fast.unknown:
            job.skipped["unknown"] += fast.unknown

    def _spans_slow(self, spans: list, job: JobSpans, proc: ProcessSpans, where: str) -> None:
        out: list[int] = []
        extend = out.extend
        kind_codes, kind_attrs, trace_ids = _KIND_CODES, _KIND_ATTRS, self._trace_ids
        none, i64_max, u64 = tl.NONE, _I64_MAX, _U64
        unknown = 0
        last_tid, tidx = None, -1
        for sp in spans:
            try:
                kind = kind_codes.get(sp["name"])
                if kind is None:
                    if sp["name"] not in STRUCTURE:
                        unknown += 1
                    continue
                start = int(sp["startTimeUnixNano"])
                end = int(sp["endTimeUnixNano"])
                hsid, tid = sp["spanId"], sp["traceId"]
                sid = int(hsid, 16)
                if not 0 <= start <= end:
                    raise ValueError("end before start" if start >= 0 else "negative time")
                if len(hsid) != 16 or len(tid) != 32:
                    raise ValueError("spanId must be 16 hex digits and traceId 32")
                if tid != last_tid:
                    tidx = trace_ids.get(tid)
                    if tidx is None:
                        tidx = trace_ids[tid] = len(trace_ids)
                    last_tid = tid
                ival = aux = none
                flags = 0
                sidx = -1
                attrs = sp.get("attributes")
                if attrs:
                    wanted = kind_attrs[kind]
                    for a in attrs:
                        slot = wanted.get(a["key"])
                        if slot is None:
                            continue
                        v = a["value"]
                        if slot < 2:
                            x = v.get("intValue")
                            x = _as_int(_attr_value(v)) if x is None else int(x)
                            if slot:
                                aux = x
                            else:
                                ival = x
                        elif slot == 2:
                            sidx = self.type_sid(job, str(_attr_value(v)), kind)
                        else:
                            flags |= flag_bit(slot, _attr_value(v))
                status = sp.get("status")
                if status:
                    code = status.get("code")
                    if code == 2 or code == "STATUS_CODE_ERROR":
                        flags |= tl.F_ERROR
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
                name = sp.get("name") if isinstance(sp, dict) else None
                self._skip(job, "invalid_span", where, f"invalid {name} span ({e!r})")
                continue
            if sidx is None:  # a custom badput type past goodput serve's limit
                job.skipped["over_limit"] += 1
                continue
            if sid > i64_max:
                sid -= u64
            extend((start, end, kind, ival, aux, flags, sidx, tidx, sid))
        try:
            proc._buf.fromlist(out)
        except OverflowError:  # rare: re-add record by record, skipping out-of-range ones
            for r in range(0, len(out), tl.NCOLS):
                rec = out[r : r + tl.NCOLS]
                if all(none <= x <= i64_max for x in rec):
                    proc._buf.fromlist(rec)
                else:
                    self._skip(job, "invalid_span", where, "a time, id or attribute is out "
                               "of the int64 range")
        if unknown:
            job.skipped["unknown"] += unknown


def _parsed_spans(line: bytes, ri: int, si: int) -> list:
    """The spans list of resource ``ri``, scope ``si`` of a line that gave one before."""
    rs = _loads(line)["resourceSpans"][ri]
    return (rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans"))[si]["spans"]
