"""Recovery broken into phases: where the time of each disruption went (``docs/accounting.md``,
"Recovery phases").

For each disruption (an attempt followed by another), the time from the failed attempt's last
progress to the next attempt's first kept step, plus the excess of that attempt's first steps,
is cut into seven phases, in order (when the next attempt was itself thrown away, its
phases end where its own wasted region starts: see "windows" below):

==========================  ===================================================================
phase                       from -> to (all times ns since the epoch)
==========================  ===================================================================
``detection``               last progress (the latest step end of any process of the failed
                            attempt) -> the first sign of failure: the earliest of its
                            processes' end markers, exception spans, or last signs of life (a
                            process that left no end marker: its heartbeats stopped); with a
                            launcher's failure event, the process it saw fail first
                            (processes that fell silent within one heartbeat interval of
                            each other: :attr:`FirstFailure.uncertain_among`)
``termination``             -> the failed attempt's end: its last process gone (when processes
                            completed steps after the first sign of failure, detection is 0
                            and termination runs from the last progress)
``rescheduling``            -> the next attempt's start: its first OS process started (equals
                            that disruption's ``infrastructure_recovery``)
``startup``                 -> the next attempt's primary process's first phase (its
                            ``process_startup``: interpreter, imports, ``configure``)
``rendezvous_init``         the rest of the time before its first kept step that is neither a
                            restore nor compilation: ``init_process_group`` /
                            ``jax.distributed.initialize`` (accelerator init), training prep,
                            unmarked gaps
``restore``                 its ``goodput.checkpoint_restore`` time before the first kept step
``recompilation_warmup``    its ``goodput.program_startup`` time before the first kept step and
                            inside its warm-up steps, plus the warm-up steps' excess: its
                            leading kept steps slower than the attempt's level (the larger of
                            the ideal step time and its median step time) by more than the
                            noise band, each by its time above that level (:func:`warmup`)
==========================  ===================================================================

The phases partition that stretch exactly: detection + termination is the failed attempt's time
after its last progress (inside its ``wasted_progress``), rescheduling is the gap's
``infrastructure_recovery``, startup is the next attempt's ``process_startup``, and the last
three split the next attempt's ``accelerator_init``, ``training_prep``,
``checkpoint_restore``, ``program_startup``, ``other`` before its first kept step and the
warm-up part of its ``training_slowdown``. The buckets do not change. A phase the evidence
cannot show is None ("unknown"): detection without any completed step in the failed attempt;
restore when the next attempt resumed past step 0 without recording a restore (its time is
then inside ``rendezvous_init``).

Each disruption owns a window of the timeline (:attr:`Recovery.window_ns`): from the start of
the failed attempt's wasted region (its end without one) to the next attempt's first kept
step or the start of that attempt's own wasted region, whichever is first. Detection and
termination start no earlier than the wasted region; the phases from startup on end at the
window's end. The windows of a job do not overlap, so no second of badput is in two
disruptions (:mod:`.attribution` charges each once).

Evidence of launchers and schedulers refines it where the job has it (schema 1.3): torchelastic
events written by ``python -m goodput.torchrun`` (the worker the agent saw fail, its exit code:
negative = killed by that signal; the agent's rendezvous) and Kubernetes pod times on the
resource (pod created, scheduled, container started), reported in :attr:`Recovery.evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from goodput import schema

from ..model.memo import CHUNK_ROWS, cached, proc_key
from ..model.restart_rows import restart_rows, union_ns
from ..read.rows import (
    C_END,
    C_FLAGS,
    C_KIND,
    C_SIDX,
    C_START,
    F_ENDLESS,
    F_ERROR,
    F_NONBLOCKING,
    K_JOB_END,
    K_JOB_START,
    K_STEP,
    NCOLS,
    JobSpans,
    is_phase,
)
from .launcher_events import _failures, _launcher_events, launcher_rendezvous
from .warmup import warmup

__all__ = ["EVIDENCE", "HOWS", "ONE_PROCESS_INIT", "PHASES", "FirstFailure", "Recovery",
           "recovery_report", "stacked"]

#: Recovery phases, in order.
PHASES = ("detection", "termination", "rescheduling", "startup", "rendezvous_init", "restore",
          "recompilation_warmup")
#: What ``rendezvous_init`` is called (:attr:`Recovery.labels`) when the attempt that took
#: over had one process: no rendezvous took place, only its initialisation (the key of
#: :attr:`Recovery.phases` stays ``rendezvous_init``).
ONE_PROCESS_INIT = "initialization"
#: How a process failed: an exception (end marker ``exception``, a span with ERROR status, or
#: a non-zero exit status a launcher saw), a signal (a launcher saw it killed by one; an end
#: marker ``sigterm`` of recorders before 1.1), a missing heartbeat (no end marker: the
#: process fell silent, killed or hung; only a launcher's event can tell which), or an end
#: (a clean end marker: ``exit``, ``explicit``, ``restart``).
HOWS = ("exception", "signal", "missing_heartbeat", "end")
#: What a first failure (and the disruption's charge to its process) rests on: ``observed``
#: (an exception span, an end marker, or a launcher's event: exit code or signal) or
#: ``inferred`` (only the process's last sign of life: it fell silent, and nothing recorded
#: says it failed).
EVIDENCE = ("observed", "inferred")
_NS = 1_000_000_000


@dataclass(frozen=True)
class FirstFailure:
    """The process of a failed attempt that failed first.

    ``process``: its rank; ``host``: ``host.name`` (None if unknown); ``how``: one of
    :data:`HOWS`; ``at_ns``: the first sign of its failure (ns since the epoch: its end
    marker, exception span end or last sign of life). ``uncertain_among``: the ranks of the
    other processes that may as well have failed first (empty when the evidence settles it):
    it fell silent, and so did they, each within one heartbeat interval after its last sign
    of life, with no launcher event or end marker to order them (the report's
    ``first_failure_uncertain`` warning). ``evidence``: one of :data:`EVIDENCE`:
    ``inferred`` when ``how`` is ``missing_heartbeat`` (its last sign of life only), else
    ``observed``. A process whose only records are its start markers (an imported log's
    node that logged nothing else) is never taken to have failed first; when every process
    of the attempt is such, none is: ``process`` and ``host`` are None, ``at_ns`` the
    latest start, and the disruption is charged to no host.
    """

    process: int | None
    host: str | None
    how: str
    at_ns: int
    uncertain_among: tuple[int, ...] = ()
    evidence: str = "observed"


@dataclass(frozen=True)
class Recovery:
    """One disruption: ``attempt`` failed and ``next_attempt`` took over.

    ``phases``: seconds per name of :data:`PHASES`, in that order, None where unknown.
    ``first_failure``: the process that failed first (:class:`FirstFailure`). ``lost_s``:
    seconds of badput the disruption caused: the failed attempt's wasted region (from its last
    kept step to its end) plus the next attempt's rescheduling, startup, initialisation,
    restore and warm-up. ``evidence``: what launchers and schedulers add, in seconds (present
    keys only): ``launcher_detected_after_s`` (the launcher saw the failure this long after
    its first sign), ``launcher_rendezvous_s`` (the launchers' rendezvous before the next
    attempt started, inside rescheduling: :func:`launcher_rendezvous`; absent only when no
    launcher recorded one), ``pod_created_after_s`` (the next attempt's first pod created this long
    after the failed attempt's end), ``pod_queued_s`` (created -> scheduled),
    ``pod_start_s`` (scheduled -> its first process start). ``lost_ns``: ``lost_s`` in
    integer ns. ``window_ns``: ``(start, end)`` ns since the epoch, the stretch of the
    timeline that the disruption owns: from the failed attempt's wasted region's start (its
    end when it has none) to the next attempt's first kept step or its own wasted region's
    start, whichever is first. The windows of a job's recoveries do not overlap, and every
    phase but the warm-up steps' excess lies inside its window (``docs/accounting.md``,
    "Recovery phases"); ``lost_ns`` is the window's length plus that excess and the
    compilation inside the warm-up steps.
    """

    attempt: int
    phases: dict
    first_failure: FirstFailure
    next_attempt: int = -1
    lost_s: float = 0.0
    evidence: dict = field(default_factory=dict)
    lost_ns: int = 0
    window_ns: tuple[int, int] = (0, 0)
    #: The name to show for a phase where it is not its key in :attr:`phases`:
    #: ``{"rendezvous_init": "initialization"}`` when the next attempt had one process
    #: (:data:`ONE_PROCESS_INIT`), else empty.
    labels: dict = field(default_factory=dict)

    def label(self, phase: str) -> str:
        """The name to show for ``phase`` (a key of :attr:`phases`) in this record."""
        return self.labels.get(phase, phase)

    @property
    def total_s(self) -> float:
        """Sum of the known phases (seconds)."""
        return sum(v for v in self.phases.values() if v is not None)




def stacked(a) -> tuple[np.ndarray, np.ndarray, list]:
    """All rows of attempt ``a``'s processes in one array, the index of each row's process
    (into the returned list of processes with rows), and that list."""
    procs = [p for p in a.processes if len(p.data)]
    if not procs:
        return np.zeros((0, NCOLS), np.int64), np.zeros(0, np.int64), procs
    if len(procs) == 1:  # the rows themselves, not a copy, and one index (both read only)
        return procs[0].data, np.broadcast_to(np.int64(0), (len(procs[0].data),)), procs
    lengths = np.fromiter((len(p.data) for p in procs), np.int64, len(procs))
    return (np.concatenate([p.data for p in procs]),
            np.repeat(np.arange(len(procs)), lengths), procs)


def _first_failure(job: JobSpans, a, failures, rows) -> FirstFailure:
    """The process of attempt ``a`` that failed first (see the module docstring)."""
    d, key, procs = rows
    if not procs:  # pragma: no cover - an attempt always has a process with spans
        return FirstFailure(a.primary.index, a.primary.host, "missing_heartbeat", a.end_ns,
                            (), "inferred")
    n = len(procs)
    kinds = d[:, C_KIND]
    # last sign of life of each process: rows are stacked process by process (key sorted)
    t = np.maximum.reduceat(d[:, C_END], np.searchsorted(key, np.arange(n)))
    how = np.full(n, 2, np.int8)  # index into HOWS: missing_heartbeat
    ends = np.flatnonzero(kinds == K_JOB_END)
    if len(ends):
        o = ends[np.lexsort((d[ends, C_END], key[ends]))]
        last = o[np.append(key[o][1:] != key[o][:-1], True)]  # the latest end marker each
        t[key[last]] = d[last, C_END]
        for r in last:
            sidx = int(d[r, C_SIDX])
            reason = job.strings[sidx] if 0 <= sidx < len(job.strings) else "unspecified"
            how[key[r]] = {"exception": 0, "sigterm": 1}.get(reason, 3)
    err = np.empty(len(d), bool)  # (CHUNK_ROWS rows at a time: no int64 temporary)
    for i in range(0, len(d), CHUNK_ROWS):
        b = d[i : i + CHUNK_ROWS]
        err[i : i + CHUNK_ROWS] = ((b[:, C_FLAGS] & F_ERROR) != 0) & is_phase(b[:, C_KIND])
    if err.any():
        first_err = np.full(n, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first_err, key[err], d[err, C_END])
        hit = first_err <= t
        t[hit], how[hit] = first_err[hit], 0
    t = np.clip(t, a.start_ns, a.end_ns)
    # when the launcher saw it fail: others followed it. A worker it saw first goes first: an
    # agent that sees one worker die stops the rest and reports them in the same pass, after
    # it (torchelastic's SubprocessContext._poll), and a worker it stopped may have fallen
    # silent before the one that died
    seen_at = np.full(n, np.iinfo(np.int64).max, np.int64)
    if failures:
        for i, p in enumerate(procs):
            seen = failures.get((p.host, p.pid)) if p.pid is not None else None
            if seen is not None:
                seen_at[i] = seen[0]
                if how[i] in (2, 3):
                    how[i] = 1 if seen[1] < 0 else 0
    rank = np.fromiter((p.index for p in procs), np.int64, n)
    # a process whose only records are its start markers showed no life to lose, and no
    # failure: never the first to fail (unless no process of the attempt showed more)
    starts_only = np.bincount(key[kinds != K_JOB_START], minlength=n) == 0
    mute = starts_only & (how == 2) & (seen_at == np.iinfo(np.int64).max)
    if mute.all():  # no process showed anything after its start: none is named
        return FirstFailure(None, None, "missing_heartbeat", int(t.max()), (), "inferred")
    i = int(np.lexsort((rank, t, seen_at, mute))[0])
    return FirstFailure(procs[i].index, procs[i].host, HOWS[how[i]], int(t[i]),
                        _uncertain_among(i, t, how, seen_at, rank, a.heartbeat_interval_ms,
                                         mute),
                        "inferred" if how[i] == 2 else "observed")


def _uncertain_among(i: int, t, how, seen_at, rank, interval_ms: int,
                     mute=None) -> tuple[int, ...]:
    """Ranks of the processes other than ``i`` that may have failed before it: ``i`` fell
    silent (no end marker, exception or launcher event), so it died within one heartbeat
    interval after ``t[i]``, and so did they, their last signs of life before that interval's
    end. A silent process whose last sign precedes an exception or end marker is taken to
    have failed first, unwarned: the peers of a dead rank raise or are stopped after it.
    ``mute``: processes left out (their only records are start markers)."""
    if how[i] != 2 or seen_at[i] != np.iinfo(np.int64).max:
        return ()
    silent = (how == 2) & (seen_at == np.iinfo(np.int64).max)
    if mute is not None:
        silent &= ~mute
    near = silent & (t < t[i] + interval_ms * 1_000_000)
    near[i] = False
    return tuple(sorted(int(r) for r in rank[near]))


def _last_progress(a, rows) -> int | None:
    """The latest end of a completed (not in-flight) blocking step of any process of ``a``
    (read :data:`~goodput_processor.model.memo.CHUNK_ROWS` rows at a time)."""
    d, out = rows[0], None
    for i in range(0, len(d), CHUNK_ROWS):
        b = d[i : i + CHUNK_ROWS]
        sel = ((b[:, C_KIND] == K_STEP) & ((b[:, C_FLAGS] & (F_NONBLOCKING | F_ENDLESS)) == 0)
               & (b[:, C_END] <= a.end_ns) & (b[:, C_START] >= a.start_ns))
        if sel.any():
            m = int(np.max(b[:, C_END], where=sel, initial=np.iinfo(np.int64).min))
            out = m if out is None else max(out, m)
    return out


def _minus(pieces: list, other: list) -> int:
    """ns of ``pieces`` (disjoint, sorted) not covered by ``other`` (disjoint, sorted)."""
    total = 0
    for x, y in pieces:
        cut = sum(max(0, min(y, b) - max(x, a)) for a, b in other)
        total += y - x - cut
    return total


def _clip(pieces: list, hi: int) -> list:
    """``pieces`` (disjoint, sorted ``(start, end)`` ns) cut at ``hi``."""
    return [(x, min(y, hi)) for x, y in pieces if x < hi]


def _restart_phases(r, bound: int | None, result, resume: int | None, cut: int,
                    memo=None) -> tuple[dict, int]:
    """Phases of the attempt ``r`` that took over: startup, rendezvous_init, restore,
    recompilation_warmup (ns or None), and where they end (ns): the start of its first kept
    step, or ``cut`` (the start of ``r``'s own wasted region) when that comes first: then
    the rest of ``r`` is the next disruption's, and ``r`` has no warm-up. ``memo`` keeps
    what comes from ``r``'s rows (:func:`goodput_processor.model.restart_rows.restart_rows`)."""
    rows = restart_rows(r, bound, memo)
    t_fk = max(min(rows.t_fk, cut), r.start_ns)
    first = min(rows.first, t_fk)
    rest_pieces = _clip(rows.rest_pieces, t_fk)
    restore_ns = sum(y - x for x, y in rest_pieces)
    compile_ns = _minus(_clip(rows.comp_pieces, t_fk), rest_pieces)
    # warm-up: the first kept step, and the leading steps slower than the attempt's level
    warm_ns, warm_end = 0, t_fk
    if rows.kept and t_fk == rows.t_fk:
        end = rows.latest_end(t_fk)
        warm_end = t_fk if end is None else end
        idx, excess, starts = warmup(result, r.attempt, memo)
        if len(idx):
            warm_ns = int(round(float(excess.sum())))
            end = rows.latest_end(int(starts.max()))
            if end is not None:
                warm_end = max(warm_end, end)
        warm_ns += union_ns(rows.comp_starts, rows.comp_ends, t_fk, warm_end)[0]
    if rows.restored:
        restore = restore_ns
    elif resume is not None and resume > 0:
        restore = None  # resumed without a recorded restore: its time is in rendezvous_init
    else:
        restore = 0
    init = (t_fk - first) - restore_ns - compile_ns
    return {"startup": first - r.start_ns, "rendezvous_init": init, "restore": restore,
            "recompilation_warmup": compile_ns + warm_ns}, t_fk




def _pod_evidence(a, r) -> dict:
    """Kubernetes pod times of the processes of attempt ``r`` after attempt ``a`` (seconds)."""
    out = {}

    def first(key):
        vals = [p.run.get(key) for p in r.processes]
        vals = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)]
        return min(vals) if vals else None

    created, scheduled = first(schema.RES_K8S_POD_CREATED), first(schema.RES_K8S_POD_SCHEDULED)
    if created is not None and created <= r.start_ns:
        out["pod_created_after_s"] = (created - a.end_ns) / _NS
    if created is not None and scheduled is not None and created <= scheduled <= r.start_ns:
        out["pod_queued_s"] = (scheduled - created) / _NS
    if scheduled is not None and scheduled <= r.start_ns:
        out["pod_start_s"] = (r.start_ns - scheduled) / _NS
    return out


def recovery_report(job: JobSpans, attempts: Sequence, bounds: Sequence[int | None],
                    resumes: Sequence[int | None], result,
                    wasted_start: Sequence[int], memo=None) -> tuple[Recovery, ...]:
    """One :class:`Recovery` per disruption of the job, in attempt order.

    Args:
        job: the job's spans (for launcher events and strings).
        attempts: its :class:`~goodput_processor.model.attempts.Attempt` objects, by start.
        bounds: per attempt, the highest kept step number (None = all kept).
        resumes: per attempt, its resume step (None = unknown).
        result: the accounting's :class:`~goodput_processor.results.job.JobResult` (for the
            steps, the ideal step time and the anomalous flags).
        wasted_start: per attempt, where the accounting's wasted region starts (ns since
            the epoch; the attempt's end when it has none).
        memo: an :class:`~goodput_processor.model.memo.AccountingMemo` keeping what comes from
            one attempt's rows (its first failure and last progress, the restart's rows).
    """
    events = _launcher_events(job, memo)
    failures = _failures(events)
    rendezvous = launcher_rendezvous(job, events, [a.start_ns for a in attempts])
    out = []
    for i in range(len(attempts) - 1):
        a, r = attempts[i], attempts[i + 1]

        def failed(a=a):
            rows = stacked(a)
            return _first_failure(job, a, failures, rows), _last_progress(a, rows)

        key = ("failed", a.attempt, a.start_ns, a.end_ns, repr(sorted(failures.items())),
               tuple((p.index, p.host, p.pid, proc_key(p)) for p in a.processes))
        ff, last = cached(memo, key, failed)
        # the window: from a's wasted region (what came before it is a's own badput, or
        # the previous disruption's) to r's first kept step or r's own wasted region
        ws = min(max(wasted_start[i], a.start_ns), a.end_ns)
        if last is not None:
            last = min(max(last, ws), a.end_ns)
        t_fail = max(ff.at_ns, last) if last is not None else ff.at_ns
        t_fail = min(max(t_fail, ws), a.end_ns)
        nxt = wasted_start[i + 1] if i + 1 < len(wasted_start) else r.end_ns
        rest, t_end = _restart_phases(r, bounds[i + 1], result, resumes[i + 1], nxt, memo)
        ns = {"detection": None if last is None else t_fail - last,
              "termination": a.end_ns - t_fail,
              "rescheduling": max(r.start_ns - a.end_ns, 0), **rest}
        phases = {k: (None if ns[k] is None else ns[k] / _NS) for k in PHASES}
        lost = (a.end_ns - ws + sum(ns[k] or 0 for k in PHASES[2:]))
        evidence = _pod_evidence(a, r)
        seen = failures.get((ff.host, next((p.pid for p in a.processes
                                            if p.index == ff.process), None)))
        if seen is not None:
            evidence["launcher_detected_after_s"] = max(seen[0] - ff.at_ns, 0) / _NS
        if rendezvous[i + 1] is not None:
            evidence["launcher_rendezvous_s"] = rendezvous[i + 1] / _NS
        one = max(len(r.processes), r.declared_process_count or 0) == 1
        out.append(Recovery(a.attempt, phases, ff, r.attempt, lost / _NS, evidence, lost,
                            (ws, t_end),
                            labels={"rendezvous_init": ONE_PROCESS_INIT} if one else {}))
    return tuple(out)
