"""Read a run directory of OTLP JSON lines spool files into compact per-process columns.

The training side writes ``RUN_DIR/spans-p<index>-a<attempt>.jsonl`` files, one OTLP JSON
``ExportTraceServiceRequest`` per line (see ``docs/span-schema.md``). :func:`read_run_dir`
streams every ``*.jsonl`` file under the directory (recursively, in sorted order) line by
line and keeps, per (job, attempt, process index), one ``int64`` record per span
(:data:`COLUMNS`), so a million spans take about 70 MB and no parsed JSON is retained.

Nothing is dropped silently: every skipped line or span is counted by reason in
:attr:`JobSpans.skipped` (or :attr:`SpanSet.skipped` when it cannot be tied to a job):

- ``torn``: last line of a file with no trailing newline that is not valid JSON (a crash
  mid-write); counted in lines.
- ``malformed``: a later line that is not valid JSON or not an OTLP request; in lines.
- ``invalid_span``: a span without valid name/times/ids, or ending before it starts.
- ``duplicate``: a span whose (traceId, spanId) was already read for the same process.
- ``unknown``: a span of another instrumentation scope or with a name not in the schema.
- ``unsupported_schema``: a span of a resource whose ``goodput.schema.version`` major
  number this processor does not know.
"""

from __future__ import annotations

import json
import os
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from goodput import schema

try:  # optional speed-up, never a dependency
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

__all__ = [
    "COLUMNS",
    "KIND_NAMES",
    "NONE",
    "JobSpans",
    "ProcessSpans",
    "ReadError",
    "RunDirError",
    "SpanSet",
    "SpoolFormatError",
    "read_run_dir",
]

#: Span kind codes (column ``kind``), indexes into :data:`KIND_NAMES`.
KIND_NAMES = (
    schema.JOB_START,
    schema.JOB_END,
    schema.HEARTBEAT,
    schema.ACCELERATOR_INIT,
    schema.TRAINING_PREP,
    schema.PROGRAM_STARTUP,
    schema.DATA_LOADING,
    schema.STEP,
    schema.CHECKPOINT_SAVE,
    schema.CHECKPOINT_RESTORE,
    schema.CUSTOM_BADPUT,
)
(
    K_JOB_START,
    K_JOB_END,
    K_HEARTBEAT,
    K_ACCELERATOR_INIT,
    K_TRAINING_PREP,
    K_PROGRAM_STARTUP,
    K_DATA_LOADING,
    K_STEP,
    K_CHECKPOINT_SAVE,
    K_CHECKPOINT_RESTORE,
    K_CUSTOM_BADPUT,
) = range(len(KIND_NAMES))
_KIND_CODES = {name: code for code, name in enumerate(KIND_NAMES)}

#: Columns of a span record, all int64. ``start``/``end``: ns since the Unix epoch.
#: ``ival``: ``goodput.step`` (step), ``goodput.checkpoint.step`` (save, restore),
#: ``goodput.heartbeat.interval_ms`` (job_start), ``goodput.recorder.errors`` (job_end,
#: heartbeat). ``aux``: ``goodput.recorder.dropped`` (job_end, heartbeat). ``flags``: bit 0
#: set = ``goodput.blocking`` false, bit 1 set = status ERROR. ``sidx``: index into
#: :attr:`SpanSet.strings` of ``goodput.badput.type`` (custom) or ``goodput.end.reason``
#: (job_end). ``tidx``: index of the trace id. ``sid``: the 64-bit span id (as signed).
#: Absent integer attributes are :data:`NONE`.
COLUMNS = ("start", "end", "kind", "ival", "aux", "flags", "sidx", "tidx", "sid")
C_START, C_END, C_KIND, C_IVAL, C_AUX, C_FLAGS, C_SIDX, C_TIDX, C_SID = range(len(COLUMNS))
NCOLS = len(COLUMNS)
#: Sentinel for an absent integer attribute.
NONE = -(2**63)
F_NONBLOCKING = 1
F_ERROR = 2

# Per kind: attribute key -> slot (0 = ival, 1 = aux, 2 = string, 3 = blocking flag).
_BLOCKING = {schema.ATTR_BLOCKING: 3}
_RECORDER = {schema.ATTR_RECORDER_ERRORS: 0, schema.ATTR_RECORDER_DROPPED: 1}
_KIND_ATTRS: tuple[dict[str, int], ...] = (
    {schema.ATTR_HEARTBEAT_INTERVAL_MS: 0},
    {**_RECORDER, schema.ATTR_END_REASON: 2},
    _RECORDER,
    _BLOCKING,
    _BLOCKING,
    _BLOCKING,
    _BLOCKING,
    {schema.ATTR_STEP: 0, **_BLOCKING},
    {schema.ATTR_CHECKPOINT_STEP: 0, **_BLOCKING},
    {schema.ATTR_CHECKPOINT_STEP: 0, **_BLOCKING},
    {schema.ATTR_BADPUT_TYPE: 2, **_BLOCKING},
)
_MAX_EXAMPLES = 20
_SUPPORTED_MAJOR = schema.SCHEMA_VERSION.split(".")[0]
_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1


class ReadError(Exception):
    """Base class of the errors :func:`read_run_dir` raises; ``str(err)`` is one line."""


class RunDirError(ReadError):
    """The run directory is missing, not a directory, unreadable, or holds no spans."""


class SpoolFormatError(ReadError):
    """A ``*.jsonl`` file is not OTLP JSON lines; the message names the file and line."""


@dataclass
class ProcessSpans:
    """Spans of one process in one attempt of a job.

    ``data`` is an ``(n, len(COLUMNS))`` int64 array (see :data:`COLUMNS`), deduplicated,
    in file order (not sorted). ``host``/``process_count`` come from the resource.
    """

    job: str
    attempt: int
    index: int
    host: str | None = None
    process_count: int | None = None
    schema_version: str | None = None
    data: np.ndarray = field(default_factory=lambda: np.empty((0, NCOLS), np.int64))
    _buf: array = field(default_factory=lambda: array("q"), repr=False)


@dataclass
class JobSpans:
    """All spans of one job: ``processes[(attempt, process_index)] -> ProcessSpans``.

    ``skipped`` counts skipped records by reason (see the module docstring);
    ``examples`` holds up to 20 ``"path:line: reason"`` strings; ``strings`` is the shared
    string table that column ``sidx`` indexes.
    """

    name: str
    processes: dict[tuple[int, int], ProcessSpans] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    schema_versions: set[str] = field(default_factory=set)


@dataclass
class SpanSet:
    """Everything read from a run directory.

    ``jobs`` maps job name to :class:`JobSpans`; ``skipped``/``examples`` hold what could
    not be tied to any job; ``files`` is the number of files read.
    """

    path: str
    jobs: dict[str, JobSpans]
    skipped: Counter
    examples: list[str]
    strings: list[str]
    files: int


def _attr_value(value):
    """Python value of an OTLP ``AnyValue`` dict (int64 may be a JSON string or number)."""
    if "intValue" in value:
        return int(value["intValue"])
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    return None


def _as_int(v) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError("not a finite number")
        return int(v)
    r = int(v)
    if not NONE < r <= _I64_MAX:
        raise ValueError("out of int64 range")
    return r


def _as_bool(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() not in ("false", "0", "")
    return bool(v)


class _Reader:
    def __init__(self) -> None:
        self.jobs: dict[str, JobSpans] = {}
        self.skipped: Counter = Counter()
        self.examples: list[str] = []
        self.strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self._trace_ids: dict[str, int] = {}
        self.total_spans = 0

    def _skip(self, job: JobSpans | None, reason: str, where: str, why: str, n: int = 1):
        counter, examples = (job.skipped, job.examples) if job else (self.skipped, self.examples)
        counter[reason] += n
        if len(examples) < _MAX_EXAMPLES:
            examples.append(f"{where}: {why}")

    def _sid(self, s: str) -> int:
        i = self._string_ids.get(s)
        if i is None:
            i = self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return i

    def read_file(self, path: Path) -> None:
        try:
            f = open(path, "rb")  # noqa: SIM115
        except OSError as e:
            raise RunDirError(f"cannot read {path}: {e.strerror or e}") from e
        first = True
        last_job: JobSpans | None = None
        with f:
            try:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        req = _loads(line)
                    except (ValueError, RecursionError) as e:
                        if not line.endswith(b"\n") and (
                            not first or (line.lstrip().startswith(b"{") and b'"resourceSpans"' in line)
                        ):
                            self._skip(last_job, "torn", where, "incomplete last line (torn write)")
                        elif first:
                            raise SpoolFormatError(
                                f"{where}: not an OTLP JSON lines file: expected a JSON object "
                                f'with "resourceSpans" (OTLP ExportTraceServiceRequest), got '
                                f"invalid JSON ({e})"
                            ) from None
                        else:
                            self._skip(last_job, "malformed", where, f"invalid JSON ({e})")
                        first = False
                        continue
                    if not isinstance(req, dict) or "resourceSpans" not in req:
                        msg = 'expected a JSON object with "resourceSpans" (OTLP request)'
                        if first:
                            raise SpoolFormatError(
                                f"{where}: not an OTLP JSON lines file: {msg}, got "
                                f"{type(req).__name__}"
                                + (f" with keys {sorted(req)[:5]}" if isinstance(req, dict) else "")
                            )
                        self._skip(last_job, "malformed", where, msg)
                        continue
                    first = False
                    try:
                        last_job = self._request(req, where) or last_job
                    except (TypeError, AttributeError, KeyError, ValueError) as e:
                        self._skip(last_job, "malformed", where, f"bad OTLP structure ({e!r})")
            except OSError as e:
                raise RunDirError(f"cannot read {path}: {e.strerror or e}") from e

    def _resource(self, rs: dict, where: str):
        attrs = {}
        for a in (rs.get("resource") or {}).get("attributes") or ():
            try:
                attrs[a["key"]] = _attr_value(a.get("value") or {})
            except (TypeError, KeyError, ValueError):
                continue
        name = attrs.get(schema.RES_JOB_NAME) or attrs.get(schema.RES_SERVICE_NAME)
        name = str(name) if name not in (None, "") else "unknown_job"
        try:
            attempt = _as_int(attrs.get(schema.RES_ATTEMPT, 0))
            index = _as_int(attrs.get(schema.RES_PROCESS_INDEX, 0))
        except (TypeError, ValueError):
            attempt, index = 0, 0
        job = self.jobs.get(name)
        if job is None:
            job = self.jobs[name] = JobSpans(name=name, strings=self.strings)
        proc = job.processes.get((attempt, index))
        if proc is None:
            proc = job.processes[(attempt, index)] = ProcessSpans(name, attempt, index)
        host = attrs.get(schema.RES_HOST_NAME)
        if host is not None:
            proc.host = str(host)
        count = attrs.get(schema.RES_PROCESS_COUNT)
        if isinstance(count, int):
            proc.process_count = count
        version = attrs.get(schema.RES_SCHEMA_VERSION)
        version = None if version is None else str(version)
        proc.schema_version = version
        ok = version is None or version.split(".")[0] == _SUPPORTED_MAJOR
        if version is not None and ok:
            job.schema_versions.add(version)
        return job, proc, ok, version

    def _request(self, req: dict, where: str) -> JobSpans | None:
        job = None
        for rs in req["resourceSpans"] or ():
            job, proc, ok, version = self._resource(rs, where)
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
                spans = ss.get("spans") or ()
                scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name")
                if not spans:
                    continue
                if scope != schema.SCOPE_NAME:
                    job.skipped["unknown"] += len(spans)
                elif not ok:
                    self._skip(
                        job, "unsupported_schema", where,
                        f"schema version {version!r} not supported (this processor reads "
                        f"{schema.SCHEMA_VERSION}.x)", len(spans),
                    )
                else:
                    self._spans(spans, job, proc, where)
        return job

    def _spans(self, spans: list, job: JobSpans, proc: ProcessSpans, where: str) -> None:
        extend = proc._buf.extend
        kind_codes, kind_attrs, trace_ids = _KIND_CODES, _KIND_ATTRS, self._trace_ids
        unknown = 0
        last_tid, tidx = None, -1
        for sp in spans:
            kind = kind_codes.get(sp.get("name"))
            if kind is None:
                unknown += 1
                continue
            try:
                start = int(sp["startTimeUnixNano"])
                end = int(sp["endTimeUnixNano"])
                sid = int(sp["spanId"], 16)
                tid = sp["traceId"]
                if end < start or start < 0 or end > _I64_MAX or sid >= _U64:
                    raise ValueError("end before start or out of range")
                if tid != last_tid:
                    tidx = trace_ids.get(tid)
                    if tidx is None:
                        tidx = trace_ids[tid] = len(trace_ids)
                    last_tid = tid
                ival = aux = NONE
                flags = 0
                sidx = -1
                attrs = sp.get("attributes")
                if attrs:
                    wanted = kind_attrs[kind]
                    for a in attrs:
                        slot = wanted.get(a["key"])
                        if slot is None:
                            continue
                        v = _attr_value(a["value"])
                        if v is None:
                            continue
                        if slot == 0:
                            ival = _as_int(v)
                        elif slot == 1:
                            aux = _as_int(v)
                        elif slot == 2:
                            sidx = self._sid(str(v))
                        elif not _as_bool(v):
                            flags |= F_NONBLOCKING
                status = sp.get("status")
                if status:
                    code = status.get("code")
                    if code == 2 or code == "STATUS_CODE_ERROR":
                        flags |= F_ERROR
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                self._skip(job, "invalid_span", where, f"invalid {sp.get('name')} span ({e!r})")
                continue
            if sid > _I64_MAX:
                sid -= _U64
            extend((start, end, kind, ival, aux, flags, sidx, tidx, sid))
        if unknown:
            job.skipped["unknown"] += unknown

    def finish(self) -> None:
        """Turn the buffers into arrays and drop duplicate (traceId, spanId) spans."""
        for job in self.jobs.values():
            for proc in job.processes.values():
                data = np.frombuffer(proc._buf, dtype=np.int64).reshape(-1, NCOLS)
                if len(data) > 1:
                    tidx, sid = data[:, C_TIDX], data[:, C_SID]
                    if tidx.min() == tidx.max():
                        order = np.argsort(sid, kind="stable")
                        dup = sid[order][1:] == sid[order][:-1]
                    else:
                        order = np.lexsort((sid, tidx))
                        dup = (sid[order][1:] == sid[order][:-1]) & (
                            tidx[order][1:] == tidx[order][:-1]
                        )
                    ndup = int(dup.sum())
                    if ndup:
                        keep = np.ones(len(data), bool)
                        keep[order[1:][dup]] = False  # stable order keeps the first read
                        data = data[keep]
                        job.skipped["duplicate"] += ndup
                        if len(job.examples) < _MAX_EXAMPLES:
                            job.examples.append(
                                f"attempt {proc.attempt} process {proc.index}: {ndup} duplicate "
                                "span(s) (same traceId and spanId) kept once"
                            )
                proc.data = data
                self.total_spans += len(data)


def read_run_dir(path: str | os.PathLike) -> SpanSet:
    """Read every ``*.jsonl`` file under ``path`` (recursively, sorted by path).

    Returns a :class:`SpanSet` (jobs -> processes -> int64 span records, times in ns).

    Raises:
        RunDirError: ``path`` does not exist, is not a directory, cannot be read, holds
            no ``*.jsonl`` file, or its files hold no goodput span at all.
        SpoolFormatError: a file's first non-empty line is not an OTLP JSON request; the
            message is ``"<file>:<line>: not an OTLP JSON lines file: expected ..."``.
    """
    root = Path(path)
    if not root.exists():
        raise RunDirError(f"run directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise RunDirError(f"{str(root)!r} is not a directory (expected a run directory)")
    if not os.access(root, os.R_OK | os.X_OK):
        raise RunDirError(f"run directory {str(root)!r} is not readable")
    try:
        files = sorted(p for p in root.rglob("*.jsonl") if p.is_file())
    except OSError as e:
        raise RunDirError(f"cannot list run directory {str(root)!r}: {e.strerror or e}") from e
    if not files:
        raise RunDirError(f"run directory {str(root)!r} holds no *.jsonl span files")
    reader = _Reader()
    for p in files:
        reader.read_file(p)
    reader.finish()
    if reader.total_spans == 0:
        counts = Counter(reader.skipped)
        for job in reader.jobs.values():
            counts.update(job.skipped)
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        raise RunDirError(
            f"run directory {str(root)!r} holds no goodput spans ({len(files)} file(s) read"
            + (f"; skipped {detail}" if detail else "")
            + ")"
        )
    return SpanSet(
        path=str(root),
        jobs=reader.jobs,
        skipped=reader.skipped,
        examples=reader.examples,
        strings=reader.strings,
        files=len(files),
    )
