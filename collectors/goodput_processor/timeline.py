"""The in-memory span model, and a job's attempts with their boundaries.

Spans are kept per (job, attempt, process) as rows of an ``int64`` array (:data:`COLUMNS`):
:class:`SpanSet` -> :class:`JobSpans` -> :class:`ProcessSpans`. :func:`build_attempts`
implements "Structure" and "Attempt boundaries" of ``docs/accounting.md``: an attempt is
one value of the ``goodput.attempt`` resource attribute; it is accounted on its primary
process (lowest process index with any span) while its start and end are taken over all
its processes. All times are integer nanoseconds since the Unix epoch.
"""

from __future__ import annotations

import time
from array import array
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from goodput import schema

__all__ = ["COLUMNS", "DEFAULT_HEARTBEAT_INTERVAL_MS", "KIND_NAMES", "NONE", "RUN_ATTRIBUTES",
           "SKIP_REASONS",
           "Attempt", "JobSpans", "ProcessSpans", "SpanSet", "build_attempts", "drop_duplicates"]

#: Span kind codes (column ``kind``) are indexes into this tuple.
KIND_NAMES = (schema.JOB_START, schema.JOB_END, schema.HEARTBEAT, schema.ACCELERATOR_INIT,
              schema.TRAINING_PREP, schema.PROGRAM_STARTUP, schema.DATA_LOADING, schema.STEP,
              schema.CHECKPOINT_SAVE, schema.CHECKPOINT_RESTORE, schema.CUSTOM_BADPUT)
(K_JOB_START, K_JOB_END, K_HEARTBEAT, K_ACCELERATOR_INIT, K_TRAINING_PREP, K_PROGRAM_STARTUP,
 K_DATA_LOADING, K_STEP, K_CHECKPOINT_SAVE, K_CHECKPOINT_RESTORE, K_CUSTOM_BADPUT) = range(11)

#: Columns of a span record, all int64. ``start``/``end``: ns since the Unix epoch.
#: ``ival``: ``goodput.step`` (step), ``goodput.checkpoint.step`` (save, restore),
#: ``goodput.heartbeat.interval_ms`` (job_start), ``goodput.recorder.errors`` (job_end,
#: heartbeat). ``aux``: ``goodput.recorder.dropped`` (job_end, heartbeat),
#: ``goodput.step.count`` (step; absent = 1). ``flags``: bit 0
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
#: Resource attributes of an ML run (``goodput.diagnostics``) kept per process.
RUN_ATTRIBUTES = (schema.RES_RUN_NAME, schema.RES_RUN_GROUP, schema.RES_FLOPS_PER_STEP,
                  schema.RES_PEAK_FLOPS, schema.RES_DEVICE_COUNT)
#: Reasons a record is skipped (keys of the ``skipped`` counters); see
#: :mod:`goodput_processor.reader`.
SKIP_REASONS = ("torn", "malformed", "invalid_span", "duplicate", "unknown", "unsupported_schema")


@dataclass
class ProcessSpans:
    """Spans of one process in one attempt of a job.

    ``data`` is an ``(n, len(COLUMNS))`` int64 array (see :data:`COLUMNS`), deduplicated,
    in file order (not sorted). ``host``/``process_count`` come from the resource, and
    ``run`` holds the ML run's resource attributes (:data:`RUN_ATTRIBUTES`) it carried.
    """

    job: str
    attempt: int
    index: int
    host: str | None = None
    process_count: int | None = None
    schema_version: str | None = None
    data: np.ndarray = field(default_factory=lambda: np.empty((0, NCOLS), np.int64))
    run: dict = field(default_factory=dict)
    # While reading: the records, NCOLS int64 per span (``data`` is a view of it).
    _buf: array = field(default_factory=lambda: array("q"), repr=False, compare=False)


@dataclass
class JobSpans:
    """All spans of one job: ``processes[(attempt, process_index)] -> ProcessSpans``.

    ``skipped`` counts skipped records by reason (see :data:`SKIP_REASONS`);
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


#: Heartbeat interval assumed when no ``goodput.job_start`` carries one (ms).
DEFAULT_HEARTBEAT_INTERVAL_MS = 1000
#: An attempt without an end marker seen alive within this many heartbeat intervals of
#: *now* is running.
RUNNING_INTERVALS = 3


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job, with boundaries in ns since the Unix epoch.

    ``end_reason`` is the ``goodput.end.reason`` of the latest ``goodput.job_end`` marker
    (``"unspecified"`` if the marker has none), else ``"killed"`` or ``"running"``.
    ``cut`` is True when the end was moved back to the next attempt's start.
    ``primary`` is the :class:`ProcessSpans` the attempt is
    accounted on; ``processes`` are all its processes with spans, by index.
    ``recorder_errors``/``recorder_dropped``: per process the maximum of
    ``goodput.recorder.errors``/``dropped`` seen on job_end/heartbeat markers, summed
    over processes.
    """

    attempt: int
    start_ns: int
    end_ns: int
    end_reason: str
    cut: bool
    primary: ProcessSpans
    processes: tuple[ProcessSpans, ...]
    declared_process_count: int | None
    hosts: tuple[str, ...]
    heartbeat_interval_ms: int
    recorder_errors: int
    recorder_dropped: int

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns`` (ns, >= 0)."""
        return self.end_ns - self.start_ns


def drop_duplicates(data: np.ndarray) -> tuple[np.ndarray, int]:
    """Rows of ``data`` (n x NCOLS) without repeated (trace, span id), keeping the first.

    Returns the rows (``data`` itself when nothing repeats) and the number dropped.
    """
    if len(data) < 2:
        return data, 0
    tidx, sid = data[:, C_TIDX], data[:, C_SID]
    ssid = np.sort(sid)  # fast check first: no repeated span id, no duplicate
    if not (ssid[1:] == ssid[:-1]).any():
        return data, 0
    if tidx.min() == tidx.max():
        order = np.argsort(sid, kind="stable")
        dup = sid[order][1:] == sid[order][:-1]
    else:
        order = np.lexsort((sid, tidx))  # stable: equal keys stay in file order
        t = tidx[order]
        dup = (sid[order][1:] == sid[order][:-1]) & (t[1:] == t[:-1])
    ndup = int(dup.sum())
    if not ndup:
        return data, 0
    keep = np.ones(len(data), bool)
    keep[order[1:][dup]] = False
    return data[keep], ndup


def _markers(data: np.ndarray, kind: int) -> np.ndarray:
    return data[data[:, C_KIND] == kind]


def _max_attr(rows: np.ndarray, col: int) -> int:
    vals = rows[:, col]
    vals = vals[vals != NONE]
    return int(vals.max()) if len(vals) else 0


def _split_runs(proc: ProcessSpans) -> list[ProcessSpans]:
    """``proc`` split at each start marker that comes after it had stepped or ended.

    A process starts an attempt once, so a ``goodput.job_start`` later than one of its
    steps or its ``goodput.job_end`` belongs to another run that reused the job name,
    attempt number and process index (two run directories read together, two runs
    sending to one service). Each such run becomes an attempt of its own, ordered by
    start, instead of one attempt holding both runs' steps. (Earlier extra start
    markers, such as the scheduling time an imported log adds, do not split.)
    """
    d = proc.data
    kinds = d[:, C_KIND]
    starts = np.unique(d[kinds == K_JOB_START][:, C_START])
    if len(starts) < 2:
        return [proc]
    done = d[(kinds == K_STEP) | (kinds == K_JOB_END)][:, C_END]
    cuts = starts[starts >= done.min()] if len(done) else starts[:0]
    if not len(cuts):
        return [proc]
    run = np.searchsorted(cuts, d[:, C_START], side="right")
    return [replace(proc, data=d[run == i]) for i in range(len(cuts) + 1)]


def build_attempts(job: JobSpans, now_ns: int | None = None) -> list[Attempt]:
    """Attempts of ``job`` ordered by start, with ends cut at the next attempt's start.

    Args:
        job: the job's spans as read by :func:`goodput_processor.reader.read_run_dir`.
        now_ns: "now" in ns since the Unix epoch, to tell a running last attempt from a
            killed one; default ``time.time_ns()``.

    Returns:
        One :class:`Attempt` per ``goodput.attempt`` value that has at least one span
        (empty list if the job has no spans).
    """
    if now_ns is None:
        now_ns = time.time_ns()
    by_attempt: dict[tuple[int, int], list[ProcessSpans]] = {}
    for (attempt, _index), proc in sorted(job.processes.items()):
        if len(proc.data):
            for run, part in enumerate(_split_runs(proc)):
                by_attempt.setdefault((attempt, run), []).append(part)

    raw = []
    for (attempt, _run), procs in by_attempt.items():
        starts, ends, firsts, intervals = [], [], [], []
        errors = dropped = 0
        end_reason = None
        latest_end_marker = None
        for proc in procs:
            d = proc.data
            js = _markers(d, K_JOB_START)
            je = _markers(d, K_JOB_END)
            if len(js):
                starts.append(int(js[:, C_START].min()))
                intervals.extend(int(v) for v in js[:, C_IVAL] if v != NONE and v > 0)
            if len(je):
                i = int(np.argmax(je[:, C_END]))
                if latest_end_marker is None or je[i, C_END] > latest_end_marker:
                    latest_end_marker = int(je[i, C_END])
                    sidx = int(je[i, C_SIDX])
                    end_reason = job.strings[sidx] if sidx >= 0 else "unspecified"
            ends.append(int(d[:, C_END].max()))
            firsts.append(int(d[:, C_START].min()))
            rec = d[(d[:, C_KIND] == K_JOB_END) | (d[:, C_KIND] == K_HEARTBEAT)]
            errors += _max_attr(rec, C_IVAL)
            dropped += _max_attr(rec, C_AUX)
        start = min(starts) if starts else min(firsts)
        last_alive = max(ends)
        interval = max(intervals) if intervals else DEFAULT_HEARTBEAT_INTERVAL_MS
        raw.append(
            dict(
                attempt=attempt,
                start=start,
                end_marker=latest_end_marker,
                last_alive=last_alive,
                reason=end_reason,
                procs=procs,
                interval=interval,
                errors=errors,
                dropped=dropped,
            )
        )
    raw.sort(key=lambda r: (r["start"], r["attempt"]))

    attempts = []
    for i, r in enumerate(raw):
        if r["end_marker"] is not None:
            end, reason = r["end_marker"], r["reason"]
        elif (
            i == len(raw) - 1
            and now_ns - r["last_alive"] <= RUNNING_INTERVALS * r["interval"] * 1_000_000
        ):
            end, reason = max(now_ns, r["last_alive"]), "running"  # (clock skew: not before)
        else:
            end, reason = r["last_alive"], "killed"
        end = max(end, r["start"])
        cut = False
        if i + 1 < len(raw) and end > raw[i + 1]["start"]:
            end, cut = raw[i + 1]["start"], True
        procs = r["procs"]
        counts = [p.process_count for p in procs if p.process_count is not None]
        attempts.append(
            Attempt(
                attempt=r["attempt"],
                start_ns=r["start"],
                end_ns=end,
                end_reason=reason,
                cut=cut,
                primary=procs[0],
                processes=tuple(procs),
                declared_process_count=max(counts) if counts else None,
                hosts=tuple(sorted({p.host for p in procs if p.host})),
                heartbeat_interval_ms=r["interval"],
                recorder_errors=r["errors"],
                recorder_dropped=r["dropped"],
            )
        )
    return attempts
