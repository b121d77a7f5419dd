"""``resiliency.goodput_measure`` event logs -> goodput spans.

Input: JSON lines ``{"timestamp": ISO 8601, "job_name", "event_type", ["node_rank"],
["step"]}`` (also inside a Cloud Logging ``LogEntry``'s ``jsonPayload``). Times without
an offset are local times of the writer, read in the given time zone (default UTC), to the
microsecond; spans get integer nanoseconds. Event types: ``user_scheduled``,
``job_started``, ``checkpoint_loaded``, ``checkpoint_saved``, ``user_terminated``,
``job_terminated``. Every node writes ``job_started``/``job_terminated`` with its
``node_rank`` (= process index); checkpoint events without one belong to node 0.

Conversion (events sorted by time, ties in the order of the event types above; identical
events, a line written twice, are kept once and counted as duplicates):

- attempts: found from per-node evidence by :class:`.resiliency_attempts.AttemptFinder`: a
  node that logs ``job_started`` again begins a new attempt (a restart, whether or not
  anything logged ``job_terminated``) unless the repeat is a duplicate line (within
  ``duplicate_window_s`` of its start with nothing of the attempt in between); the first
  ``job_started`` and the first after a ``job_terminated`` also begin one; other nodes'
  starts join the open attempt. Every other event belongs to its node's current attempt.
  Per node and attempt the first start and the last termination become
  ``goodput.job_start`` / ``goodput.job_end`` (reason ``exit``) markers; a node that logged
  no termination gets no end marker (the processor ends a killed attempt at its last span).
- ``user_scheduled`` before the first start: a ``goodput.job_start`` marker of attempt 0 on
  process 0 and a ``goodput.custom_badput`` span of type ``scheduling`` up to the first
  ``job_started``. ``user_terminated``: ``goodput.job_end`` (reason ``explicit``) on
  process 0 of the open attempt.
- ``checkpoint_loaded`` step S at t: the log has no restore duration, so the time from the
  node's start in its attempt to t (start-up, initialisation and the restore together) is
  a ``goodput.custom_badput`` span of type ``startup_and_restore`` for S > 0, and
  ``goodput.training_prep`` for S = 0 (a fresh start); the restore itself is a zero-length
  ``goodput.checkpoint_restore`` (step S) at t, which gives the attempt's resume step.
- ``checkpoint_saved`` step S at t: a zero-length blocking ``goodput.checkpoint_save`` at t
  (the log has no duration) and, when S is above the previous checkpoint step, a
  ``goodput.step`` span (step S, ``goodput.step.count`` = S - previous) from the process's
  previous checkpoint event (or its attempt start, with the step of the latest save of
  earlier attempts) to t.

Problems: ``not JSON``, ``not an object``, ``unknown event type``, ``wrong type``,
``missing field``, ``no job name``, ``event before job start``, ``ignored event``, and the
attempt warnings ``ambiguous restart`` and ``restart without job_started``.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo

import numpy as np

from .common import InputError, Payloads, Problems, as_int, iso_to_ns, where
from .resiliency_attempts import DEFAULT_DUPLICATE_WINDOW_S, AttemptFinder
from .writer import (
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    K_CUSTOM_BADPUT,
    K_JOB_END,
    K_JOB_START,
    K_STEP,
    K_TRAINING_PREP,
    NONE,
    SpanTable,
)

__all__ = ["EVENT_TYPES", "SCHEDULING", "STARTUP_AND_RESTORE", "ResiliencyResult", "convert",
           "is_resiliency_payload"]

#: Event types in their tie order (events at the same time are taken in this order).
EVENT_TYPES = ("user_scheduled", "job_started", "checkpoint_loaded", "checkpoint_saved",
               "user_terminated", "job_terminated")
(USER_SCHEDULED, JOB_STARTED, CHECKPOINT_LOADED, CHECKPOINT_SAVED, USER_TERMINATED,
 JOB_TERMINATED) = range(len(EVENT_TYPES))
_RANK = {name: i for i, name in enumerate(EVENT_TYPES)}
_MIN_NS, _MAX_NS = -(2**63), 2**63  # times that fit int64 nanoseconds
_EPOCH_NAIVE = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)
#: ``goodput.badput.type`` of the time from ``user_scheduled`` to the first start.
SCHEDULING = "scheduling"
#: ``goodput.badput.type`` of the time from a node's start to ``checkpoint_loaded`` of a
#: step > 0 (start-up, initialisation and the restore together; the log has no duration).
STARTUP_AND_RESTORE = "startup_and_restore"


def is_resiliency_payload(payload: dict, logentry_timestamp=None) -> bool:
    """Whether a payload looks like a resiliency event (known type and a string time)."""
    ts = payload.get("timestamp", logentry_timestamp)
    return payload.get("event_type") in _RANK and isinstance(ts, str)


@dataclass
class ResiliencyResult:
    """What :func:`convert` produced: per job its spans and process count; counts."""

    tables: dict[str, SpanTable] = field(default_factory=dict)
    process_counts: dict[str, int] = field(default_factory=dict)
    entries: int = 0
    duplicates: int = 0
    problems: Problems = field(default_factory=Problems)


class _Events:
    """Events read so far, as parallel compact columns."""

    def __init__(self) -> None:
        self.t = array("q")  # ns since the epoch
        self.rank = array("b")  # event type (index into EVENT_TYPES)
        self.node = array("q")  # -1: none given
        self.step = array("q")  # -1: none given
        self.job = array("q")  # index into jobs; -1: no job name
        self.file = array("q")
        self.line = array("q")
        self.element = array("q")
        self.jobs: dict[str, int] = {}

    def where(self, paths, i: int) -> str:
        return where(paths[self.file[i]], self.line[i], self.element[i])


def _read(paths, tz: tzinfo | None, problems: Problems, progress) -> tuple[_Events, int]:
    ev = _Events()
    t_, rank_, node_, step_, job_, file_, line_, element_ = (
        ev.t.append, ev.rank.append, ev.node.append, ev.step.append, ev.job.append,
        ev.file.append, ev.line.append, ev.element.append)
    jobs = ev.jobs
    ranks = _RANK
    fromiso, epoch, us = datetime.fromisoformat, _EPOCH_NAIVE, _US
    utc = tz is None or tz is timezone.utc
    source = Payloads(paths, problems, progress, "events")
    for fi, path, line, element, payload, logts in source:
        et = payload.get("event_type")
        rank = ranks.get(et) if type(et) is str else None
        if rank is None:
            problems.add(where(path, line, element), "unknown event type",
                         f"event_type {et!r:.40} is not one of {', '.join(EVENT_TYPES)}"
                         if "event_type" in payload else "no event_type")
            continue
        ts = payload.get("timestamp", logts)
        try:
            dt = fromiso(ts)  # the common case: a naive local time in UTC
            if dt.tzinfo is None and utc:
                t = (dt - epoch) // us * 1000
            else:
                t = iso_to_ns(ts, tz)
        except (ValueError, TypeError, OverflowError, AttributeError):
            try:
                t = iso_to_ns(ts, tz)
            except (ValueError, TypeError, OverflowError, AttributeError):
                t = None
        if t is None or not _MIN_NS < t < _MAX_NS:
            why = "missing field" if ts is None else "wrong type"
            problems.add(where(path, line, element), why, "timestamp must be an ISO 8601 "
                         f"date-time string (years 1678-2261), got {ts!r:.40}")
            continue
        node = payload.get("node_rank")
        if node is not None:
            node = as_int(node)
            if node is None or node < 0:
                problems.add(where(path, line, element), "wrong type", "node_rank must "
                             f"be an integer >= 0, got {payload.get('node_rank')!r:.40}")
                continue
        else:
            node = -1
        step = payload.get("step")
        if rank == CHECKPOINT_LOADED or rank == CHECKPOINT_SAVED:
            s = as_int(step)
            if s is None or s < 0:
                why = "missing field" if step is None else "wrong type"
                problems.add(where(path, line, element), why,
                             f"{et} needs a step (an integer >= 0), got {step!r:.40}")
                continue
            step = s
        else:
            step = -1
        name = payload.get("job_name")
        if name is None:
            j = -1
        elif type(name) is str:
            j = jobs.get(name)
            if j is None:
                j = jobs[name] = len(jobs)
        else:
            problems.add(where(path, line, element), "wrong type",
                         f"job_name must be a string, got {name!r:.40}")
            continue
        t_(t)
        rank_(rank)
        node_(node)
        step_(step)
        job_(j)
        file_(fi)
        line_(line)
        element_(element)
    return ev, source.entries


def convert(paths: list[str], *, tz: tzinfo | None = None, job: str | None = None,
            duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S,
            progress=None) -> ResiliencyResult:
    """Read resiliency event logs and build one :class:`SpanTable` per job.

    Args:
        paths: JSON-lines event logs.
        tz: time zone of timestamps without an offset (None = UTC).
        job: import only this job (events without ``job_name`` belong to it); None: every
            job (events without ``job_name`` belong to the only job).
        duplicate_window_s: seconds within which a node's repeated ``job_started``, with
            nothing of its attempt in between, is a duplicate line rather than a restart
            (:mod:`.resiliency_attempts`).
        progress: optional ``callback(nbytes)`` while reading.

    Raises:
        InputError: a file cannot be read or is empty; ``job`` is not in the input; no event
            names a job and ``job`` is None.
        ValueError: ``duplicate_window_s`` is not a finite number >= 0.
    """
    if not (isinstance(duplicate_window_s, (int, float))
            and 0 <= duplicate_window_s < float("inf")):
        raise ValueError("the duplicate window must be a number of seconds >= 0, got "
                         f"{duplicate_window_s!r}")
    problems = Problems()
    ev, entries = _read(paths, tz, problems, progress)
    result = ResiliencyResult(entries=entries, problems=problems)
    if not ev.t:
        return result
    names = {i: n for n, i in ev.jobs.items()}
    jobcol = np.array(ev.job, np.int64)
    if job is not None:
        if job not in ev.jobs and ev.jobs:
            raise InputError(f"job {job!r} is not in the input (jobs: "
                             f"{', '.join(sorted(ev.jobs))})")
        target = ev.jobs.get(job, len(ev.jobs))
        names[target] = job
        jobcol = np.where((jobcol != target) & (jobcol != -1), -2, target)
    elif len(ev.jobs) == 1:
        jobcol[jobcol == -1] = 0
    elif not ev.jobs:
        raise InputError("no event names its job (no job_name): pass --job NAME")
    else:
        for i in np.flatnonzero(jobcol == -1).tolist():
            problems.add(ev.where(paths, i), "no job name",
                         f"event without job_name in an input of {len(ev.jobs)} jobs: "
                         "import it with --job NAME")
    t = np.frombuffer(ev.t, np.int64)
    rank = np.frombuffer(ev.rank, np.int8)
    node = np.frombuffer(ev.node, np.int64)
    step = np.frombuffer(ev.step, np.int64)
    window_ns = round(duplicate_window_s * 1e9)
    for j in sorted(set(np.unique(jobcol).tolist()) - {-1, -2}):
        sel = np.flatnonzero(jobcol == j)
        sel = sel[np.lexsort((sel, step[sel], node[sel], rank[sel], t[sel]))]
        # identical events (a line written or shipped twice) are kept once
        same = ((t[sel[1:]] == t[sel[:-1]]) & (rank[sel[1:]] == rank[sel[:-1]])
                & (node[sel[1:]] == node[sel[:-1]]) & (step[sel[1:]] == step[sel[:-1]]))
        if same.any():
            result.duplicates += int(same.sum())
            sel = sel[np.concatenate(([True], ~same))]
        table, nproc, dups = _job_spans(sel.tolist(), ev, paths, problems, window_ns)
        result.duplicates += dups
        if len(table):
            result.tables[names[j]] = table
            result.process_counts[names[j]] = nproc
    return result


def _job_spans(order: list[int], ev: _Events, paths, problems: Problems, window_ns: int):
    """Spans of one job from its events (``order``: row indexes sorted by time and type)."""
    table = SpanTable()
    add = table.add
    t_, rank_, node_, step_ = ev.t, ev.rank, ev.node, ev.step
    put = table._buf.extend  # the hot path of table.add (step and save spans)

    def at(i: int) -> str:
        return ev.where(paths, i)

    found = AttemptFinder(window_ns)
    starts = found.starts
    prev: dict[tuple, tuple] = {}  # (attempt, node) -> (time, step) of last checkpoint event
    last_save: dict[int, tuple] = {}  # attempt -> (time, step) of its latest save
    startup = -1  # string index of STARTUP_AND_RESTORE, once used
    scheduled = None
    nodes: set[int] = set()
    for i in order:
        r, t = rank_[i], t_[i]
        node = node_[i]
        p = 0 if node < 0 else node
        if r == JOB_STARTED:
            nodes.add(p)
            why = found.start(p, t)
            if why is not None:
                problems.add(at(i), why, f"job_started of node {p} within the duplicate "
                             "window of its previous start, after a checkpoint, termination "
                             "or restart of the job in between: taken as a restart")
            continue
        if r == USER_SCHEDULED:
            if found.open >= 0 or scheduled is not None:
                problems.add(at(i), "ignored event", "user_scheduled after the first "
                             "user_scheduled or job_started")
            else:
                scheduled = t
            continue
        if r == JOB_TERMINATED or r == USER_TERMINATED:
            if found.open < 0:
                problems.add(at(i), "event before job start",
                             f"{EVENT_TYPES[r]} before any job_started: ignored")
            elif r == JOB_TERMINATED:
                nodes.add(p)
                found.terminate(p, t)
            else:
                nodes.add(0)
                add(found.open, 0, K_JOB_END, t, t, sidx=table.string("explicit"))
            continue
        # checkpoint_loaded / checkpoint_saved of node p, in its attempt
        nodes.add(p)
        attempt, why = found.checkpoint(p, t, r == CHECKPOINT_LOADED)
        key = (attempt, p)
        begin = starts.get(key)
        if begin is None:
            begin = found.first_start(attempt)
        if why is not None:
            problems.add(at(i), why, f"a second checkpoint_loaded of node {p} in one attempt "
                         "and no job_started before it: a new attempt begins here")
            begin = t
        elif (begin is None or begin > t) and (r == CHECKPOINT_LOADED or key not in prev):
            if attempt == 0 and scheduled is not None and scheduled <= t and begin is None:
                begin = scheduled
            else:
                problems.add(at(i), "event before job start",
                             f"{EVENT_TYPES[r]} of process {p} at a time no job_started "
                             f"of attempt {attempt} precedes: its span starts at the event")
                begin = t
        step = step_[i]
        if r == CHECKPOINT_LOADED:
            if step > 0:
                if startup < 0:
                    startup = table.string(STARTUP_AND_RESTORE)
                add(attempt, p, K_CUSTOM_BADPUT, begin, t, sidx=startup)
            else:
                add(attempt, p, K_TRAINING_PREP, begin, t)
            add(attempt, p, K_CHECKPOINT_RESTORE, t, t, ival=step)
        else:  # CHECKPOINT_SAVED
            pt, ps = prev.get(key) or (begin, _saved_before(last_save, attempt))
            if step > ps:
                put((attempt, p, K_STEP, min(pt, t), t, step, step - ps, -1))
            put((attempt, p, K_CHECKPOINT_SAVE, t, t, step, NONE, -1))
            last_save[attempt] = (t, step)
            step = max(step, ps)  # a save of an older step does not move progress back
        prev[key] = (t, step)
    for (a, p), t in starts.items():
        add(a, p, K_JOB_START, t, t)
    exit_reason = table.string("exit") if found.ends else -1
    for (a, p), t in found.ends.items():
        add(a, p, K_JOB_END, t, t, sidx=exit_reason)
    if scheduled is not None:
        nodes.add(0)
        add(0, 0, K_JOB_START, scheduled, scheduled)
        first = found.first_start(0) if found.open >= 0 else None
        if first is not None and first > scheduled:
            add(0, 0, K_CUSTOM_BADPUT, scheduled, first, sidx=table.string(SCHEDULING))
    return table, len(nodes), found.duplicates


def _saved_before(last_save: dict[int, tuple], attempt: int) -> int:
    """The step of the latest save (by time) of the attempts before ``attempt``; 0: none."""
    best = None
    for a, ts in last_save.items():
        if a < attempt and (best is None or ts > best):
            best = ts
    return 0 if best is None else best[1]
