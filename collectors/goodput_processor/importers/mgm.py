"""ml-goodput-measurement ("mgm") log entries -> goodput spans.

Input: the entries mgm's ``GoodputRecorder`` writes (and the Orbax checkpoint logger's
entries that its calculator reads), as Cloud Logging ``LogEntry`` objects (``gcloud logging
read --format=json``, log sinks; the ``jsonPayload`` is used) or bare payloads (mgm's local
cache ``<job>_timeline.jsonl``). Payload times are POSIX seconds (floats); spans get
integer nanoseconds. One process (index 0, count 1) per attempt.

Conversion (entries sorted by payload time; ties by LogEntry ``timestamp``, then input
order):

- each ``job_start_time`` begins attempt 0, 1, 2, ... (``goodput.job_start`` marker); an
  entry belongs to the attempt whose start is the latest one at or before its time
  (entries before the first start: attempt 0);
- ``job_end_time`` -> ``goodput.job_end`` marker, reason ``explicit``;
- ``step_start_time`` -> ``goodput.step`` from one step start to the next in the attempt;
  the attempt's last step ends at its (latest) job end, else it is zero-length;
- start/end pairs (``tpu_init``, ``training_prep``, ``data_loading``,
  ``custom_badput_event``) -> spans; an end closes the latest open start of the same kind
  (and custom type) in its attempt;
- Orbax ``save`` -> blocking ``goodput.checkpoint_save`` over [start, start + duration];
  ``restore`` / ``emergency_restore`` -> ``goodput.checkpoint_restore``;
- ``ElasticGoodputRecorder``'s entries: ``elastic_wait_start_time`` / ``_end_time`` pairs
  (per ``elastic_wait_event_type``, ``unknown`` when absent) -> ``goodput.elastic_wait``;
  ``elastic_reinit_start_time`` / ``_end_time`` -> ``goodput.elastic_reinit``;
  ``elastic_slice_counts_timestamp`` (with ``active_slices``, ``available_slices``,
  ``total_slices``) -> a ``goodput.elastic_slices`` marker.

Problems (counted by reason in :class:`~.common.Problems`, never dropped silently):
``not JSON``, ``not an object``, ``unknown payload``, ``wrong type``, ``missing field``,
``no job name``, ``end without start``, ``start never ended``, ``no start time``,
``no duration`` (imported zero-length).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from .common import InputError, Payloads, Problems, as_int, iso_to_ns, where
from .writer import (
    K_ACCELERATOR_INIT,
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    K_CUSTOM_BADPUT,
    K_DATA_LOADING,
    K_ELASTIC_REINIT,
    K_ELASTIC_SLICES,
    K_ELASTIC_WAIT,
    K_JOB_END,
    K_JOB_START,
    K_STEP,
    K_TRAINING_PREP,
    NONE,
    SpanTable,
)

__all__ = ["MGM_KEYS", "ORBAX_EVENTS", "MgmResult", "convert", "is_mgm_payload"]

# Entry kinds (internal).
(E_JOB_START, E_JOB_END, E_STEP, E_TPU_S, E_TPU_E, E_PREP_S, E_PREP_E, E_DL_S, E_DL_E,
 E_CB_S, E_CB_E, E_SAVE, E_RESTORE, E_WAIT_S, E_WAIT_E, E_REINIT_S, E_REINIT_E,
 E_SLICES) = range(18)
#: mgm recorder payload key (a POSIX time in seconds) -> entry kind.
_TIME_KEYS = {
    "job_start_time": E_JOB_START,
    "job_end_time": E_JOB_END,
    "step_start_time": E_STEP,
    "tpu_init_start_time": E_TPU_S,
    "tpu_init_end_time": E_TPU_E,
    "training_prep_start_time": E_PREP_S,
    "training_prep_end_time": E_PREP_E,
    "data_loading_start_time": E_DL_S,
    "data_loading_end_time": E_DL_E,
    "custom_badput_event_start_time": E_CB_S,
    "custom_badput_event_end_time": E_CB_E,
    "elastic_wait_start_time": E_WAIT_S,
    "elastic_wait_end_time": E_WAIT_E,
    "elastic_reinit_start_time": E_REINIT_S,
    "elastic_reinit_end_time": E_REINIT_E,
    "elastic_slice_counts_timestamp": E_SLICES,
}
MGM_KEYS = frozenset(_TIME_KEYS)
#: Orbax checkpoint-logger ``event_type`` values -> entry kind.
ORBAX_EVENTS = {"save": E_SAVE, "restore": E_RESTORE, "emergency_restore": E_RESTORE}
#: Start kind -> (span kind, name for messages); the end kind is start + 1.
_PAIRS = {
    E_TPU_S: (K_ACCELERATOR_INIT, "tpu_init"),
    E_PREP_S: (K_TRAINING_PREP, "training_prep"),
    E_DL_S: (K_DATA_LOADING, "data_loading"),
    E_CB_S: (K_CUSTOM_BADPUT, "custom_badput_event"),
    E_WAIT_S: (K_ELASTIC_WAIT, "elastic_wait"),
    E_REINIT_S: (K_ELASTIC_REINIT, "elastic_reinit"),
}
_STARTS = frozenset(_PAIRS)
#: (start key, duration keys in order of preference) per Orbax operation.
_SAVE_TIMES = (
    ("checkpoint_manager_blocking_start_time",
     ("checkpoint_manager_blocking_duration_secs", "checkpointer_blocking_duration_secs")),
    ("checkpointer_blocking_start_time",
     ("checkpointer_blocking_duration_secs", "checkpoint_manager_blocking_duration_secs")),
    ("wait_for_prev_start_time",
     ("checkpoint_manager_blocking_duration_secs", "checkpointer_blocking_duration_secs")),
)
_RESTORE_TIMES = (
    ("checkpoint_manager_start_time",
     ("checkpoint_manager_duration_secs", "checkpointer_duration_secs")),
    ("checkpointer_start_time", ("checkpointer_duration_secs", "checkpoint_manager_duration_secs")),
)
_MAX_S = 9.2e9  # |POSIX seconds| that fit int64 nanoseconds
_UNKNOWN_TYPE = "unknown"  # mgm's default custom badput event type


def is_mgm_payload(payload: dict) -> bool:
    """Whether a payload looks like an mgm recorder or Orbax checkpoint-logger entry."""
    return any(k in MGM_KEYS for k in payload) or payload.get("event_type") in ORBAX_EVENTS


@dataclass
class MgmResult:
    """What :func:`convert` produced: per job its spans; entries read; problems."""

    tables: dict[str, SpanTable] = field(default_factory=dict)
    entries: int = 0
    problems: Problems = field(default_factory=Problems)


class _Rows:
    """Entries read so far, as parallel compact columns (one row per timed entry)."""

    def __init__(self) -> None:
        self.kind = array("b")
        self.t = array("d")  # POSIX seconds
        self.job = array("q")  # index into jobs; -1 = no job name
        self.ival = array("q")  # step (steps, Orbax), else NONE
        self.dur = array("d")  # Orbax duration in seconds (-1: none); total slices
        self.sidx = array("q")  # custom badput / elastic wait type, available slices (index
        #                          into types of their text), else -1
        self.ts: list = []  # LogEntry timestamp string or None
        self.file = array("q")  # where the entry is: file index, line, array element
        self.line = array("q")
        self.element = array("q")
        self.jobs: dict[str, int] = {}
        self.types: dict[str, int] = {}

    def where(self, paths, i: int) -> str:
        return where(paths[self.file[i]], self.line[i], self.element[i])

    def append(self, kind, t, job, ival, dur, sidx, ts, fi, line, element) -> None:
        self.kind.append(kind)
        self.t.append(t)
        self.job.append(job)
        self.ival.append(ival)
        self.dur.append(dur)
        self.sidx.append(sidx)
        self.ts.append(ts)
        self.file.append(fi)
        self.line.append(line)
        self.element.append(element)


def _number(v) -> bool:
    t = type(v)
    return (t is float or t is int) and -_MAX_S < v < _MAX_S


def _read(paths: list[str], problems: Problems, progress) -> tuple[_Rows, int]:
    rows = _Rows()
    kinds, ts_, jobs_, ival_, dur_, sidx_, tss, file_, line_, element_ = (
        rows.kind.append, rows.t.append, rows.job.append, rows.ival.append, rows.dur.append,
        rows.sidx.append, rows.ts.append, rows.file.append, rows.line.append,
        rows.element.append)
    jobs, types = rows.jobs, rows.types
    time_keys = _TIME_KEYS
    source = Payloads(paths, problems, progress, "log entries")
    for fi, path, line, element, payload, logts in source:
        job = payload.get("job_name")
        if job is None:
            j = -1
        elif type(job) is str:
            j = jobs.get(job)
            if j is None:
                j = jobs[job] = len(jobs)
        else:
            problems.add(where(path, line, element), "wrong type",
                         f"job_name must be a string, got {job!r:.40}")
            continue
        found = False
        for key, v in payload.items():
            kind = time_keys.get(key)
            if kind is None:
                continue
            found = True
            if not _number(v):
                problems.add(where(path, line, element), "wrong type",
                             f"{key} must be POSIX seconds (a finite number), got {v!r:.40}")
                continue
            ival, sidx = NONE, -1
            if kind == E_STEP:
                step = as_int(payload.get("step_count"))
                if step is None:
                    why = "missing field" if "step_count" not in payload else "wrong type"
                    problems.add(where(path, line, element), why, "step_count must be an "
                                 f"integer, got {payload.get('step_count')!r:.40}")
                    continue
                ival = step
            elif kind in (E_CB_S, E_CB_E, E_WAIT_S, E_WAIT_E):
                tkey = ("custom_badput_event_type" if kind in (E_CB_S, E_CB_E)
                        else "elastic_wait_event_type")
                btype = payload.get(tkey, _UNKNOWN_TYPE)
                if type(btype) is not str:
                    problems.add(where(path, line, element), "wrong type",
                                 f"{tkey} must be a string, got {btype!r:.40}")
                    continue
                sidx = types.get(btype)
                if sidx is None:
                    sidx = types[btype] = len(types)
            dur = -1.0
            if kind == E_SLICES:
                counts = [as_int(payload.get(k, 0)) for k in
                          ("active_slices", "total_slices", "available_slices")]
                if None in counts:
                    problems.add(where(path, line, element), "wrong type",
                                 "active_slices, total_slices and available_slices must be "
                                 "integers")
                    continue
                ival, dur = counts[0], float(counts[1])
                text = str(counts[2])
                sidx = types.get(text)
                if sidx is None:
                    sidx = types[text] = len(types)
            kinds(kind)
            ts_(v)
            jobs_(j)
            ival_(ival)
            dur_(dur)
            sidx_(sidx)
            tss(logts)
            file_(fi)
            line_(line)
            element_(element)
        if not found:
            op = payload.get("event_type")
            if op in ORBAX_EVENTS:
                found = True
                r = _orbax(payload, ORBAX_EVENTS[op], problems, where(path, line, element))
                if r is not None:
                    rows.append(ORBAX_EVENTS[op], r[0], j, r[2], r[1], -1, logts, fi, line,
                                element)
        if not found:
            keys = ", ".join(sorted(map(str, payload))[:6])
            problems.add(where(path, line, element), "unknown payload",
                         f"no ml-goodput-measurement key (keys: {keys or 'none'})")
    return rows, source.entries


def _orbax(payload: dict, kind: int, problems: Problems, at: str):
    """(start s, duration s, step) of an Orbax entry, or None (problem counted)."""
    op = payload.get("event_type")
    for start_key, dur_keys in (_SAVE_TIMES if kind == E_SAVE else _RESTORE_TIMES):
        start = payload.get(start_key)
        if start is None:
            continue
        if not _number(start):
            problems.add(at, "wrong type", f"{start_key} must be POSIX seconds, got "
                         f"{start!r:.40}")
            return None
        dur = -1.0
        for dk in dur_keys:
            d = payload.get(dk)
            if d is None:
                continue
            if not _number(d) or d < 0 or start + d >= _MAX_S:
                problems.add(at, "wrong type", f"{dk} must be seconds >= 0, got {d!r:.40}")
                return None
            dur = float(d)
            break
        if dur < 0:
            problems.add(at, "no duration", f"Orbax {op} entry without a duration; "
                         "imported as a zero-length span")
            dur = 0.0
        step = payload.get("step")
        ival = NONE
        if step is not None:
            ival = as_int(step)
            if ival is None:
                problems.add(at, "wrong type", f"step must be an integer, got {step!r:.40}")
                return None
        return start, dur, ival
    keys = " or ".join(k for k, _ in (_SAVE_TIMES if kind == E_SAVE else _RESTORE_TIMES))
    problems.add(at, "no start time", f"Orbax {op} entry without {keys}: cannot be placed "
                 "on the timeline")
    return None


def _to_ns(seconds: np.ndarray) -> np.ndarray:
    """POSIX seconds (float64) -> int64 ns, to the nearest ns of the float's value."""
    whole = np.floor(seconds)
    return whole.astype(np.int64) * 1_000_000_000 + np.rint(
        (seconds - whole) * 1e9).astype(np.int64)


def convert(paths: list[str], *, job: str | None = None, progress=None) -> MgmResult:
    """Read mgm log files and build one :class:`SpanTable` per job.

    Args:
        paths: input files (JSON lines or a JSON array; LogEntry objects or payloads).
        job: import only this job; entries without ``job_name`` (Orbax) belong to it.
            None: every job; entries without ``job_name`` belong to the only job.
        progress: optional ``callback(nbytes)`` while reading.

    Returns:
        An :class:`MgmResult` (tables of jobs without any span are left out).

    Raises:
        InputError: a file cannot be read or is empty; ``job`` is given and not in the
            input; entries name no job at all and ``job`` is None.
    """
    problems = Problems()
    rows, entries = _read(paths, problems, progress)
    result = MgmResult(entries=entries, problems=problems)
    if not rows.kind:
        return result
    names = {i: n for n, i in rows.jobs.items()}
    jobcol = np.array(rows.job, np.int64)
    if job is not None:
        if job not in rows.jobs and rows.jobs:
            raise InputError(f"job {job!r} is not in the input (jobs: "
                             f"{', '.join(sorted(rows.jobs))})")
        target = rows.jobs.get(job, len(rows.jobs))
        names[target] = job
        other = (jobcol != target) & (jobcol != -1)
        jobcol = np.where(other, -2, target)  # -2: another job, left out
    elif len(rows.jobs) == 1:
        jobcol[jobcol == -1] = 0
    elif not rows.jobs:
        raise InputError("no entry names its job (no job_name): pass --job NAME")
    else:
        for i in np.flatnonzero(jobcol == -1).tolist():
            problems.add(rows.where(paths, i), "no job name",
                         f"entry without job_name in an input of {len(rows.jobs)} jobs: "
                         "import it with --job NAME")
    t = np.frombuffer(rows.t, np.float64)
    kind = np.frombuffer(rows.kind, np.int8).astype(np.int64)
    ival = np.frombuffer(rows.ival, np.int64)
    dur = np.frombuffer(rows.dur, np.float64)
    sidx = np.frombuffer(rows.sidx, np.int64)
    types = list(rows.types)
    ties = _tie_keys(t, kind, jobcol, rows.ts)
    rows.ts = []  # only needed for the ties
    for j in sorted(set(np.unique(jobcol).tolist()) - {-1, -2}):
        sel = np.flatnonzero(jobcol == j)
        table = _job_spans(sel, t[sel], ties[sel], kind[sel], ival[sel], dur[sel], sidx[sel],
                           rows, types, paths, problems)
        if len(table):
            result.tables[names[j]] = table
    return result


def _tie_keys(t: np.ndarray, kind: np.ndarray, job: np.ndarray, ts: list) -> np.ndarray:
    """Secondary sort key: the LogEntry timestamp (ns) of entries whose order matters and
    whose payload time ties with another such entry of the same job and family (steps;
    one start/end kind), else 0."""
    family = np.where(kind == E_STEP, E_STEP, -1)
    pair = ((kind >= E_TPU_S) & (kind <= E_CB_E)) | ((kind >= E_WAIT_S) & (kind <= E_REINIT_E))
    family[pair] = kind[pair] - (kind[pair] - E_TPU_S) % 2  # the start kind
    family[family >= 0] += job[family >= 0] * 32
    keys = np.zeros(len(t), np.int64)
    order = np.lexsort((family, t))
    st, sf = t[order], family[order]
    eq = (st[1:] == st[:-1]) & (sf[1:] == sf[:-1]) & (sf[1:] >= 0)
    if not eq.any():
        return keys
    tie = np.zeros(len(t), bool)
    tie[1:] |= eq
    tie[:-1] |= eq
    for k in order[tie].tolist():
        text = ts[k]
        if isinstance(text, str):
            try:
                keys[k] = iso_to_ns(text)
            except (ValueError, TypeError, OverflowError):
                pass
    return keys


def _job_spans(sel, t, ties, kind, ival, dur, sidx, rows: _Rows, types, paths,
               problems) -> SpanTable:
    """Spans of one job from its entries (arrays are this job's rows, in input order)."""
    order = np.lexsort((np.arange(len(t)), ties, t))
    sel, t, kind, ival, dur, sidx = sel[order], t[order], kind[order], ival[order], \
        dur[order], sidx[order]
    tns = _to_ns(t)
    table = SpanTable()

    def at(k: int) -> str:
        return rows.where(paths, int(sel[k]))

    # Attempts: the k-th job start begins attempt k.
    is_js = kind == E_JOB_START
    js_t = tns[is_js]
    att = np.maximum(np.searchsorted(js_t, tns, side="right") - 1, 0)
    att[is_js] = np.arange(int(is_js.sum()))
    table.add_many(att[is_js], 0, K_JOB_START, js_t, js_t)
    is_je = kind == E_JOB_END
    explicit = table.string("explicit")
    table.add_many(att[is_je], 0, K_JOB_END, tns[is_je], tns[is_je], sidx=explicit)
    natt = int(att.max()) + 1
    job_end = np.full(natt, NONE, np.int64)
    np.maximum.at(job_end, att[is_je], tns[is_je])

    # Steps: from one step start to the next in the same attempt.
    is_step = kind == E_STEP
    ss, sa = tns[is_step], att[is_step]
    if len(ss):
        ends = np.empty_like(ss)
        same = sa[1:] == sa[:-1]
        ends[:-1] = np.where(same, ss[1:], NONE)
        ends[-1] = NONE
        last = ends == NONE
        ends[last] = np.maximum(job_end[sa[last]], ss[last])  # no job end: zero-length
        table.add_many(sa, 0, K_STEP, ss, ends, ival=ival[is_step])

    # Start/end pairs: an end closes the latest open start of its kind (and type).
    paired = np.flatnonzero(((kind >= E_TPU_S) & (kind <= E_CB_E))
                            | ((kind >= E_WAIT_S) & (kind <= E_REINIT_E)))
    open_: dict[tuple, list[int]] = {}
    out: dict[tuple, tuple[list, list, list]] = {}
    for k, e, a, s in zip(paired.tolist(), kind[paired].tolist(), att[paired].tolist(),
                          sidx[paired].tolist(), strict=True):
        if e in _STARTS:
            open_.setdefault((a, e, s), []).append(k)
            continue
        stack = open_.get((a, e - 1, s))
        if not stack:
            what = _PAIRS[e - 1][1] + (f" ({types[s]!r})" if s >= 0 else "")
            problems.add(at(k), "end without start", f"{what} end with no open start in "
                         f"attempt {a}")
            continue
        j = stack.pop()
        starts, ends, attempts = out.setdefault((_PAIRS[e - 1][0], s), ([], [], []))
        starts.append(int(tns[j]))
        ends.append(int(tns[k]))
        attempts.append(a)
    for (a, e, s), stack in open_.items():
        for j in stack:
            what = _PAIRS[e][1] + (f" ({types[s]!r})" if s >= 0 else "")
            problems.add(at(j), "start never ended", f"{what} start with no end in attempt {a}")
    for (span_kind, s), (starts, ends, attempts) in sorted(out.items()):
        table.add_many(attempts, 0, span_kind, starts, ends,
                       sidx=table.string(types[s]) if s >= 0 else -1)

    # Orbax checkpoint operations.
    for e, span_kind in ((E_SAVE, K_CHECKPOINT_SAVE), (E_RESTORE, K_CHECKPOINT_RESTORE)):
        m = kind == e
        if m.any():
            d = np.rint(dur[m] * 1e9).astype(np.int64)
            table.add_many(att[m], 0, span_kind, tns[m], tns[m] + d, ival=ival[m])

    # Elastic slice counts: zero-length markers (total in dur, available in sidx).
    m = np.flatnonzero(kind == E_SLICES)
    if len(m):
        table.add_many(att[m], 0, K_ELASTIC_SLICES, tns[m], tns[m], ival=ival[m],
                       aux=dur[m].astype(np.int64),
                       sidx=[table.string(types[x]) for x in sidx[m].tolist()])
    return table
