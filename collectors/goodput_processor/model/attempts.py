"""A job's attempts and processes, found from evidence (``docs/accounting.md``).

Real jobs break tidy assumptions: pods die without logging their end, launchers set no
``RANK``, people relaunch by hand with the same environment, and the killed launcher's
workers may live on. So the attempt number and rank a resource declares are hints; the
skeleton of the timeline is built from evidence:

- **runs**: the spans of one resource are one *run* (one OS process's attempt), identified
  by ``service.instance.id`` with the OS process (``host.name``, ``process.pid``,
  ``goodput.process.start_time_unix_nano``). Spans written before schema 1.1, and imported
  logs, carry no OS process: their runs are the declared ``(goodput.attempt,
  goodput.process.index)`` pairs, split where a start marker follows the process's steps
  or end (two runs that reused one name).
- **slot** (rank) of a run: its latest ``goodput.identity`` marker (the framework's rank),
  else the declared index when it came from a global rank variable or an argument. A local
  rank or a default 0 is no evidence: such runs have no known slot.
- **attempts**: runs with OS process identity are taken in order of their start; a run
  begins a new attempt when its OS process already has a run in the current attempt (a
  second ``job_start`` in one process), when its slot is already taken there by another
  OS process (a restart or a relaunch by hand), when both declare a launcher attempt
  number (torchrun's restart count) and the numbers differ, or when every process of the
  current attempt was last seen alive before its OS process started (a relaunch after the
  last one died; processes of one launch live at the same time, and a live process writes
  something every flush interval; both times are read on the real clock, so start times
  given to ``job_start(at=...)`` do not matter; the OS process start, read in 10 ms ticks,
  counts as up to 10 ms later). A run of unknown slot whose process recorded through the
  incumbent's API (resource ``goodput.recorder.api = ml-goodput-measurement``: its start
  marker is an explicit ``record_job_start_time``, which begins an attempt there) also
  begins a new attempt when a step of the current attempt had started, as recorded, before
  that start: a restart, even while a process of the attempt before still runs (finishing
  a checkpoint save). The incumbent takes each ``record_job_start_time`` for the start of
  an attempt, and its processes of one launch start recording before training: one
  process writes (its README's rule; several would duplicate its log), or, where several
  do, each begins before the steps, which need them all. Otherwise it joins the current
  attempt.
- an attempt starts at its earliest start marker and ends at the last sign of life of any
  of its processes: its latest end marker or span end. Phases still in flight when a
  process died are in the spool as ``goodput.open`` records (:func:`resolve_open`).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, replace

import numpy as np

from goodput import schema

from ..read.rows import (
    C_END,
    C_KIND,
    C_START,
    K_JOB_END,
    K_JOB_START,
    K_STEP,
    NONE,
    JobSpans,
    ProcessSpans,
)
from .memo import AccountingMemo, HashedKey, cached, data_key, folded, process_state
from .open_records import OpenResolver, resolve_open
from .packed import PackedProcessSpans, replace_rows
from .summaries import evidence, evidence_both
from .warnings import ReportWarning

__all__ = ["DEFAULT_HEARTBEAT_INTERVAL_MS", "RUNNING_INTERVALS", "Attempt", "build_attempts",
           "clock_ns"]

#: Heartbeat interval assumed when no ``goodput.job_start`` carries one (ms).
DEFAULT_HEARTBEAT_INTERVAL_MS = 1000
#: An attempt without an end marker seen alive within this many heartbeat intervals of
#: *now* is running.
RUNNING_INTERVALS = 3
_MS = 1_000_000
#: ``goodput.process.start_time_unix_nano`` is read in clock ticks of 10 ms and rounded
#: down: the process started up to this much later.
_START_RESOLUTION_NS = 10 * _MS
#: Declared sources that make ``goodput.process.index`` a slot to rely on.
_SLOT_SOURCES = (None, "argument", "env")


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job, with boundaries in ns since the Unix epoch.

    ``end_reason`` is the ``goodput.end.reason`` of the end marker of the process seen
    alive last (``"unspecified"`` if the marker has none), else ``"killed"`` (that
    process left no end marker) or ``"running"``. ``cut`` is True when the end was moved
    back to the next attempt's start. ``primary`` is the :class:`ProcessSpans` the attempt
    is accounted on (lowest rank); ``processes`` are all its processes with spans, by rank
    (their ``attempt``/``index`` are this attempt's number and their rank).
    ``recorder_errors``/``recorder_dropped``: per process the maximum of
    ``goodput.recorder.errors``/``dropped`` seen on job_end/heartbeat markers, summed
    over processes. ``warnings``: what the evidence could not settle, as
    :class:`~goodput_processor.model.warnings.ReportWarning` objects.
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
    warnings: tuple[ReportWarning, ...] = ()

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns`` (ns, >= 0)."""
        return self.end_ns - self.start_ns


def _split_runs(proc: ProcessSpans) -> list[ProcessSpans]:
    """``proc`` (no OS process identity) split at each start marker after it had stepped or
    ended: a process starts an attempt once, so a later ``goodput.job_start`` belongs to
    another run that reused the job name, attempt number and process index (two run
    directories read together). Earlier extra start markers (the scheduling time an
    imported log adds) do not split."""
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


@dataclass
class _Run:
    """What one run shows: its spans and the evidence about its process."""

    proc: ProcessSpans
    start: int  # start marker: the attempt's start as recorded (may be a given time)
    launched: int  # when the OS process started (real clock), else ``start``
    last_alive: int  # the latest end of any row (heartbeats, open records: real clock)
    end_marker: int | None
    reason: str | None
    slot: int
    slot_known: bool
    count: int | None
    os_process: tuple | None  # (host, pid, process start) when the resource has them
    hint: int | None  # a launcher's attempt number (env) or the declared one (no identity)
    legacy: tuple | None  # (declared attempt, part) for runs without OS process identity
    explicit_start: bool  # its start marker is the incumbent's record_job_start_time
    interval: int  # heartbeat interval, ms
    errors: int
    dropped: int


def _run(job: JobSpans, proc: ProcessSpans, legacy: tuple | None, memo=None) -> _Run:
    js_start, interval, first, je, ident, last_alive, errors, dropped = folded(
        memo, "evidence", proc, evidence, evidence_both)
    end_marker = reason = None
    if je is not None:
        end_marker = je[0]
        reason = job.strings[je[1]] if je[1] >= 0 else "unspecified"
    slot, count = proc.index, proc.process_count
    known = proc.index_source in _SLOT_SOURCES
    if ident is not None:
        if ident[1] != NONE and ident[1] >= 0:
            slot, known = ident[1], True
        if ident[2] != NONE and ident[2] > 0:
            count = ident[2]
    has_os = proc.instance and proc.pid is not None and proc.process_start_ns is not None
    hint = proc.attempt if legacy is not None or proc.attempt_source == "env" else None
    start = first if js_start is None else js_start
    return _Run(
        proc=proc,
        start=start,
        launched=proc.process_start_ns if has_os else start,
        last_alive=last_alive,
        end_marker=end_marker,
        reason=reason,
        slot=slot,
        slot_known=known,
        count=count,
        os_process=(proc.host, proc.pid, proc.process_start_ns) if has_os else None,
        hint=hint,
        legacy=legacy,
        explicit_start=proc.run.get(schema.RES_RECORDER_API) in schema.RECORDER_APIS,
        interval=DEFAULT_HEARTBEAT_INTERVAL_MS if interval is None else interval,
        errors=errors or 0,
        dropped=dropped or 0,
    )


def _origin(key: tuple, proc: ProcessSpans, kept: dict, seen: dict | None) -> tuple:
    """``(key, rows, resource)``: the memo identity of process ``proc`` (its key in the
    job, :func:`data_key` of its rows, the ``repr`` of its resource), and the memo key of
    its runs (``("runs", *origin)``), taken from ``kept``
    (``memo.origins``: the last accounting's, by key) when ``proc`` holds the same rows
    array (rows never change in place under a memo) and the same resource, and noted in
    ``seen`` (the next accounting's ``kept``; None: no memo)."""
    fields = (proc.host, proc.process_count, proc.schema_version, proc.instance, proc.pid,
              proc.process_start_ns, proc.attempt_source, proc.index_source)
    data = proc.__dict__.get("data") if type(proc) is ProcessSpans else None
    k = kept.get(key)
    if data is not None and k is not None and k[0] is data and k[1] == fields and (
            k[2] == proc.run):
        seen[key] = k
        return k[3], k[4]
    # (the resource's attributes may change without a new row: they are in the key)
    ident = repr((*fields[:3], sorted(proc.run.items()), *fields[3:]))
    origin = (key, data_key(proc), ident)  # (rows serve keeps packed are not read for it)
    runs_key = HashedKey(("runs", *origin))  # (kept: hashed once)
    if seen is not None and data is not None:
        seen[key] = (data, fields, dict(proc.run), origin, runs_key)
    return origin, runs_key


def _runs(job: JobSpans, memo=None) -> list[_Run]:
    runs = []
    kept, seen = ({}, None) if memo is None else (memo.origins, {})
    for key, proc in sorted(job.processes.items()):
        origin, runs_key = _origin(key, proc, kept, seen)
        rows = origin[1]
        if not rows[0] or proc.run.get(schema.RES_PROCESS_ROLE) == "launcher":
            continue  # a launcher's own process (its events: goodput_processor.analysis.recovery)
        state = None if memo is None else process_state(memo, origin)  # (kept while seen)
        runs += cached(memo, runs_key,
                       lambda proc=proc, a=key[0], o=origin, s=state:
                       _process_runs(job, a, proc, o, s, memo))
    if memo is not None:
        memo.origins = seen
    return runs


def _process_runs(job: JobSpans, attempt: int, proc: ProcessSpans,
                  origin: tuple | None = None, state: dict | None = None,
                  memo=None) -> list[_Run]:
    """The runs of one resource, its open records resolved; ``origin``: the memo identity
    of its rows, kept on each run's rows (:func:`~goodput_processor.model.memo.proc_key`);
    ``state``: what ``memo`` keeps of the process (its open records resolved a batch at a
    time, :class:`~goodput_processor.model.open_records.OpenResolver`)."""
    if proc.instance and proc.pid is not None and proc.process_start_ns is not None:
        if state is None:
            data, settled = resolve_open(proc.data, job.rows_owned), None
        elif state.get("packed", (None,))[0] == origin:  # let go by goodput serve's
            # compaction (goodput_processor.serve.compaction.pack_runs): made from its rows
            _, packed, settled = state["packed"]
            return [_run(job, PackedProcessSpans.of(proc, packed, origin=origin,
                                                    settled=settled), None, memo)]
        else:
            data, settled = state.setdefault("open", OpenResolver()).resolve(proc.data)
        return [_run(job, replace(proc, data=data, origin=origin, settled=settled), None,
                     memo)]
    proc = replace(proc, data=resolve_open(proc.data, job.rows_owned), origin=origin)
    return [_run(job, p if origin is None else replace(p, origin=(*origin, part)),
                 (attempt, part)) for part, p in enumerate(_split_runs(proc))]


def _first_step(d: np.ndarray) -> int | None:
    """The earliest recorded start of a step among rows ``d`` (ns; None: none)."""
    steps = d[d[:, C_KIND] == K_STEP]
    return int(steps[:, C_START].min()) if len(steps) else None


def _earlier(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else min(a, b)


def _restarts(r: _Run, current: list[_Run], memo) -> bool:
    """Whether ``r`` (another OS process, of unknown slot) begins a new attempt by its
    explicit ``record_job_start_time``: a step of ``current`` had started before its start
    marker (module docstring)."""
    if not (r.explicit_start and not r.slot_known and r.os_process is not None):
        return False
    for c in current:
        first = folded(memo, "first_step", c.proc, _first_step, _earlier)
        if first is not None and first < r.start:
            return True
    return False


def _group(runs: list[_Run], memo=None) -> list[list[_Run]]:
    """Runs grouped into attempts (see the module docstring), each group by start."""
    legacy: dict[tuple, list[_Run]] = {}
    plain = []
    for r in sorted(runs, key=lambda r: (r.start, r.slot)):
        if r.legacy is not None:
            legacy.setdefault(r.legacy, []).append(r)
        else:
            plain.append(r)
    groups = _group_from(plain, 0, memo)[0]
    groups.extend(legacy.values())
    groups.sort(key=lambda g: (min(r.start for r in g), g[0].legacy or ()))
    return groups


def _group_from(order: list[_Run], lo: int, memo=None) -> tuple[list, list[int]]:
    """:func:`_group` of the runs ``order[lo:]`` (sorted, none legacy) when ``order[lo]``
    begins an attempt: the groups and the index in ``order`` of each one's first run."""
    groups: list[list[_Run]] = []
    starts: list[int] = []
    current: list[_Run] = []
    alive = slots = hints = procs = None
    for i in range(lo, len(order)):
        r = order[i]
        new = not current or (
            r.os_process in procs
            or (r.slot_known and r.slot in slots)
            or (r.hint is not None and hints and r.hint not in hints)
            or r.launched + _START_RESOLUTION_NS > alive
            or _restarts(r, current, memo)
        )
        if new:
            current = []
            groups.append(current)
            starts.append(i)
            alive, slots, hints, procs = r.last_alive, set(), set(), set()
        current.append(r)
        alive = max(alive, r.last_alive)
        procs.add(r.os_process)
        if r.slot_known:
            slots.add(r.slot)
        if r.hint is not None:
            hints.add(r.hint)
    return groups, starts


def _kept_groups(runs: list[_Run], memo) -> tuple:
    """The runs grouped into attempts, from what the last call kept (``memo.grouping``:
    its runs in order, the first run of each group, the groups, their numbers): the groups
    before the first run that differs (by identity) are kept, and grouping resumes at the
    start of the group before it (whose end that run may change). -> ``(order, starts,
    groups, numbers, g0)``, ``g0``: how many leading groups were kept."""
    order = sorted(runs, key=lambda r: (r.start, r.slot))
    state, g0 = memo.grouping, 0
    if state is not None:
        p_order, p_starts = state[0], state[1]
        j = 0
        for a, b in zip(order, p_order, strict=False):
            if a is not b:
                break
            j += 1
        g = bisect.bisect_right(p_starts, j) - 1 if j < len(p_order) else len(p_starts) - 1
        if j < len(p_order) and j == p_starts[g]:
            g -= 1
        g0 = max(min(g, len(p_starts) - 1), 0)
    if g0:
        groups, starts = _group_from(order, state[1][g0], memo)
        groups, starts = state[2][:g0] + groups, state[1][:g0] + starts
        numbers = state[3][:g0] + _number(groups[g0:], state[3][g0 - 1])
    else:
        groups, starts = _group_from(order, 0, memo)
        numbers = _number(groups)
    return order, starts, groups, numbers, g0


def _number(groups: list[list[_Run]], prev: int = -1) -> list[int]:
    """Attempt numbers: the declared one where all runs agree on one above the previous
    attempt's (a launcher's restart count, an imported log's), else the previous + 1
    (``prev``: the number of the attempt before ``groups``; -1: none)."""
    out = []
    for g in groups:
        hints = {r.hint for r in g}
        n = hints.pop() if len(hints) == 1 else None
        prev = n if n is not None and n > prev else prev + 1
        out.append(prev)
    return out


def clock_ns() -> int:
    """"Now" for the accounting (ns since the Unix epoch): the one place the processor
    reads the wall clock to tell a running attempt (benchmarks replace it)."""
    return time.time_ns()


def build_attempts(job: JobSpans, now_ns: int | None = None,
                   memo: AccountingMemo | None = None) -> list[Attempt]:
    """Attempts of ``job`` ordered by start, with ends cut at the next attempt's start.

    Args:
        job: the job's spans as read by :func:`goodput_processor.read.reader.read_run_dir`.
        now_ns: "now" in ns since the Unix epoch, to tell a running last attempt from a
            killed one; default :func:`clock_ns`.
        memo: per-process results of an earlier call on the same job
            (:mod:`goodput_processor.model.memo`).

    Returns:
        One :class:`Attempt` per attempt found (empty list if the job has no spans); its
        processes carry the attempt's number and their rank as found.
    """
    if now_ns is None:
        now_ns = clock_ns()
    runs = _runs(job, memo)
    live = memo is not None and not any(r.legacy is not None for r in runs)
    kept, g0 = (), 0
    if not live:
        groups = _group(runs, memo)
        numbers = _number(groups)
    else:  # (a live job: the groups and attempts before its last changes kept)
        kept = () if memo.grouping is None else memo.grouping[4]
        order, starts, groups, numbers, g0 = _kept_groups(runs, memo)
    attempts, keys = [], []
    for i, (g, number) in enumerate(zip(groups, numbers, strict=True)):
        if i + 1 < g0 and kept[i][1] is not None:  # the same runs up to the next attempt's
            attempts.append(kept[i][1])
            keys.append(kept[i])
            continue
        start = min(r.start for r in g)
        interval = max(r.interval for r in g)
        # a process's end: its end marker (the time it gave), else its last sign of life
        ends = [(r.last_alive if r.end_marker is None else r.end_marker, r) for r in g]
        end, last = max(ends, key=lambda x: (x[0], x[1].end_marker is not None))
        reason = last.reason if last.end_marker is not None else "killed"
        running = [r for r in g if r.end_marker is None
                   and now_ns - r.last_alive <= RUNNING_INTERVALS * r.interval * _MS]
        if i == len(groups) - 1 and running:
            end, reason = max(now_ns, end), "running"  # (clock skew: not before)
        end = max(end, start)
        warnings = []
        cut = False
        if i + 1 < len(groups):
            nxt = min(r.start for r in groups[i + 1])
            if end > nxt:
                # alive, on the real clock, well after the next attempt's processes started
                launched = min(r.launched for r in groups[i + 1])
                late = [r for r in g
                        if r.last_alive > launched + RUNNING_INTERVALS * interval * _MS]
                if late and all(r.os_process is not None for r in late):
                    warnings.append(ReportWarning(
                        "orphaned_processes",
                        f"{len(late)} process(es) of attempt {number} were still alive up to "
                        f"{(max(r.last_alive for r in late) - launched) / 1e9:.2f} s after attempt "
                        f"{numbers[i + 1]} started (workers of a killed launcher?); their "
                        "work after that start is not counted", number))
                end, cut = nxt, True
        args = (g, number, start, end, reason, cut, interval, warnings)
        if memo is None or i + 1 == len(groups) or any(
                isinstance(r.proc, PackedProcessSpans) for r in g):  # (a copy keeps read rows)
            attempts.append(_attempt(*args))
            keys.append((None, None))
        else:  # a finished attempt of the same runs as kept: the same Attempt (g keeps ids)
            key = (*args[1:-1], tuple(warnings), tuple(map(id, g)))
            k = kept[i] if i < len(kept) else None
            a = k[1] if k is not None and k[0] == key else _attempt(*args)
            attempts.append(a)
            keys.append((key, a, g))
    if memo is not None:
        memo.grouping = (order, starts, groups, numbers, keys) if live else None
    return attempts


def _attempt(g: list[_Run], number: int, start: int, end: int, reason: str, cut: bool,
             interval: int, warnings: list, memo=None) -> Attempt:
    by_slot: dict[int, list[_Run]] = {}
    for r in g:
        by_slot.setdefault(r.slot, []).append(r)
    shared = [s for s, rs in by_slot.items() if len({r.os_process for r in rs}) > 1]
    for s in shared:
        warnings.append(ReportWarning(
            "process_rank_unknown",
            f"{len(by_slot[s])} processes of attempt {number} claim rank {s} without "
            "evidence (no rank variable, no torch.distributed/JAX rank recorded): the "
            "attempt is accounted on one of them", number, s))
    order = sorted(g, key=lambda r: (r.slot, -data_key(r.proc)[0]))
    # (copies made at each accounting, not kept in the memo: a packed process's copy holds
    # its rows once they are read, e.g. when the bucket levels change, and the memo keeps
    # the runs' processes packed after goodput serve's compaction, serve.compaction)
    procs = tuple(replace_rows(r.proc, attempt=number, index=r.slot, process_count=r.count)
                  for r in order)
    counts = [r.count for r in g if r.count is not None]
    return Attempt(
        attempt=number,
        start_ns=start,
        end_ns=end,
        end_reason=reason,
        cut=cut,
        primary=procs[0],
        processes=procs,
        declared_process_count=max(counts) if counts else None,
        hosts=tuple(sorted({r.proc.host for r in g if r.proc.host})),
        heartbeat_interval_ms=interval,
        recorder_errors=sum(r.errors for r in g),
        recorder_dropped=sum(r.dropped for r in g),
        warnings=tuple(warnings),
    )

