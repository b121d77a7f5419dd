"""Read a run directory of OTLP JSON lines spool files into compact per-process columns.

The training side writes ``RUN_DIR/spans-p<index>-a<attempt>-<pid>-<id>.jsonl`` files, one OTLP JSON
``ExportTraceServiceRequest`` per line (see ``docs/span-schema.md``), and compacts closed
segments of them into ``*.jsonl.gz`` files (gzip-compressed OTLP JSON lines). :func:`read_run_dir`
streams every ``*.jsonl`` and ``*.jsonl.gz`` file under the directory (recursively, in sorted
order; not the ``metrics-*.jsonl`` files of :mod:`goodput.diagnostics`, and not a ``X.jsonl``
next to its compacted ``X.jsonl.gz``) line by line and keeps, per
(job, attempt, process index), one ``int64`` record per span
(:data:`~goodput_processor.read.rows.COLUMNS`): a million spans take about 70 MB and no
parsed JSON is retained. On Linux, inputs of 64 MiB or more are split at line boundaries
and parsed by forked worker processes (one per CPU, at most 4); the result is identical to
reading serially.

Most of a spool is read by fast paths that give exactly what reading span by span gives
(``tests/read/test_reader_fast.py``): a compacted segment is decompressed in one call
(:mod:`~goodput_processor.read.spool_io`), the recorder's step and phase spans are read from the
line's text with numpy (:mod:`~goodput_processor.read.template`), the other spans of a
process are made rows a batch at a time (:mod:`~goodput_processor.read.fast`), and only
input that is not clean is read span by span (:mod:`~goodput_processor.read.spans`).

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

import os
import zlib
from array import array
from collections import Counter
from pathlib import Path

import numpy as np

from goodput import schema

from . import cache as _cache
from . import fast as read_fast
from . import parallel as rp
from . import progress
from . import rows as tl
from . import spool_io as read_io
from . import tail as read_tail
from .resources import _SUPPORTED_MAJOR, ResourceRows
from .rows import JobSpans, SpanSet
from .spans import (  # noqa: F401 - goodput serve reads these as reader.X
    _I64_MAX,
    _KIND_ATTRS,
    _KIND_CODES,
    _U64,
    SCAN_POLICY,
    STRUCTURE,
    SpanRows,
    _as_int,
    _attr_value,
    _dumps,
    _loads,
    _loads_exact,
    flag_bit,
    job_name,
    json_resource_attrs,
)

__all__ = ["ReadError", "RunDirError", "SpoolFormatError", "read_run_dir"]

_MAX_EXAMPLES = 20
_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip strips


class ReadError(Exception):
    """Base class of the errors :func:`read_run_dir` raises; ``str(err)`` is one line."""


class RunDirError(ReadError):
    """The run directory is missing, not a directory, unreadable, or holds no spans."""


class SpoolFormatError(ReadError):
    """No file gave a span and a ``*.jsonl`` file is not OTLP JSON lines; the message names
    the file and line."""


class _Reader(ResourceRows, SpanRows):
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
        # The resource of the last line read (see _resource): (its text, what it gave, the
        # parsed object).
        self._last_resource: tuple = (None, None, None)
        self._fast = read_fast.Batch(_KIND_CODES, _KIND_ATTRS, _attr_value, _as_int, flag_bit)
        # While read_range reads: the names of the jobs the range's lines named (each
        # job's run_dirs gets the file's directory); None otherwise.
        self._range_jobs: set[str] | None = None
        # Per job name: (the job, its number of processes when last in step, {(attempt,
        # service.instance.id): process}) (see _proc).
        self._instances: dict[str, tuple] = {}

    def _skip(self, job: JobSpans | None, reason: str, where, why: str, n: int = 1):
        self._flush()
        (job.skipped if job else self.skipped)[reason] += n
        examples = self._examples.setdefault(job.name if job else None, [])
        if len(examples) < _MAX_EXAMPLES:
            examples.append((*where, why))

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
        self._last_resource = (None, None, None)
        self._range_jobs = set()
        rest, parsed = None, None  # the rest of the last line with spans taken, parsed
        try:
            with read_io.open_spool(path) as f:
                f.seek(start)
                for lineno, line, pre in self._lines(f, left):
                    if line[0] in _WHITESPACE and not line.strip():  # strip copies
                        continue
                    stats[0] += 1
                    where = (path, lineno)
                    try:
                        if pre is not None and pre[0] == rest:  # as the last line's rest
                            req, exact = parsed  # (a journal's lines): parsed once, not changed
                        elif pre is not None:  # spans taken from the text: parse the rest
                            try:
                                req, exact = parsed = _loads_exact(pre[0])
                                rest = pre[0]
                            except (ValueError, RecursionError):  # as the whole line says
                                pre = None
                                req, exact = _loads_exact(line)
                        else:
                            req, exact = _loads_exact(line)
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
                        last_job = self._request(req, where, line, pre and pre[1],
                                                 exact) or last_job
                    except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
                        self._skip_line(last_job, "malformed", where, f"bad OTLP structure ({e!r})")
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            self.unreadable[path] = f"cannot read it: {getattr(e, 'strerror', None) or e}"
        finally:
            self._flush()
            self._batch = None
            run_dir = str(Path(path).parent)
            for name in self._range_jobs:
                self.jobs[name].run_dirs.add(run_dir)
            self._range_jobs = None
        self.last_job = last_job.name if last_job else None

    def read_tail(self, path: str) -> int:
        """Read the records of the spool tail ``path`` that its journal lacks, if its writer
        is gone (:func:`~goodput_processor.read.tail.tail_lines`): the same rows as the
        journal would have given. Returns the number of lines read."""
        lines = read_tail.tail_lines(path) or ()
        self._last_resource = (None, None, None)
        for i, line in enumerate(lines, 1):
            where = (path, i)
            try:
                req, exact = _loads_exact(line)
                self._request(req, where, line, None, exact)
            except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
                self._skip_line(None, "malformed", where, f"bad spool tail ({e!r})")
        self._flush()
        return len(lines)

    def _skip_line(self, job: JobSpans | None, reason: str, where, why: str) -> None:
        """Skip a line; before the first job of the range is known, keep it for later."""
        self._flush()
        if job is None:
            self._orphan_n[reason] += 1
            if len(self._orphans) < _MAX_EXAMPLES:
                self._orphans.append((reason, where, why))
        else:
            self._skip(job, reason, where, why)

    def _request(self, req: dict, where, line: bytes | None = None,
                 taken=None, exact: bool = False) -> JobSpans | None:
        """Read one OTLP request (``line``: the JSON line it was parsed from, if any;
        ``taken``: spans taken from its first spans list by :func:`read_template.scan`,
        before the ones ``req`` holds; ``exact``: see :meth:`_resource`)."""
        job = None
        for ri, rs in enumerate(req["resourceSpans"] or ()):
            job, proc, ok, version = self._resource(rs, exact)
            if self._range_jobs is not None:
                self._range_jobs.add(job.name)
            scopes = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ()
            for si, ss in enumerate(scopes):
                first = taken if ri == 0 and si == 0 else None
                # with spans taken, the list left may be empty: a list still
                spans = ss.get("spans") or ([] if first is not None else ())
                scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name")
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

    def row_bytes(self) -> int:
        """Bytes of the rows read so far (every process's buffer)."""
        return sum(len(p._buf) * p._buf.itemsize
                   for job in self.jobs.values() for p in job.processes.values())

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
            job.run_dirs |= ojob.run_dirs
            for (attempt, index, instance), op in ojob.processes.items():
                proc = self._proc(job, attempt, index, instance)
                for attr in ("host", "process_count", "schema_version", "pid",
                             "process_start_ns", "attempt_source", "index_source"):
                    if getattr(op, attr) is not None:
                        setattr(proc, attr, getattr(op, attr))
                proc.run.update(op.run)
                if len(op._buf):
                    d = np.frombuffer(op._buf, np.int64).reshape(-1, tl.NCOLS)
                    if other.strings:  # else every sidx is -1
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
                if ndup:  # the rows are a copy: the buffer goes
                    proc._buf = array("q")
                    where = (f"attempt {proc.attempt} process {proc.index}",)
                    self._skip(job, "duplicate", where, f"{ndup} duplicate span(s) (same "
                               "traceId and spanId) kept once", ndup)
                proc.data = data
                total += len(data)
        for key, examples in self._examples.items():
            text = [":".join(map(str, ex[:-1])) + ": " + ex[-1] for ex in examples]
            (self.jobs[key].examples if key is not None else self.examples).extend(text)
        return total


_GZ_RATIO = 10  # about how much a compacted segment's lines are bigger than its file


def span_files(root: Path) -> list[Path]:
    """The span files under ``root``, sorted: ``*.jsonl`` and ``*.jsonl.gz`` (not the
    ``metrics-*`` ones), without a ``X.jsonl`` whose compacted ``X.jsonl.gz`` is there."""
    found = [p for pattern in ("*.jsonl", "*.jsonl.gz") for p in root.rglob(pattern)
             if p.is_file() and not p.name.startswith(schema.METRICS_SPOOL_PREFIX)]
    names = {str(p) for p in found}
    return sorted(p for p in found if str(p) + ".gz" not in names)


def tail_files(root: Path) -> list[Path]:
    """The spool tails under ``root`` (``*.tail``, :mod:`~goodput_processor.read.tail`),
    sorted: read after the span files; part of what says whether a run changed."""
    return sorted(p for p in root.rglob("*" + schema.TAIL_SUFFIX) if p.is_file())


def read_run_dir(path: str | os.PathLike, workers: int | None = None,
                 cache: bool | None = None) -> SpanSet:
    """Read every span file under ``path`` (:func:`span_files`: recursively, sorted by path),
    then the spool tails of processes that are gone (:meth:`_Reader.read_tail`).

    Args:
        path: the run directory.
        workers: worker processes for parsing; None = one per CPU (at most 4) when the
            files hold at least 64 MiB, else 1 (read in this process).
        cache: use the columnar cache beside the spool (:mod:`goodput_processor.read.cache`:
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
    read_tail.drop_unfinished(root)  # a killed writer's unfinished .gz.tmp (never read)
    try:
        files = span_files(root)
        nbytes = sum(p.stat().st_size * (_GZ_RATIO if p.name.endswith(".gz") else 1)
                     for p in files)
    except OSError as e:
        raise RunDirError(f"cannot list run directory {str(root)!r}: {e.strerror or e}") from e
    from .foreign import foreign_files

    foreign = foreign_files(root, files)
    if foreign:
        return _read_with_foreign(root, files, foreign, cache)
    if not files:
        raise RunDirError(f"run directory {str(root)!r} holds no *.jsonl span files")
    try:
        tails = tail_files(root)
    except OSError:
        tails = []
    use_cache = _cache.enabled(cache)
    if use_cache:
        cached = _cache.load(root, files + tails)
        if cached is not None:
            return cached
    SCAN_POLICY.reset()  # (before the workers fork: each starts from it)
    n = rp.worker_count(workers, nbytes, max(len(files), nbytes // rp.UNIT_BYTES + 1))
    tick = progress.ticker(files)  # (None: nobody watches)
    reader = None
    if n > 1:
        try:
            reader = rp.read_parallel(files, n, _Reader, tick)
        except (OSError, NotImplementedError, ImportError, RuntimeError):
            reader = None  # no worker processes here (e.g. a sandbox): read serially
    if reader is None:
        reader = _Reader()
        for p in files:
            reader.read_range(str(p))
            if tick is not None:
                tick(p)
    for p in tails:  # after the journals: what they lack
        reader.read_tail(str(p))
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
        _cache.save(root, files + tails, spans)
    return spans



def _read_with_foreign(root: Path, files: list[Path], foreign: dict,
                       cache: bool | None) -> SpanSet:
    """:func:`read_run_dir` of a directory holding another tool's OTLP JSON (``foreign``:
    ``{source name: [paths]}``, :func:`.read_foreign.foreign_files`): the directory's own
    spool files, then each source's files translated (:func:`.read_foreign.translate_into`);
    the columnar cache (``cache``, as :func:`read_run_dir`'s) keeps what a quiet directory
    gave, so the next report reads that instead of translating again."""
    from .foreign import translate_into

    taken = {str(p) for ps in foreign.values() for p in ps}
    own = [p for p in files if str(p) not in taken]
    every = sorted([*own, *(p for ps in foreign.values() for p in ps)])
    use_cache = _cache.enabled(cache)
    if use_cache:
        cached = _cache.load(root, every)
        if cached is not None:
            return cached
    reader = _Reader()
    for p in own:
        reader.read_range(str(p))
    translate_into(reader, root, foreign)
    if reader.finish() == 0:
        raise RunDirError(f"run directory {str(root)!r} holds no goodput spans: the "
                          f"files of {', '.join(sorted(foreign))} gave none")
    spans = SpanSet(str(root), reader.jobs, reader.skipped, reader.examples,
                    reader.strings, len(own) + len(taken), reader.file_problems())
    if use_cache:
        _cache.save(root, every, spans)
    return spans
