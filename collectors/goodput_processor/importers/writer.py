"""Write imported spans as spool files, in the format the training side writes.

A :class:`SpanTable` holds one job's spans as ``int64`` columns (:data:`COLUMNS`); a
:class:`SpanWriter` writes it as OTLP/JSON lines (one ``ExportTraceServiceRequest`` of up to
``spans_per_line`` spans per line; ``traceId``/``spanId`` lowercase hex, 64-bit integers
as decimal strings, scope ``goodput``), one file per (attempt, process):
``RUN_DIR/<job dir>/spans-p<index:05d>-a<attempt:04d>.jsonl``, where ``<job dir>`` is the
last part of :func:`goodput.schema.default_run_dir`. The same input gives byte-identical
files: the trace id is a hash of (job, attempt, process) and span ids count 1, 2, ... in
the order of span start (then end) times.

Files are written under a temporary name (``*.jsonl.tmp``, which the reader ignores) and
renamed when every file of the job is complete, so an interrupted import never leaves a
half file that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goodput import schema

from .common import OutputExistsError

__all__ = ["COLUMNS", "KINDS", "NONE", "SpanTable", "SpanWriter", "WrittenJob", "job_dir_name"]

#: Span kinds a table holds (its ``kind`` column indexes this tuple).
KINDS = (schema.JOB_START, schema.JOB_END, schema.ACCELERATOR_INIT, schema.TRAINING_PREP,
         schema.DATA_LOADING, schema.STEP, schema.CHECKPOINT_SAVE, schema.CHECKPOINT_RESTORE,
         schema.CUSTOM_BADPUT, schema.ELASTIC_WAIT, schema.ELASTIC_REINIT, schema.ELASTIC_SLICES)
(K_JOB_START, K_JOB_END, K_ACCELERATOR_INIT, K_TRAINING_PREP, K_DATA_LOADING, K_STEP,
 K_CHECKPOINT_SAVE, K_CHECKPOINT_RESTORE, K_CUSTOM_BADPUT, K_ELASTIC_WAIT, K_ELASTIC_REINIT,
 K_ELASTIC_SLICES) = range(len(KINDS))
#: Columns of a span row. ``start``/``end``: ns since the Unix epoch. ``ival``: step
#: (step spans), checkpoint step (save, restore) or stepping slices (elastic_slices).
#: ``aux``: ``goodput.step.count`` (step) or total slices (elastic_slices).
#: ``sidx``: index into :attr:`SpanTable.strings` of the badput type (custom badput), the
#: event type (elastic_wait), the end reason (job_end) or the decimal text of the available
#: slices (elastic_slices, written as an int attribute), -1 = none.
COLUMNS = ("attempt", "process", "kind", "start", "end", "ival", "aux", "sidx")
NCOLS = len(COLUMNS)
C_ATTEMPT, C_PROCESS, C_KIND, C_START, C_END, C_IVAL, C_AUX, C_SIDX = range(NCOLS)
#: Absent integer attribute.
NONE = -(2**63)
_TMP_SUFFIX = ".tmp"


def job_dir_name(job: str) -> str:
    """Directory name of ``job`` under the run directory (unsafe characters -> ``_``)."""
    return os.path.basename(schema.default_run_dir(job))


class SpanTable:
    """One job's spans as rows of ``int64`` columns (:data:`COLUMNS`), in any order."""

    def __init__(self) -> None:
        self._buf = array("q")
        self._blocks: list[np.ndarray] = []
        self.strings: list[str] = []
        self._string_ids: dict[str, int] = {}

    def string(self, text: str) -> int:
        """Index of ``text`` in :attr:`strings` (added if new)."""
        i = self._string_ids.get(text)
        if i is None:
            i = self._string_ids[text] = len(self.strings)
            self.strings.append(text)
        return i

    def add(self, attempt: int, process: int, kind: int, start_ns: int, end_ns: int,
            ival: int = NONE, aux: int = NONE, sidx: int = -1) -> None:
        """Add one span (times in ns since the epoch; ``end_ns >= start_ns``)."""
        self._buf.extend((attempt, process, kind, start_ns, end_ns, ival, aux, sidx))

    def add_many(self, attempt, process, kind: int, starts, ends, ival=NONE, aux=NONE,
                 sidx=-1) -> None:
        """Add spans of one kind from arrays (scalars broadcast)."""
        starts = np.asarray(starts, np.int64)
        if not len(starts):
            return
        block = np.empty((len(starts), NCOLS), np.int64)
        for col, value in ((C_ATTEMPT, attempt), (C_PROCESS, process), (C_KIND, kind),
                           (C_START, starts), (C_END, ends), (C_IVAL, ival), (C_AUX, aux),
                           (C_SIDX, sidx)):
            block[:, col] = value
        self._blocks.append(block)

    def sorted_rows(self, release: bool = False) -> np.ndarray:
        """The rows ordered by (attempt, process, start, end, order added).

        ``release``: empty the table meanwhile, so that only one copy is alive at a time.
        """
        parts = [np.frombuffer(self._buf, np.int64).reshape(-1, NCOLS), *self._blocks]
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        order = np.lexsort((np.arange(len(rows)), rows[:, C_END], rows[:, C_START],
                            rows[:, C_PROCESS], rows[:, C_ATTEMPT]))
        del parts
        out = rows[order]
        if release:
            del rows
            self._buf, self._blocks = array("q"), []
        return out

    def __len__(self) -> int:
        return len(self._buf) // NCOLS + sum(len(b) for b in self._blocks)


@dataclass(frozen=True)
class WrittenJob:
    """What :meth:`SpanWriter.write_job` wrote for one job."""

    run_dir: str
    attempts: int
    processes: int
    spans: int
    files: int


def _kv(key: str, value) -> str:
    if isinstance(value, bool):
        v = '{"boolValue":' + ("true" if value else "false") + "}"
    elif isinstance(value, int):
        v = f'{{"intValue":"{value:d}"}}'
    else:
        v = '{"stringValue":' + json.dumps(str(value)) + "}"
    return '{"key":' + json.dumps(key) + ',"value":' + v + "}"


def _templates() -> list[str]:
    """%-templates of one span, indexed by ``kind * 8 + has_ival * 4 + has_aux * 2 +
    has_string``; arguments: ``(trace, span id, start, end, ival, aux, json string)``
    (unused ones are consumed by ``%.0s``, which prints nothing)."""

    def kv(key: str, value: str) -> str:
        return '{"key":' + json.dumps(key) + ',"value":' + value + "}"

    ival_kv = {K_STEP: kv(schema.ATTR_STEP, '{"intValue":"%d"}'),
               K_CHECKPOINT_SAVE: kv(schema.ATTR_CHECKPOINT_STEP, '{"intValue":"%d"}'),
               K_CHECKPOINT_RESTORE: kv(schema.ATTR_CHECKPOINT_STEP, '{"intValue":"%d"}'),
               K_ELASTIC_SLICES: kv(schema.ATTR_SLICES_ACTIVE, '{"intValue":"%d"}')}
    aux_kv = {K_STEP: kv(schema.ATTR_STEP_COUNT, '{"intValue":"%d"}'),
              K_ELASTIC_SLICES: kv(schema.ATTR_SLICES_TOTAL, '{"intValue":"%d"}')}
    str_kv = {K_CUSTOM_BADPUT: kv(schema.ATTR_BADPUT_TYPE, '{"stringValue":%s}'),
              K_JOB_END: kv(schema.ATTR_END_REASON, '{"stringValue":%s}'),
              K_ELASTIC_WAIT: kv(schema.ATTR_ELASTIC_EVENT_TYPE, '{"stringValue":%s}'),
              # the JSON string of a decimal number: an OTLP JSON int64
              K_ELASTIC_SLICES: kv(schema.ATTR_SLICES_AVAILABLE, '{"intValue":%s}')}
    always = {K_CHECKPOINT_SAVE: _kv(schema.ATTR_BLOCKING, True),
              K_CUSTOM_BADPUT: _kv(schema.ATTR_BLOCKING, True),
              K_ELASTIC_WAIT: _kv(schema.ATTR_BLOCKING, True),
              K_ELASTIC_REINIT: _kv(schema.ATTR_BLOCKING, True)}
    out = []
    for kind, name in enumerate(KINDS):
        base = ('{"traceId":"%s","spanId":"%016x","name":' + json.dumps(name)
                + ',"kind":1,"startTimeUnixNano":"%d","endTimeUnixNano":"%d"')
        for code in range(8):
            used = (code & 4 and kind in ival_kv, code & 2 and kind in aux_kv,
                    code & 1 and kind in str_kv)
            pieces = (ival_kv.get(kind), aux_kv.get(kind), str_kv.get(kind))
            body, n = "", 0
            for use, piece in zip(used, pieces, strict=True):
                if use:
                    body += ("," if n else "") + piece
                    n += 1
                else:
                    body += "%.0s"
            if kind in always:
                body += ("," if n else "") + always[kind]
                n += 1
            out.append(base + (',"attributes":[' + body + "]}" if n else body + "}"))
    return out


_TEMPLATES = _templates()


class SpanWriter:
    """Writes :class:`SpanTable` s of jobs under ``run_dir``, one directory per job.

    Args:
        run_dir: parent directory of the job directories (created if missing).
        source: written as the ``goodput.imported_from`` resource attribute, one of
            :data:`goodput.schema.IMPORT_SOURCES`.
        overwrite: replace a job directory's existing ``*.jsonl`` files instead of refusing.
        spans_per_line: spans per OTLP request line.
    """

    def __init__(self, run_dir: str | os.PathLike, source: str, *, overwrite: bool = False,
                 spans_per_line: int = 1000) -> None:
        if source not in schema.IMPORT_SOURCES:
            raise ValueError(f"source must be one of {schema.IMPORT_SOURCES}, got {source!r}")
        self.run_dir = Path(run_dir)
        self.source = source
        self.overwrite = overwrite
        self.spans_per_line = max(1, int(spans_per_line))

    def job_dir(self, job: str) -> Path:
        """The directory the spans of ``job`` go to."""
        return self.run_dir / job_dir_name(job)

    def _existing(self, job: str) -> list[Path]:
        d = self.job_dir(job)
        try:
            return sorted(p for p in d.rglob("*.jsonl") if p.is_file()) if d.is_dir() else []
        except OSError:
            return []

    def check(self, jobs) -> None:
        """Raise before writing anything if a job cannot be written.

        Raises:
            OutputExistsError: a job directory already holds ``*.jsonl`` span files (and
                ``overwrite`` is False), or two jobs map to the same directory.
        """
        seen: dict[str, str] = {}
        for job in jobs:
            name = job_dir_name(job)
            if name in seen:
                raise OutputExistsError(
                    f"jobs {seen[name]!r} and {job!r} would both be written to "
                    f"{self.job_dir(job)}; import them one at a time with --job and "
                    "different --to directories")
            seen[name] = job
            if not self.overwrite and self._existing(job):
                raise OutputExistsError(
                    f"{self.job_dir(job)} already holds spans of job {job!r}; pass "
                    "--overwrite to replace them, or write to another directory")

    def write_job(self, job: str, table: SpanTable, process_count: int | None = None,
                  progress=None, release: bool = False) -> WrittenJob:
        """Write the spans of ``job``: one file per (attempt, process), then rename them.

        Args:
            job: the job name (``service.name`` and ``goodput.job.name``).
            table: its spans.
            process_count: ``goodput.process.count``; default: number of distinct processes.
            progress: optional ``callback(nspans)`` called with spans written since the
                previous call.
            release: empty ``table`` while writing (saves memory; it cannot be reused).

        Raises:
            OutputExistsError: see :meth:`check`.
            OSError: the files cannot be written (temporary files are removed).
        """
        self.check([job])
        rows = table.sorted_rows(release=release)
        d = self.job_dir(job)
        d.mkdir(parents=True, exist_ok=True)
        for stale in d.glob("spans-*.jsonl" + _TMP_SUFFIX):  # left by an interrupted import
            stale.unlink(missing_ok=True)
        if process_count is None:
            process_count = len(np.unique(rows[:, C_PROCESS])) if len(rows) else 0
        key = rows[:, C_ATTEMPT] * (1 << 32) + rows[:, C_PROCESS]
        cuts = np.flatnonzero(key[1:] != key[:-1]) + 1 if len(rows) else np.zeros(0, np.int64)
        bounds = [0, *cuts.tolist(), len(rows)] if len(rows) else [0]
        strings = [json.dumps(s) for s in table.strings]
        written: list[tuple[Path, Path]] = []
        try:
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                attempt, process = int(rows[lo, C_ATTEMPT]), int(rows[lo, C_PROCESS])
                final = d / f"spans-p{process:05d}-a{attempt:04d}.jsonl"
                tmp = final.with_name(final.name + _TMP_SUFFIX)
                written.append((tmp, final))
                self._write_file(tmp, job, attempt, process, process_count, rows[lo:hi],
                                 strings, progress)
            if self.overwrite:
                for old in self._existing(job):
                    old.unlink(missing_ok=True)
            for tmp, final in written:
                os.replace(tmp, final)
        except BaseException:
            for tmp, _ in written:
                tmp.unlink(missing_ok=True)
            raise
        attempts = len(np.unique(rows[:, C_ATTEMPT])) if len(rows) else 0
        return WrittenJob(str(d), attempts, int(process_count), len(rows), len(written))

    def _resource(self, job: str, attempt: int, process: int, count: int) -> str:
        attrs = [
            _kv(schema.RES_SERVICE_NAME, job),
            _kv(schema.RES_JOB_NAME, job),
            _kv(schema.RES_ATTEMPT, attempt),
            _kv(schema.RES_PROCESS_INDEX, process),
            _kv(schema.RES_PROCESS_COUNT, count),
            _kv(schema.RES_SCHEMA_VERSION, schema.SCHEMA_VERSION),
            _kv(schema.RES_IMPORTED_FROM, self.source),
        ]
        return '{"attributes":[' + ",".join(attrs) + "]}"

    def _write_file(self, path: Path, job: str, attempt: int, process: int, count: int,
                    rows: np.ndarray, strings: list[str], progress) -> None:
        trace = hashlib.sha256(f"{job}\0{attempt}\0{process}".encode()).hexdigest()[:32]
        head = ('{"resourceSpans":[{"resource":' + self._resource(job, attempt, process, count)
                + ',"scopeSpans":[{"scope":{"name":' + json.dumps(schema.SCOPE_NAME)
                + '},"spans":[')
        tail = "]}]}]}\n"
        templates, strs = _TEMPLATES, [*strings, ""]  # sidx -1 -> ""
        codes = (rows[:, C_KIND] * 8 + (rows[:, C_IVAL] != NONE) * 4
                 + (rows[:, C_AUX] != NONE) * 2 + (rows[:, C_SIDX] >= 0))
        cols = rows[:, [C_START, C_END, C_IVAL, C_AUX, C_SIDX]]
        n = self.spans_per_line
        with open(path, "w", encoding="utf-8") as f:
            for lo in range(0, len(rows), n):
                hi = min(lo + n, len(rows))
                spans = [templates[c] % (trace, sid, s, e, i, a, strs[x])
                         for sid, c, (s, e, i, a, x) in zip(
                             range(lo + 1, hi + 1), codes[lo:hi].tolist(),
                             cols[lo:hi].tolist(), strict=True)]
                f.write(head + ",".join(spans) + tail)
                if progress is not None:
                    progress(hi - lo)
