"""Read a run directory of OTLP JSON lines spool files into compact per-process columns.

The training side writes ``RUN_DIR/spans-p<index>-a<attempt>-<pid>-<id>.jsonl`` files, one OTLP JSON
``ExportTraceServiceRequest`` per line (see ``docs/span-schema.md``), and compacts closed
segments of them into ``*.jsonl.gz`` files (gzip-compressed OTLP JSON lines). :func:`read_run_dir`
streams every ``*.jsonl`` and ``*.jsonl.gz`` file under the directory (recursively, in sorted
order; not the ``metrics-*.jsonl`` files of :mod:`goodput.diagnostics`, and not a ``X.jsonl``
next to its compacted ``X.jsonl.gz``) line by line and keeps, per
(job, attempt, process index), one ``int64`` record per span
(:data:`~goodput_processor.timeline.COLUMNS`): a million spans take about 70 MB and no
parsed JSON is retained. On Linux, inputs of 64 MiB or more are split at line boundaries
and parsed by forked worker processes (one per CPU, at most 4); the result is identical to
reading serially.

Nothing is dropped silently: every skipped line or span is counted by reason in
:attr:`JobSpans.skipped` (or :attr:`SpanSet.skipped` when it cannot be tied to a job):

- ``torn``: last line of a file with no trailing newline that is not valid JSON (a crash
  mid-write); counted in lines.
- ``malformed``: any other line that is not valid JSON or not an OTLP request (the first
  line of a file too); in lines. A file none of whose lines is an OTLP request is listed
  in :attr:`SpanSet.file_problems` (``spool_file_skipped``), and so is an empty
  (``empty_spool_file``) or unreadable one.
- ``invalid_span``: a span without valid name/times/ids (times are integers in
  [0, 2**63), ``spanId`` 16 and ``traceId`` 32 hex digits, as the protobuf path requires),
  or ending before it starts.
- ``duplicate``: a span whose (traceId, spanId) was already read for the same process.
- ``unknown``: a span of another instrumentation scope or with a name not in the schema
  (the structure spans of :data:`goodput.schema.STRUCTURE` are read past, not counted).
- ``unsupported_schema``: a span of a resource whose ``goodput.schema.version`` major
  number this processor does not know.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sys
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from goodput import schema

from . import cache as _cache
from . import read_fast, read_io, read_template
from . import timeline as tl
from .timeline import JobSpans, ProcessSpans, SpanSet

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
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

__all__ = ["ReadError", "RunDirError", "SpoolFormatError", "read_run_dir"]

_KIND_CODES = {name: code for code, name in enumerate(tl.KIND_NAMES)}
_K_CUSTOM = tl.K_CUSTOM_BADPUT
# Per kind: attribute key -> slot (0 = ival, 1 = aux, 2 = string, 3 = blocking flag,
# 4 = open flag).
_BLOCKING = {schema.ATTR_BLOCKING: 3, schema.ATTR_OPEN: 4}
_RECORDER = {schema.ATTR_RECORDER_ERRORS: 0, schema.ATTR_RECORDER_DROPPED: 1}
_KIND_ATTRS: tuple[dict[str, int], ...] = (
    {schema.ATTR_HEARTBEAT_INTERVAL_MS: 0}, {**_RECORDER, schema.ATTR_END_REASON: 2}, _RECORDER,
    {schema.RES_PROCESS_INDEX: 0, schema.RES_PROCESS_COUNT: 1},
    _BLOCKING, _BLOCKING, _BLOCKING, _BLOCKING,
    {schema.ATTR_STEP: 0, schema.ATTR_STEP_COUNT: 1, **_BLOCKING},
    {schema.ATTR_CHECKPOINT_STEP: 0, **_BLOCKING}, {schema.ATTR_CHECKPOINT_STEP: 0, **_BLOCKING},
    {schema.ATTR_BADPUT_TYPE: 2, **_BLOCKING},
    {schema.ATTR_ELASTIC_EVENT_TYPE: 2, **_BLOCKING}, _BLOCKING,
    # elastic_slices: the available count goes to the string slot (see timeline.COLUMNS)
    {schema.ATTR_SLICES_ACTIVE: 0, schema.ATTR_SLICES_TOTAL: 1,
     schema.ATTR_SLICES_AVAILABLE: 2},
    _BLOCKING,  # collective_wait (1.3)
    {schema.ATTR_LAUNCHER_WORKER_PID: 0, schema.ATTR_LAUNCHER_EXIT_CODE: 1,
     schema.ATTR_LAUNCHER_EVENT: 2},  # launcher_event (1.3)
)
if len(_KIND_ATTRS) != len(tl.KIND_NAMES):  # pragma: no cover - a schema edit, not input
    raise ImportError("reader._KIND_ATTRS needs one entry per timeline.KIND_NAMES kind")


def flag_bit(slot: int, value) -> int:
    """The ``flags`` bit a slot-3/4 attribute value sets: ``goodput.blocking`` false ->
    ``F_NONBLOCKING``, ``goodput.open`` true -> ``F_OPEN``, else 0."""
    text = str(value).lower()
    if slot == 3:
        return tl.F_NONBLOCKING if text in ("false", "0") else 0
    return tl.F_OPEN if text in ("true", "1") else 0
#: Spans that only shape traces (``goodput.window``): read past, never counted.
STRUCTURE = frozenset(schema.STRUCTURE)
_MAX_EXAMPLES = 20
_SUPPORTED_MAJOR = schema.SCHEMA_VERSION.split(".")[0]
_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1
#: Parallel reading: bytes per work unit, and the least input worth starting workers for.
_UNIT_BYTES = 32 << 20
_PARALLEL_MIN_BYTES = 64 << 20
_MAX_WORKERS = 4
#: Spans read into rows at once (see _Reader._spans).
_BATCH_SPANS = 4096
#: Lines read at once (for read_template.scan).
_CHUNK_LINES = 32
_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip strips
_CAN_FORK = sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


class ReadError(Exception):
    """Base class of the errors :func:`read_run_dir` raises; ``str(err)`` is one line."""


class RunDirError(ReadError):
    """The run directory is missing, not a directory, unreadable, or holds no spans."""


class SpoolFormatError(ReadError):
    """No file gave a span and a ``*.jsonl`` file is not OTLP JSON lines; the message names
    the file and line."""


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
    else ``unknown_job``."""
    name = attrs.get(schema.RES_JOB_NAME) or attrs.get(schema.RES_SERVICE_NAME)
    return str(name) if name not in (None, "") else "unknown_job"


class _Reader:
    """Reads lines into per-process buffers; parallel readers are merged into one."""

    def __init__(self, max_string: int | None = None, max_custom_types: int | None = None):
        # Limits of goodput serve (None: none, as goodput report reads): longest string
        # attribute value kept, distinct custom badput types per job.
        self.max_string, self.max_custom_types = max_string, max_custom_types
        self.jobs: dict[str, JobSpans] = {}
        self.skipped: Counter = Counter()
        self.strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self._trace_ids: dict[str, int] = {}
        # Examples per job name (None: not tied to a job) as (path, line, why).
        self._examples: dict[str | None, list[tuple]] = {}
        self.examples: list[str] = []  # not tied to a job; filled by finish()
        # Line skips before any job of the range was seen: counts by reason, and the
        # first _MAX_EXAMPLES as (reason, where, why) (bounded: a file of garbage lines
        # after a first line naming no job must not grow a list per line).
        self._orphan_n: Counter = Counter()
        self._orphans: list[tuple] = []
        self.nlines, self.last_job = 0, None
        # Per file: [non-empty lines, OTLP requests, the first bad line's message or None].
        self.file_stats: dict[str, list] = {}
        self.unreadable: dict[str, str] = {}  # path -> why
        # While read_range reads (None otherwise, as goodput serve uses a reader): spans
        # lists of one process not yet made rows, as (spans, job, proc, where).
        self._batch: list | None = None
        self._fast = read_fast.Batch(_KIND_CODES, _KIND_ATTRS, _attr_value, _as_int, flag_bit)

    def _job(self, name: str) -> JobSpans:
        job = self.jobs.get(name)
        return job or self.jobs.setdefault(name, JobSpans(name, strings=self.strings))

    def _proc(self, job: JobSpans, attempt: int, index: int, instance: str = "") -> ProcessSpans:
        key = (attempt, index, instance)
        proc = job.processes.get(key)
        if proc is None:
            proc = job.processes[key] = ProcessSpans(job.name, attempt, index, instance=instance)
        return proc

    def _skip(self, job: JobSpans | None, reason: str, where, why: str, n: int = 1):
        self._flush()
        (job.skipped if job else self.skipped)[reason] += n
        examples = self._examples.setdefault(job.name if job else None, [])
        if len(examples) < _MAX_EXAMPLES:
            examples.append((*where, why))

    def _sid(self, s: str) -> int:
        i = self._string_ids.get(s)
        if i is None:
            i = self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return i

    def type_sid(self, job: JobSpans, s: str, kind: int) -> int | None:
        """String id of a span's string attribute (a custom badput type, an end reason, an
        elastic or launcher event), within the reader's limits: a value longer than
        ``max_string`` is cut to it; a custom badput type (``kind`` is the custom badput
        kind) past ``max_custom_types`` distinct ones in the job gets None (the span is
        skipped as ``over_limit``). Both are counted in ``job.over_limit``. Other strings
        are never refused: an end marker or an elastic record is structure."""
        if self.max_string is not None and len(s) > self.max_string:
            s = s[: self.max_string]
            job.over_limit["attribute_bytes"] += 1
        i = self._sid(s)
        if (self.max_custom_types is not None and kind == _K_CUSTOM
                and i not in job.custom_sids):
            if len(job.custom_sids) >= self.max_custom_types:
                job.over_limit["custom_types"] += 1
                return None
            job.custom_sids.add(i)
        return i

    def read_range(self, path: str, start: int = 0, end: int | None = None) -> None:
        """Read the lines of ``path`` in bytes [start, end) (line-aligned; end None = EOF).

        Line numbers in messages count from the start of the range.
        """
        first, last_job = start == 0, None  # torn/malformed lines count for the file's job
        expected = 'a JSON object with "resourceSpans" (an OTLP ExportTraceServiceRequest)'
        left = -1 if end is None else end - start
        stats = self.file_stats.setdefault(path, [0, 0, None])
        if self.max_string is None and self.max_custom_types is None:
            self._batch = []  # no limit to count in order: spans may wait for a batch
        try:
            with read_io.open_spool(path) as f:
                f.seek(start)
                for lineno, line, pre in self._lines(f, left):
                    if line[0] in _WHITESPACE and not line.strip():  # strip copies
                        continue
                    stats[0] += 1
                    where = (path, lineno)
                    try:
                        if pre is not None:  # spans taken from the text: parse the rest
                            try:
                                req = _loads(pre[0])
                            except (ValueError, RecursionError):  # as the whole line says
                                pre = None
                                req = _loads(line)
                        else:
                            req = _loads(line)
                        ok = isinstance(req, dict) and "resourceSpans" in req
                        got = "" if ok else f"got {type(req).__name__}" + (
                            f" with keys {sorted(req)[:5]}" if isinstance(req, dict) else "")
                    except (ValueError, RecursionError) as e:
                        if not line.endswith(b"\n") and (
                            not first or (line.lstrip()[:1] == b"{" and b"resourceSpans" in line)
                        ):
                            self._skip_line(last_job, "torn", where, "incomplete last line")
                            continue
                        ok, got = False, f"got invalid JSON ({e})"
                    if not ok:
                        if stats[2] is None:
                            stats[2] = (f"{path}:{lineno}: not an OTLP JSON lines file: "
                                        f"expected {expected}, {got}")
                        self._skip_line(last_job, "malformed", where, f"expected {expected}, {got}")
                        continue
                    first = False
                    stats[1] += 1
                    try:
                        last_job = self._request(req, where, line,
                                                 pre and pre[1]) or last_job
                    except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
                        self._skip_line(last_job, "malformed", where, f"bad OTLP structure ({e!r})")
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            self.unreadable[path] = f"cannot read it: {getattr(e, 'strerror', None) or e}"
        finally:
            self._flush()
            self._batch = None
        self.last_job = last_job.name if last_job else None

    def _lines(self, f, left: int):
        """``(line number, line, read_template.scan's answer)`` of the lines of ``f``, at
        most ``left`` bytes of them (-1: all); read a chunk at a time, for the scan."""
        chunk: list = []
        scan = self._batch is not None
        try:
            for lineno, line in enumerate(f, 1):
                self.nlines = lineno
                if left >= 0:
                    if left == 0:
                        self.nlines -= 1
                        break
                    left -= len(line)
                chunk.append((lineno, line))
                if len(chunk) == _CHUNK_LINES:
                    yield from self._scanned(chunk, scan)
                    chunk = []
        except (OSError, EOFError, zlib.error):
            yield from self._scanned(chunk, scan)  # the lines before it are read, as before
            raise
        yield from self._scanned(chunk, scan)

    @staticmethod
    def _scanned(chunk: list, scan: bool):
        found = read_template.scan([line for _, line in chunk]) if scan else None
        for i, (lineno, line) in enumerate(chunk):
            yield lineno, line, found and found[i]

    def _skip_line(self, job: JobSpans | None, reason: str, where, why: str) -> None:
        """Skip a line; before the first job of the range is known, keep it for later."""
        self._flush()
        if job is None:
            self._orphan_n[reason] += 1
            if len(self._orphans) < _MAX_EXAMPLES:
                self._orphans.append((reason, where, why))
        else:
            self._skip(job, reason, where, why)

    def _resource(self, rs: dict):
        return self.resource_attrs(json_resource_attrs(rs))

    def resource_attrs(self, attrs: dict):
        """Job and process of a resource given as ``{key: python value}``.

        Returns ``(job, proc, supported, schema_version)``; shared by the OTLP JSON path
        here and the protobuf path of :mod:`goodput_processor.serve.decode`.
        """
        name = job_name(attrs)
        try:
            attempt = _as_int(attrs.get(schema.RES_ATTEMPT, 0))
            index = _as_int(attrs.get(schema.RES_PROCESS_INDEX, 0))
        except (TypeError, ValueError, OverflowError):
            attempt, index = 0, 0
        # One OS process's attempt is one key; without the process start (recorders before
        # schema 1.1, imported logs) the declared (attempt, index) is, as it always was.
        instance = attrs.get(schema.RES_SERVICE_INSTANCE_ID)
        pstart = attrs.get(schema.RES_PROCESS_START)
        if instance is None or not isinstance(pstart, int) or isinstance(pstart, bool):
            instance = ""
        job = self._job(name)
        if self.max_string is not None:
            for key, v in attrs.items():
                if isinstance(v, str) and len(v) > self.max_string:
                    attrs[key] = v[: self.max_string]
                    job.over_limit["attribute_bytes"] += 1
        proc = self._proc(job, attempt, index, str(instance)[:64])
        host, count = attrs.get(schema.RES_HOST_NAME), attrs.get(schema.RES_PROCESS_COUNT)
        proc.host = proc.host if host is None else str(host)
        proc.process_count = count if isinstance(count, int) else proc.process_count
        pid = attrs.get(schema.RES_PROCESS_PID)
        if isinstance(pid, int) and not isinstance(pid, bool):
            proc.pid = pid
        if instance:
            proc.process_start_ns = pstart
        for key, attr in ((schema.RES_ATTEMPT_SOURCE, "attempt_source"),
                          (schema.RES_PROCESS_INDEX_SOURCE, "index_source")):
            if isinstance(attrs.get(key), str):
                setattr(proc, attr, attrs[key][:16])
        for key in tl.RUN_ATTRIBUTES + tl.LAUNCH_ATTRIBUTES:
            v = attrs.get(key)
            if v is not None and not (isinstance(v, float) and not math.isfinite(v)):
                proc.run[key] = v  # NaN/infinity dropped: the JSON report cannot hold them
        version = attrs.get(schema.RES_SCHEMA_VERSION)
        proc.schema_version = version = None if version is None else str(version)
        ok = version is None or version.split(".")[0] == _SUPPORTED_MAJOR
        if version is not None and ok:
            job.schema_versions.add(version)
        return job, proc, ok, version

    def _request(self, req: dict, where, line: bytes | None = None,
                 taken=None) -> JobSpans | None:
        """Read one OTLP request (``line``: the JSON line it was parsed from, if any;
        ``taken``: spans taken from its first spans list by :func:`read_template.scan`,
        before the ones ``req`` holds)."""
        job = None
        for ri, rs in enumerate(req["resourceSpans"] or ()):
            job, proc, ok, version = self._resource(rs)
            scopes = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ()
            for si, ss in enumerate(scopes):
                spans = ss.get("spans") or ()
                scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name")
                first = taken if ri == 0 and si == 0 else None
                if not spans and first is None:
                    continue
                if scope != schema.SCOPE_NAME:
                    self._flush()
                    job.skipped["unknown"] += len(spans) + (first.n if first else 0)
                elif not ok:
                    self._skip(job, "unsupported_schema", where, f"schema version {version!r} "
                               f"not supported (this processor reads {_SUPPORTED_MAJOR}.x)",
                               len(spans) + (first.n if first else 0))
                else:
                    self._spans(spans, job, proc, where,
                                None if line is None else (line, ri, si), first)
        return job

    def _spans(self, spans: list, job: JobSpans, proc: ProcessSpans, where,
               source: tuple | None = None, taken=None) -> None:
        """Read a spans list of ``proc``: now, or with the next ones of the same process
        (one batch of rows: fewer numpy calls), while nothing else can happen in between.

        ``source`` is (line, resource index, scope index), to parse the list again if the
        batch must be read span by span: a batch keeps a few objects per list, not the
        parsed lines (:mod:`~goodput_processor.read_fast`)."""
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

    def merge(self, other: _Reader, line_base: int, last_job: str | None) -> None:
        """Append what ``other`` read: the next range of a file, starting at line
        ``line_base + 1``, whose previous ranges last named job ``last_job``."""
        smap = np.array([self._sid(s) for s in other.strings] + [-1], np.int64)
        tmap = np.array([self._trace_ids.setdefault(t, len(self._trace_ids))
                         for t in other._trace_ids] + [-1], np.int64)
        for name, ojob in other.jobs.items():
            job = self._job(name)
            job.skipped.update(ojob.skipped)
            job.schema_versions |= ojob.schema_versions
            for (attempt, index, instance), op in ojob.processes.items():
                proc = self._proc(job, attempt, index, instance)
                for attr in ("host", "process_count", "schema_version", "pid",
                             "process_start_ns", "attempt_source", "index_source"):
                    if getattr(op, attr) is not None:
                        setattr(proc, attr, getattr(op, attr))
                proc.run.update(op.run)
                if len(op._buf):
                    d = np.frombuffer(op._buf, np.int64).reshape(-1, tl.NCOLS)
                    d[:, tl.C_SIDX] = smap[d[:, tl.C_SIDX]]
                    d[:, tl.C_TIDX] = tmap[d[:, tl.C_TIDX]]
                    proc._buf.extend(op._buf)  # memcpy; grows in place (mremap)
        self.skipped.update(other.skipped)
        for path, (lines, ok, bad) in other.file_stats.items():
            mine = self.file_stats.setdefault(path, [0, 0, None])
            mine[0] += lines
            mine[1] += ok
            mine[2] = mine[2] or bad
        self.unreadable.update(other.unreadable)
        job = self.jobs.get(last_job) if last_job else None
        # other's orphans came first in its range: they belong to the job before it
        (job.skipped if job else self._orphan_n).update(other._orphan_n)
        for reason, (path, line), why in other._orphans:
            where = (path, line + line_base)
            if job is not None:
                examples = self._examples.setdefault(job.name, [])
                if len(examples) < _MAX_EXAMPLES:
                    examples.append((*where, why))
            elif len(self._orphans) < _MAX_EXAMPLES:
                self._orphans.append((reason, where, why))
        for key, examples in other._examples.items():
            mine = self._examples.setdefault(key, [])
            for path, line, why in examples[: _MAX_EXAMPLES - len(mine)]:
                mine.append((path, line + line_base, why))

    def file_problems(self) -> list[tuple[str, str, str]]:
        """``(path, code, why)`` of each file that gave no OTLP request (sorted by path)."""
        out = [(p, "spool_file_skipped", why) for p, why in self.unreadable.items()]
        for path, (lines, ok, bad) in self.file_stats.items():
            if path in self.unreadable:
                continue
            if not lines:
                out.append((path, "empty_spool_file", "empty: no line written (a process "
                            "killed before its first write, or the file was truncated)"))
            elif not ok:
                out.append((path, "spool_file_skipped", "skipped: " + (
                    bad.split(": ", 1)[1] if bad else "no complete OTLP line in it")))
        return sorted(out)

    def finish(self) -> int:
        """Build each process's array, drop duplicate spans; returns the number of spans."""
        self.skipped.update(self._orphan_n)
        examples = self._examples.setdefault(None, [])
        for _reason, where, why in self._orphans[: _MAX_EXAMPLES - len(examples)]:
            examples.append((*where, why))
        total = 0
        for job in self.jobs.values():
            for proc in job.processes.values():
                data = np.frombuffer(proc._buf, np.int64).reshape(-1, tl.NCOLS)
                data, ndup = tl.drop_duplicates(data)
                if ndup:
                    where = (f"attempt {proc.attempt} process {proc.index}",)
                    self._skip(job, "duplicate", where, f"{ndup} duplicate span(s) (same "
                               "traceId and spanId) kept once", ndup)
                proc.data = data
                total += len(data)
        for key, examples in self._examples.items():
            text = [":".join(map(str, ex[:-1])) + ": " + ex[-1] for ex in examples]
            (self.jobs[key].examples if key is not None else self.examples).extend(text)
        return total


def _parsed_spans(line: bytes, ri: int, si: int) -> list:
    """The spans list of resource ``ri``, scope ``si`` of a line that gave one before."""
    rs = _loads(line)["resourceSpans"][ri]
    return (rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans"))[si]["spans"]


def _read_unit(unit: tuple[str, int, int | None]) -> _Reader:
    """Worker: read one line-aligned byte range of a file."""
    reader = _Reader()
    reader.read_range(*unit)
    return reader


def _units(files: list[Path]) -> list[tuple[str, int, int | None]]:
    """Split files into line-aligned byte ranges of about ``_UNIT_BYTES``."""
    units = []
    for p in files:
        size = p.stat().st_size
        if p.name.endswith(".gz"):  # compressed: read whole
            units.append((str(p), 0, None))
            continue
        cuts = [0]
        with open(p, "rb") as f:
            for b in range(_UNIT_BYTES, size, _UNIT_BYTES):
                if b > cuts[-1]:
                    f.seek(b)
                    f.readline()
                    if cuts[-1] < f.tell() < size:
                        cuts.append(f.tell())
        cuts.append(size)
        units += [(str(p), a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    return units


def _worker_count(requested: int | None, nbytes: int, nunits: int) -> int:
    if requested is not None:
        return max(1, min(requested, nunits))
    if nbytes < _PARALLEL_MIN_BYTES or not _CAN_FORK:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, _MAX_WORKERS, nunits))


def _read_parallel(files: list[Path], workers: int) -> _Reader:
    units = _units(files)
    reader, bases, last_jobs = _Reader(), {}, {}
    # fork: workers do not re-import the caller's __main__ (spawn would re-run unguarded
    # scripts), and they only parse JSON, taking no lock another thread might hold.
    ctx = multiprocessing.get_context("fork" if _CAN_FORK else None)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        for (path, _start, _end), part in zip(units, pool.map(_read_unit, units), strict=True):
            base = bases.get(path, 0)
            reader.merge(part, base, last_jobs.get(path))
            bases[path] = base + part.nlines
            last_jobs[path] = part.last_job or last_jobs.get(path)
    finally:  # on an error, do not wait for the units not started yet
        pool.shutdown(wait=True, cancel_futures=True)
    return reader


_GZ_RATIO = 10  # about how much a compacted segment's lines are bigger than its file


def span_files(root: Path) -> list[Path]:
    """The span files under ``root``, sorted: ``*.jsonl`` and ``*.jsonl.gz`` (not the
    ``metrics-*`` ones), without a ``X.jsonl`` whose compacted ``X.jsonl.gz`` is there."""
    found = [p for pattern in ("*.jsonl", "*.jsonl.gz") for p in root.rglob(pattern)
             if p.is_file() and not p.name.startswith(schema.METRICS_SPOOL_PREFIX)]
    names = {str(p) for p in found}
    return sorted(p for p in found if str(p) + ".gz" not in names)


def read_run_dir(path: str | os.PathLike, workers: int | None = None,
                 cache: bool | None = None) -> SpanSet:
    """Read every span file under ``path`` (:func:`span_files`: recursively, sorted by path).

    Args:
        path: the run directory.
        workers: worker processes for parsing; None = one per CPU (at most 4) when the
            files hold at least 64 MiB, else 1 (read in this process).
        cache: use the columnar cache beside the spool (:mod:`goodput_processor.cache`:
            read from it while the files are unchanged, write it for a quiet run); None =
            ``GOODPUT_REPORT_CACHE`` (on unless ``0``).

    Returns:
        A :class:`SpanSet` (jobs -> processes -> int64 span records, times in ns).

    Raises:
        RunDirError: ``path`` does not exist, is not a directory, cannot be read, holds
            no ``*.jsonl`` file, or its files hold no goodput span at all.
        SpoolFormatError: no file gave a goodput span and one of them is not OTLP JSON
            lines at all; the message is ``"<file>:<line>: not an OTLP JSON lines file:
            expected ..."``. (Next to readable files, such a file is skipped and listed in
            :attr:`SpanSet.file_problems`, like an empty or unreadable one: the report
            refuses only when nothing is readable.)
    """
    root = Path(path)
    if not root.exists():
        raise RunDirError(f"run directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise RunDirError(f"{str(root)!r} is not a directory (expected a run directory)")
    if not os.access(root, os.R_OK | os.X_OK):
        raise RunDirError(f"run directory {str(root)!r} is not readable")
    try:
        files = span_files(root)
        nbytes = sum(p.stat().st_size * (_GZ_RATIO if p.name.endswith(".gz") else 1)
                     for p in files)
    except OSError as e:
        raise RunDirError(f"cannot list run directory {str(root)!r}: {e.strerror or e}") from e
    if not files:
        raise RunDirError(f"run directory {str(root)!r} holds no *.jsonl span files")
    use_cache = _cache.enabled(cache)
    if use_cache:
        cached = _cache.load(root, files)
        if cached is not None:
            return cached
    n = _worker_count(workers, nbytes, max(len(files), nbytes // _UNIT_BYTES + 1))
    reader = None
    if n > 1:
        try:
            reader = _read_parallel(files, n)
        except (OSError, NotImplementedError, ImportError, RuntimeError):
            reader = None  # no worker processes here (e.g. a sandbox): read serially
    if reader is None:
        reader = _Reader()
        for p in files:
            reader.read_range(str(p))
    if reader.finish() == 0:
        bad = [st[2] for _, st in sorted(reader.file_stats.items()) if st[2] and not st[1]]
        if bad:
            raise SpoolFormatError(bad[0])
        counts = Counter(reader.skipped)
        for job in reader.jobs.values():
            counts.update(job.skipped)
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        raise RunDirError(f"run directory {str(root)!r} holds no goodput spans ({len(files)} "
                          f"file(s) read{'; skipped ' + detail if detail else ''})")
    spans = SpanSet(str(root), reader.jobs, reader.skipped, reader.examples, reader.strings,
                    len(files), reader.file_problems())
    if use_cache:
        _cache.save(root, files, spans)
    return spans
