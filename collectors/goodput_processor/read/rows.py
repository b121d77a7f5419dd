"""The in-memory span model, and a job's attempts with their boundaries.

Spans are kept per resource (one OS process's attempt, or one process of an imported log)
as rows of an ``int64`` array (:data:`COLUMNS`): :class:`SpanSet` -> :class:`JobSpans` ->
:class:`ProcessSpans`. :func:`build_attempts` implements "Structure" and "Attempt
boundaries" of ``docs/accounting.md``: which attempts existed, which processes each had,
and when each started and was last seen alive, from evidence (process identity, start
markers, heartbeats, the framework's rank). An attempt is accounted on its primary process
(lowest rank) while its start and end are taken over all its processes. All times are
integer nanoseconds since the Unix epoch.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from goodput import schema

from .heap import trim_heap

__all__ = ["COLUMNS", "KIND_NAMES", "LAUNCH_ATTRIBUTES", "NONE", "RUN_ATTRIBUTES",
           "SKIP_REASONS", "JobSpans", "ProcessSpans", "SpanSet", "as_of", "clip_ns",
           "drop_duplicates", "is_phase", "shallow_copy"]

#: Span kind codes (column ``kind``) are indexes into this tuple.
#: Markers come first: a code from ``K_ACCELERATOR_INIT`` up to ``K_ELASTIC_REINIT`` is a
#: phase; ``K_ELASTIC_SLICES`` (a marker of schema 1.2) and the evidence of schema 1.3
#: (``K_COLLECTIVE_WAIT``, ``K_LAUNCHER_EVENT``) are appended after them so that earlier codes
#: keep their values, and are no phases (:func:`is_phase`).
KIND_NAMES = (schema.JOB_START, schema.JOB_END, schema.HEARTBEAT, schema.IDENTITY,
              schema.ACCELERATOR_INIT, schema.TRAINING_PREP, schema.PROGRAM_STARTUP,
              schema.DATA_LOADING, schema.STEP, schema.CHECKPOINT_SAVE,
              schema.CHECKPOINT_RESTORE, schema.CUSTOM_BADPUT, schema.ELASTIC_WAIT,
              schema.ELASTIC_REINIT, schema.ELASTIC_SLICES, schema.COLLECTIVE_WAIT,
              schema.LAUNCHER_EVENT)
(K_JOB_START, K_JOB_END, K_HEARTBEAT, K_IDENTITY, K_ACCELERATOR_INIT, K_TRAINING_PREP,
 K_PROGRAM_STARTUP, K_DATA_LOADING, K_STEP, K_CHECKPOINT_SAVE, K_CHECKPOINT_RESTORE,
 K_CUSTOM_BADPUT, K_ELASTIC_WAIT, K_ELASTIC_REINIT, K_ELASTIC_SLICES, K_COLLECTIVE_WAIT,
 K_LAUNCHER_EVENT) = range(17)


def clip_ns(a: np.ndarray, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
    """``np.clip(a, lo, hi, out=out)`` for int64 ns and Python int bounds, the same values
    (``minimum(maximum(a, lo), hi)``, as numpy defines clip) without its per-call checks
    of the bounds against the dtype (about five times its cost on the few rows of a
    poll)."""
    return np.minimum(np.maximum(a, lo, out=out), hi, out=out)


def is_phase(kinds: np.ndarray) -> np.ndarray:
    """Bool mask of the phase kinds in ``kinds`` (an int array of kind codes)."""
    return (kinds >= K_ACCELERATOR_INIT) & (kinds < K_ELASTIC_SLICES)


#: Columns of a span record, all int64. ``start``/``end``: ns since the Unix epoch.
#: ``ival``: ``goodput.step`` (step), ``goodput.checkpoint.step`` (save, restore),
#: ``goodput.heartbeat.interval_ms`` (job_start), ``goodput.recorder.errors`` (job_end,
#: heartbeat), ``goodput.process.index`` (identity), ``goodput.elastic.slices.active``
#: (elastic_slices), ``goodput.launcher.worker_pid`` (launcher_event). ``aux``:
#: ``goodput.launcher.exit_code`` (launcher_event), ``goodput.recorder.dropped``
#: (job_end, heartbeat), ``goodput.step.count`` (step; absent = 1),
#: ``goodput.process.count`` (identity), ``goodput.elastic.slices.total`` (elastic_slices).
#: ``flags``: bit 0
#: set = ``goodput.blocking`` false, bit 1 set = status ERROR, bit 2 set = ``goodput.open``
#: (a phase still in flight when written), bit 3 set (:data:`F_ENDLESS`, set by
#: :func:`~goodput_processor.model.open_records.resolve_open`) = the phase's end was never recorded
#: and is inferred. ``sidx``: index into
#: :attr:`SpanSet.strings` of ``goodput.badput.type`` (custom), ``goodput.end.reason``
#: (job_end), ``goodput.elastic.event_type`` (elastic_wait), ``goodput.launcher.event``
#: (launcher_event) or the decimal text of
#: ``goodput.elastic.slices.available`` (elastic_slices: the two int columns are taken, and
#: the readers of ``goodput report`` and ``goodput serve`` share the string slot).
#: ``tidx``: index of the trace id. ``sid``: the 64-bit span id (as signed).
#: Absent integer attributes are :data:`NONE`.
COLUMNS = ("start", "end", "kind", "ival", "aux", "flags", "sidx", "tidx", "sid")
C_START, C_END, C_KIND, C_IVAL, C_AUX, C_FLAGS, C_SIDX, C_TIDX, C_SID = range(len(COLUMNS))
NCOLS = len(COLUMNS)
#: The columns the accounting reads: all but ``tidx`` and ``sid``, which only tell duplicate
#: spans apart (:func:`drop_duplicates`); rows read for one report drop them
#: (:meth:`JobSpans.own_rows`).
ACCOUNT_NCOLS = C_SIDX + 1
#: Sentinel for an absent integer attribute.
NONE = -(2**63)
F_NONBLOCKING = 1
F_ERROR = 2
F_OPEN = 4
F_ENDLESS = 8
#: Resource attributes of an ML run (``goodput.diagnostics``) kept per process.
RUN_ATTRIBUTES = (schema.RES_RUN_NAME, schema.RES_RUN_GROUP, schema.RES_FLOPS_PER_STEP,
                  schema.RES_PEAK_FLOPS, schema.RES_DEVICE_COUNT)
#: Resource attributes of the launch (schema 1.3) kept per process in ``ProcessSpans.run``
#: too: the process's role and its Kubernetes pod's times
#: (:mod:`goodput_processor.analysis.recovery`, ETTR), and
#: the recording API its attempts were started through (:mod:`goodput_processor.model.attempts`).
LAUNCH_ATTRIBUTES = (schema.RES_PROCESS_ROLE, schema.RES_K8S_POD_CREATED,
                     schema.RES_K8S_POD_SCHEDULED, schema.RES_K8S_POD_STARTED,
                     schema.RES_RECORDER_API, schema.RES_IMPORTED_FROM,
                     schema.RES_SOURCE_EXPORT_DELAY)
#: Reasons a record is skipped (keys of the ``skipped`` counters); see
#: :mod:`goodput_processor.read.reader`.
SKIP_REASONS = ("torn", "malformed", "invalid_span", "duplicate", "unknown", "unsupported_schema",
                "over_limit")


@dataclass
class ProcessSpans:
    """Spans of one resource: one OS process's attempt (or one process of an imported log).

    ``attempt``/``index`` are the resource's ``goodput.attempt``/``goodput.process.index``
    as read; in the :class:`Attempt` objects of :func:`build_attempts` they are the
    attempt's number and the process's rank as found from the evidence. ``data`` is an
    ``(n, len(COLUMNS))`` int64 array (see :data:`COLUMNS`), deduplicated, in file order
    (not sorted). ``host``/``process_count`` come from the resource, and ``run`` holds the
    ML run's resource attributes (:data:`RUN_ATTRIBUTES`) it carried. Process identity:
    ``instance`` (``service.instance.id``, "" when absent), ``pid``, ``process_start_ns``
    (``goodput.process.start_time_unix_nano``), ``attempt_source`` and ``index_source``
    (``goodput.attempt.source``, ``goodput.process.index.source``; None when absent).
    """

    job: str
    attempt: int
    index: int
    host: str | None = None
    process_count: int | None = None
    schema_version: str | None = None
    data: np.ndarray = field(default_factory=lambda: np.empty((0, NCOLS), np.int64))
    run: dict = field(default_factory=dict)
    instance: str = ""
    pid: int | None = None
    process_start_ns: int | None = None
    attempt_source: str | None = None
    index_source: str | None = None
    # While reading: the records, NCOLS int64 per span (``data`` is a view of it).
    _buf: array = field(default_factory=lambda: array("q"), repr=False, compare=False)
    #: For rows derived from others (open records resolved, a run split off): the memo
    #: identity of what they were derived from (:func:`goodput_processor.model.memo.proc_key`).
    origin: tuple | None = field(default=None, repr=False, compare=False)
    #: Rows of ``data`` that only grow at the end from one poll of a live job to the next
    #: (``data[:settled]`` is a prefix of the next poll's rows; the open records resolved
    #: follow them): set by the accounting with a memo, None otherwise
    #: (:func:`goodput_processor.model.memo.folded`).
    settled: int | None = field(default=None, repr=False, compare=False)

    def copy(self, **changes) -> ProcessSpans:
        """A shallow copy with ``changes`` (field names to new values) applied: what
        ``dataclasses.replace`` gives for this class, without running ``__init__`` and its
        default factories (a live poll copies every process; ``replace`` costs about ten
        times more). A subclass (its own fields or properties) gets ``replace`` itself.

        Raises:
            TypeError: a name in ``changes`` is not a field.
        """
        if type(self) is not ProcessSpans:
            return replace(self, **changes)
        return shallow_copy(ProcessSpans, self, changes)


_PROCESS_FIELDS = frozenset(ProcessSpans.__dataclass_fields__)


def shallow_copy(cls: type, proc: ProcessSpans, changes: dict) -> ProcessSpans:
    """A ``cls`` (:class:`ProcessSpans` or a subclass adding no field) holding what
    ``proc`` holds, ``changes`` (field names to new values) applied, made without
    ``__init__`` (:meth:`ProcessSpans.copy`).

    Raises:
        TypeError: a name in ``changes`` is not a field.
    """
    bad = changes.keys() - _PROCESS_FIELDS
    if bad:
        raise TypeError(f"ProcessSpans has no field(s) {sorted(bad)}")
    out = object.__new__(cls)
    out.__dict__.update(proc.__dict__)
    out.__dict__.update(changes)
    return out


@dataclass
class JobSpans:
    """All spans of one job: ``processes[(attempt, process_index, instance)] ->
    ProcessSpans``, keyed by the resource's ``goodput.attempt``, ``goodput.process.index``
    and ``service.instance.id`` ("" when absent).

    ``skipped`` counts skipped records by reason (see :data:`SKIP_REASONS`);
    ``examples`` holds up to 20 ``"path:line: reason"`` strings; ``strings`` is the shared
    string table that column ``sidx`` indexes. ``over_limit`` counts, per limit of
    ``goodput serve`` (``custom_types``, ``attribute_bytes``), the values that went past it
    (empty in ``goodput report``, which has no such limits); ``custom_sids`` is the set of
    string ids this job used as custom badput types. ``run_dirs``: the directories of the
    spool files its spans were read from (``goodput report``; empty where the spans did not
    come from files): more than one when a report of a parent directory merged the spools of
    several runs with the same job name (the ``run_dirs_merged`` warning).
    """

    name: str
    processes: dict[tuple[int, int, str], ProcessSpans] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    schema_versions: set[str] = field(default_factory=set)
    over_limit: Counter = field(default_factory=Counter)
    custom_sids: set[int] = field(default_factory=set, repr=False)
    run_dirs: set[str] = field(default_factory=set, compare=False)
    #: The accounting may write each process's open records resolved over its rows
    #: (:func:`~goodput_processor.model.open_records.resolve_open` in place), and let go of the rows
    #: once it has what it needs of them (:meth:`drop_rows`): set for rows read for one
    #: accounting (``goodput report``), saving a copy of them.
    rows_owned: bool = field(default=False, repr=False, compare=False)

    def own_rows(self) -> None:
        """Take the rows as read for this one accounting (:attr:`rows_owned`) and narrow
        each process's to its first :data:`ACCOUNT_NCOLS` columns, in place: ``(n,
        NCOLS)`` becomes ``(n, ACCOUNT_NCOLS)`` (7 of 9 int64 a row), without a copy when
        the rows fill the reader's buffer (moved 2^16 rows at a time, the buffer then
        shrunk), else through a copy of that process's rows. Duplicates must be dropped
        already (:func:`drop_duplicates`, as the reader does). When a process's rows are
        held elsewhere (the columnar cache's one array), no process's is narrowed: a job's
        rows keep one width. The C heap's free pages then go back to the system
        (:func:`~goodput_processor.read.heap.trim_heap`)."""
        self.rows_owned = True
        procs = list(self.processes.values())
        owned = [_own_buffer(p) for p in procs]
        if None not in owned:
            for p, in_buffer in zip(procs, owned, strict=True):
                _narrow(p, in_buffer)
            trim_heap()  # (what the reader and the narrowing let go of, out of the heap)

    def drop_rows(self) -> None:
        """Empty every process's rows here (what was made from them, e.g. an attempt's
        processes, keeps its own reference): their memory goes once nothing else holds
        it. For :attr:`rows_owned` rows only."""
        for p in self.processes.values():
            p.data = np.zeros((0, NCOLS), np.int64)
            p._buf = array("q")  # (what the reader's rows are a view of)


#: Rows moved at a time by :meth:`JobSpans.own_rows`.
_NARROW_ROWS = 1 << 16


def _own_buffer(p: ProcessSpans) -> bool | None:
    """Whether ``p``'s rows fill the reader's buffer (True), are an array of their own
    (False: copied to narrow them), or are held elsewhere or already narrow (None)."""
    d = p.data
    if d.ndim != 2 or d.shape[1] != NCOLS:
        return None
    if not len(d):
        return False
    if len(p._buf):
        flat = np.frombuffer(p._buf, np.int64)
        if len(flat) == d.size and np.shares_memory(d, flat):
            return True
    return False if d.base is None and d.flags.writeable else None


def _narrow(p: ProcessSpans, in_buffer: bool) -> None:
    """``p``'s rows narrowed to :data:`ACCOUNT_NCOLS` columns, in the reader's buffer where
    they fill it (``in_buffer``, :func:`_own_buffer`), else as a copy (see
    :meth:`JobSpans.own_rows`)."""
    w, n = ACCOUNT_NCOLS, len(p.data)
    if not in_buffer:
        p.data, p._buf = np.ascontiguousarray(p.data[:, :w]), array("q")
        return
    d, buf = p.data, p._buf
    flat = np.frombuffer(buf, np.int64)
    for i in range(0, n, _NARROW_ROWS):  # row i moves to i * w, never past where it was
        block = d[i : i + _NARROW_ROWS, :w].copy()
        flat[i * w : i * w + block.size] = block.reshape(-1)
    p.data = d = flat = block = None
    try:
        del buf[n * w :]  # (realloc: the pages past the rows go back)
    except BufferError:  # a view of the buffer is held elsewhere: it keeps its size
        pass
    p.data = np.frombuffer(buf, np.int64)[: n * w].reshape(n, w)


@dataclass
class SpanSet:
    """Everything read from a run directory.

    ``jobs`` maps job name to :class:`JobSpans`; ``skipped``/``examples`` hold what could
    not be tied to any job; ``files`` is the number of files read; ``file_problems`` the
    files that gave nothing, as ``(path, code, why)`` with code ``empty_spool_file`` or
    ``spool_file_skipped`` (unreadable, or no line of it is an OTLP request).
    """

    path: str
    jobs: dict[str, JobSpans]
    skipped: Counter
    examples: list[str]
    strings: list[str]
    files: int
    file_problems: list[tuple[str, str, str]] = field(default_factory=list)


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


def as_of(job: JobSpans, at_ns: int) -> JobSpans:
    """``job`` as a reader would have seen it at ``at_ns`` (ns since the epoch), for a report
    "as of" that moment (``goodput report --at``).

    Spans that start after ``at_ns`` are dropped; a span that started before and ends after
    it was in flight then: its end becomes ``at_ns`` and, if it is a phase, it is flagged
    ``F_OPEN``, as the
    recorder writes a phase in flight (:func:`~goodput_processor.model.open_records.resolve_open`
    then takes it as running until the process's last sign of life, at most ``at_ns``).
    Processes left with no span are dropped. The spans are copied; ``job`` is unchanged.
    Times in the future of ``at_ns`` are a recorder's back-filled times: they are treated
    the same way (what a recorder writes with an explicit time is at that time).
    """
    at = int(at_ns)
    out = JobSpans(job.name, skipped=Counter(job.skipped), examples=list(job.examples),
                   strings=job.strings, schema_versions=set(job.schema_versions),
                   over_limit=Counter(job.over_limit), custom_sids=set(job.custom_sids),
                   run_dirs=set(job.run_dirs))
    for key, proc in job.processes.items():
        d = proc.data
        d = d[d[:, C_START] <= at]
        if not len(d):
            continue
        late = d[:, C_END] > at
        if late.any():
            d = d.copy()
            d[late, C_END] = at
            d[late & is_phase(d[:, C_KIND]), C_FLAGS] |= F_OPEN
        out.processes[key] = replace(proc, data=d, _buf=array("q"))
    return out
