"""Straggler report: the hosts whose steps are slowest against the job's median host.

The goodput accounting uses each attempt's primary process; the other processes' step spans
(:attr:`~goodput_processor.read.rows.ProcessSpans.data`) are used here only. For every host
process (one ``(host.name, goodput.process.index)`` pair, over all attempts) this takes
its kept, blocking step spans (the same kept steps as the accounting: in an attempt that a
later attempt resumed from step ``b``, steps numbered above ``b`` are wasted and left out),
and computes:

- ``median_step_time_s``: the median of its step times (span duration / ``goodput.step.count``);
- ``ratio``: that divided by the median over hosts of the per-host medians (1.0 = typical);
- ``median_start_lag_s``: the median, over the step numbers it ran, of how much later it
  started step *k* than the median host did (None without step numbers).

Why two measures: in synchronous data-parallel training every host's step ends at the same
collective, so a host with slow *compute* makes every host's step span long, and only hosts
whose step span measures their own work (asynchronous workers, a span closed before the
collective, pipeline stages) show up in the ratio. A host that is late *into* the step (slow
data loading, a slow host thread) shows up in the start lag. Both are reported; neither
changes the goodput buckets.

Everything is numpy-vectorised over all processes at once (one concatenation, a lexsort and
a few ``reduceat``), so 4,096 hosts x thousands of steps cost tens of milliseconds. Each
attempt's share (its hosts' step times and start lags, sorted:
:class:`~goodput_processor.analysis.keyed_runs.KeyedRun`) is kept in the accounting's memo under its
processes' rows and kept-step bound, the finished attempts' merged into one; the medians
are read from the runs without merging them (:func:`~goodput_processor.analysis.keyed_runs.
union_median`); the running attempt's share is folded as its rows arrive (:func:`_running`),
so a live poll sorts only its new steps, and a poll with nothing new reads the report
kept. Attempts run disjoint step numbers (a later attempt resumes above the earlier ones'
bound); where some do not, they are taken together, so a step number's median start is
over every process that ran it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..model.memo import cached, data_key, proc_key, rows_key
from ..read.rows import C_AUX, C_END, C_FLAGS, C_IVAL, C_KIND, C_START, F_NONBLOCKING, K_STEP, NONE
from .keyed_runs import KeyedRun, loc_of, union_median

__all__ = ["DEFAULT_TOP", "StragglerHost", "StragglerReport", "fold_parts", "straggler_report"]

#: Slowest hosts listed in the report and the metrics.
DEFAULT_TOP = 5
_NS = 1_000_000_000


@dataclass(frozen=True)
class StragglerHost:
    """One host process in the straggler report (seconds; ``ratio`` is dimensionless)."""

    host: str | None
    process: int
    steps: int
    median_step_time_s: float
    ratio: float
    median_start_lag_s: float | None


@dataclass(frozen=True)
class StragglerReport:
    """Per-host step times against the median host.

    ``hosts``: host processes with at least one kept step; ``median_step_time_s``: median
    over them of their median step time; ``max_ratio``: the slowest host's ratio;
    ``slowest``: up to ``top`` hosts, slowest first (ties: lower process index first).
    """

    hosts: int
    median_step_time_s: float
    max_ratio: float
    slowest: tuple[StragglerHost, ...]


def _group_median(keys: np.ndarray, values: np.ndarray, nkeys: int):
    """Median of int64 ``values`` per integer key in ``[0, nkeys)``; (medians, counts).

    Keys without values get NaN and count 0. One ``np.sort`` of ``key << b | value - min``
    when that fits in 63 bits (always, for step times under 13 days with 4,096 hosts), else
    a lexsort.
    """
    counts = np.bincount(keys, minlength=nkeys)
    med = np.full(nkeys, np.nan)
    if not len(values):
        return med, counts
    lo_v = int(values.min())
    span = int(values.max()) - lo_v
    shift = max(span.bit_length(), 1)
    if shift + max(nkeys - 1, 1).bit_length() <= 62:
        v = np.sort((keys << shift) | (values - lo_v))
        v &= (1 << shift) - 1
    else:
        v = values[np.lexsort((values, keys))] - lo_v
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    med[has] = (v[lo] + v[hi]) / 2.0 + lo_v
    return med, counts


def straggler_report(attempts: Sequence, bounds: Sequence[int | None],
                     top: int = DEFAULT_TOP, memo=None,
                     done: tuple | None = None) -> StragglerReport | None:
    """The straggler report of a job's attempts.

    Args:
        attempts: the job's :class:`~goodput_processor.read.rows.Attempt` objects.
        bounds: per attempt, the highest kept step number (None = all kept), as the
            accounting uses (the lowest resume step of the later attempts).
        top: how many of the slowest hosts to list (>= 1).
        memo: an :class:`~goodput_processor.model.memo.AccountingMemo`: each attempt's sorted
            step times and start lags are kept in it under its processes' rows and bound
            (:func:`_part`), the finished attempts' merged, and the running attempt's
            folded as its rows arrive (:func:`_running`), so that a poll sorts only its
            new steps, and nothing when nothing is new.
        done: :func:`fold_parts` of the first attempts (with ``memo``), kept by the
            caller: they are not looked at again.

    Returns:
        A :class:`StragglerReport`, or None when fewer than two host processes have kept
        steps (there is nothing to compare).

    Raises:
        ValueError: ``top`` < 1, or ``bounds`` and ``attempts`` differ in length.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top!r}")
    if len(bounds) != len(attempts):
        raise ValueError(f"{len(bounds)} bounds for {len(attempts)} attempts")
    k0, ident, groups, parts, token, reach = (0, {}, [], [], None, None) if done is None else (
        done[0], dict(done[1]), list(done[2]), list(done[3]), done[4], done[5])
    kd = len(groups)
    _groups(attempts[k0:], bounds[k0:], ident, groups)
    if len(ident) < 2:
        return None
    # (each looked up at every poll, so that the memo keeps them while they are used)
    parts += [cached(memo, _part_key(g), lambda g=g: _part(g)) for g in groups[kd:-1]]
    last = groups[-1]
    if len(parts) < len(groups):
        parts.append(_running(last, memo) if memo is not None and all(
            cap == NONE for _, cap in last) else cached(memo, _part_key(last),
                                                        lambda: _part(last)))
    else:  # (the done attempts' last group is the last: no attempt after them has rows)
        kd -= 1
    if reach is not False and _after(parts[len(done[3]) if done else 0:], reach):
        comps = [[i] for i in range(len(parts))]  # (none overlaps: as _components gives)
    else:
        comps = _components([(pt.lo, pt.hi) for pt in parts])
        token, kd = None, 0
    if len(comps) < len(groups):  # step numbers shared by attempts: those taken together
        groups = [[x for i in c for x in groups[i]] for c in comps]
        parts = [parts[c[0]] if len(c) == 1 else
                 cached(memo, _part_key(g), lambda g=g: _part(g)) for c, g in zip(
                     comps, groups, strict=True)]
        parts[-1] = parts[-1] if len(comps[-1]) == 1 else _part(groups[-1])
    nkeys = len(ident)
    loc_last = _loc(parts[-1].names, ident)
    head = (token, kd, *(_part_key(g) for g in groups[kd:-1])) if token is not None else (
        tuple(_part_key(g) for g in groups[:-1]))
    if len(parts) > 2:  # the finished attempts' runs merged (the last one's change)
        merged = cached(memo, ("straggler_merged", head, nkeys), lambda: _merge(
            parts[:-1], [_loc(pt.names, ident) for pt in parts[:-1]], nkeys))
        runs_t = [(merged[0], np.arange(nkeys)), *((r, loc_last) for r in parts[-1].times)]
        runs_l = [(merged[1], np.arange(nkeys)), *((r, loc_last) for r in parts[-1].lags)]
    else:
        locs = [_loc(pt.names, ident) for pt in parts]
        runs_t = [(r, loc) for pt, loc in zip(parts, locs, strict=True) for r in pt.times]
        runs_l = [(r, loc) for pt, loc in zip(parts, locs, strict=True) for r in pt.lags]
    key = ("stragglers", head, _part_key(groups[-1]), top)
    return cached(memo, key, lambda: _report(runs_t, runs_l, ident, top))


def _groups(attempts, bounds, ident: dict, groups: list) -> None:
    """Per attempt with rows, its ``(process, bound)`` pairs appended to ``groups``, and
    its host processes given keys in ``ident`` (in place)."""
    for a, bound in zip(attempts, bounds, strict=True):
        pairs = [(p, NONE if bound is None else bound) for p in a.processes  # NONE: no bound
                 if data_key(p)[0]]
        for p, _ in pairs:
            ident.setdefault((p.host, p.index), len(ident))
        if pairs:
            groups.append(pairs)


def _after(parts: list, reach) -> bool:
    """Whether each of ``parts`` has step numbers above every one before it (those
    without numbers aside), the numbers before reaching up to ``reach`` (None: none)."""
    for pt in parts:
        if pt.lo is None:
            continue
        if reach is not None and pt.lo <= reach:
            return False
        reach = pt.hi if reach is None else max(reach, pt.hi)
    return True


def fold_parts(attempts, bounds, memo=None, done: tuple | None = None) -> tuple:
    """What :func:`straggler_report` needs of finished ``attempts`` (with their
    ``bounds``), for a later call's ``done`` (the caller keeps it:
    :mod:`goodput_processor.account.live`): ``(attempts folded, host process keys, their
    groups of (process, bound) pairs, their parts, a token naming them in memo keys, the
    highest step number in them (False: some overlap))``; extends ``done``, made of the
    first of ``attempts``."""
    k0, ident, groups, parts, _, reach = (0, {}, [], [], None, None) if done is None else (
        done[0], dict(done[1]), list(done[2]), list(done[3]), done[4], done[5])
    kd = len(groups)
    _groups(attempts[k0:], bounds[k0:], ident, groups)
    parts += [cached(memo, _part_key(g), lambda g=g: _part(g)) for g in groups[kd:]]
    new = parts[len(done[3]) if done else 0:]
    if reach is not False:
        reach = reach if _after(new, reach) else False
        for pt in new:
            if reach is not False and pt.hi is not None:
                reach = pt.hi if reach is None else max(reach, pt.hi)
    return (len(attempts), ident, groups, parts, object(), reach)


def _part_key(pairs) -> tuple:
    return ("straggler_part", tuple((proc_key(p), cap) for p, cap in pairs))


def _report(runs_t: list, runs_l: list, ident: dict, top: int) -> StragglerReport | None:
    """:func:`straggler_report` from the runs of step times and start lags (each with its
    keys of ``ident``'s host processes)."""
    nkeys = len(ident)
    med, n = union_median(runs_t, nkeys)
    has = n > 0
    if int(has.sum()) < 2:
        return None
    overall = float(np.median(med[has]))
    ratio = np.full(nkeys, np.nan)
    if overall > 0:
        ratio[has] = med[has] / overall
    else:  # every host's median step is 0 ns: no host is slower than another
        ratio[has] = 1.0
    lag, _ = union_median(runs_l, nkeys)
    # slowest first; ties by process index then host (stable)
    names = list(ident)
    idx = np.flatnonzero(has)
    proc = np.array([names[i][1] for i in idx], np.int64)
    order = idx[np.lexsort((proc, -ratio[idx]))][:top]
    slowest = tuple(
        StragglerHost(host=names[i][0], process=int(names[i][1]), steps=int(n[i]),
                      median_step_time_s=float(med[i]) / _NS, ratio=float(ratio[i]),
                      median_start_lag_s=None if np.isnan(lag[i]) else float(lag[i]) / _NS)
        for i in order
    )
    return StragglerReport(hosts=int(has.sum()), median_step_time_s=overall / _NS,
                           max_ratio=float(ratio[order[0]]), slowest=slowest)


class _Part(NamedTuple):
    """One attempt's (or several attempts sharing step numbers) share of the report:
    ``names`` its host processes ``(host, process index)`` (the runs' keys), ``times``
    their step times (ns per step), ``lags`` their start lags (ns, one per step number run
    by at least two of them), each as runs (:class:`~.keyed_runs.KeyedRun`:
    one, or the running attempt's several, :func:`_running`), and ``lo``/``hi`` the lowest
    and highest step number (None without numbers)."""

    names: tuple
    times: tuple
    lags: tuple
    lo: int | None
    hi: int | None


def _part(pairs: list) -> _Part:
    """:class:`_Part` of ``(process, bound)`` pairs (their kept steps, :func:`_steps`)."""
    own: dict[tuple, int] = {}
    keys = [own.setdefault((p.host, p.index), len(own)) for p, _ in pairs]
    parts = [_steps(p.data, cap) for p, cap in pairs]
    lengths = np.fromiter((len(x[0]) for x in parts), np.int64, len(parts))
    key = np.repeat(np.asarray(keys, np.int64), lengths)
    snum, start, t = (np.concatenate([x[i] for x in parts]) for i in range(3))
    numbered = snum[snum != NONE]
    lk, lag = _start_lag(key, snum, start)
    return _Part(tuple(own), (KeyedRun(key, t, len(own)),), (KeyedRun(lk, lag, len(own)),),
                 int(numbered.min()) if len(numbered) else None,
                 int(numbered.max()) if len(numbered) else None)


class _Running(NamedTuple):
    """What :func:`_running` keeps of a running attempt: per process its identity, the
    rows taken (``n``) and their :func:`~goodput_processor.model.memo.rows_key`; the runs of the
    step times of those rows and of the start lags of the step numbers settled (at most
    ``sealed``: every process has gone past it); the numbered steps above it
    (``pending``: key, number, start); each process's highest number, and the lowest."""

    ids: tuple
    n: tuple
    rk: tuple
    times: tuple
    lags: tuple
    sealed: int | None
    pending: tuple
    top: tuple
    lo: int | None


def _running(pairs: list, memo) -> _Part:
    """:func:`_part` of the running attempt's processes ``pairs`` (no bound), from what the
    last poll kept (``memo``): the rows that only grow (``p.settled`` of an attempt's
    process, else all) are read from where the last poll stopped; their steps' times
    become a new run (runs merged as they double), and a step number's start lags are
    made once every process has gone past it. The rest (open records resolved) is read
    anew. A new row numbered at or below a settled number starts again from the first row;
    such a row among the rest is read with every step of the attempt (:func:`_part`).
    With the same rows as the last poll (nothing new), its part is taken as it was."""
    ids = tuple((o[0], o[2]) if (o := getattr(p, "origin", None)) is not None
                else (p.host, p.index, getattr(p, "attempt", None)) for p, _ in pairs)
    skey = ("straggler_running", ids)
    whole = ("straggler_running_part", ids, tuple(proc_key(p) for p, _ in pairs))
    out = memo.peek(whole)
    if out is not None:
        memo.peek(skey)  # (the state the next new rows fold into, kept)
        return out
    out = _running_fold(pairs, memo, ids, skey)
    memo.put(whole, out)
    return out


def _running_fold(pairs: list, memo, ids: tuple, skey: tuple) -> _Part:
    """:func:`_running` of rows the last poll did not have (its state under ``skey``)."""
    own: dict[tuple, int] = {}
    keys = [own.setdefault((p.host, p.index), len(own)) for p, _ in pairs]
    nk = len(own)
    settled = [len(p.data) if getattr(p, "origin", None) is None or p.settled is None
               else p.settled for p, _ in pairs]
    st = memo.peek(skey)
    if st is None or st.ids != ids or not _prefix_ok(pairs, settled, st):
        st = _Running(ids, (0,) * len(pairs), tuple(rows_key(p.data[:0]) for p, _ in pairs),
                      (), (), None, _no_steps(), (None,) * len(pairs), None)
    new = [_steps(p.data[n:m], NONE) for (p, _), n, m in zip(pairs, st.n, settled,
                                                              strict=True)]
    fresh = _fold(st, keys, new, nk, ids, pairs, settled)
    if fresh is None:  # a late row below a settled number: from the first row again
        st = _Running(ids, (0,) * len(pairs), tuple(rows_key(p.data[:0]) for p, _ in pairs),
                      (), (), None, _no_steps(), (None,) * len(pairs), None)
        fresh = _fold(st, keys, [_steps(p.data[:m], NONE) for (p, _), m in zip(
            pairs, settled, strict=True)], nk, ids, pairs, settled)
    memo.put(skey, fresh)
    tail = [_steps(p.data[m:], NONE) for (p, _), m in zip(pairs, settled, strict=True)]
    tk, tnum, tstart, tt = _flat(keys, tail)
    tn = tnum[tnum != NONE]
    if fresh.sealed is not None and len(tn) and int(tn.min()) <= fresh.sealed:
        return _part(pairs)
    pk, pnum, pstart = fresh.pending
    lk, lag = _start_lag(np.concatenate((pk, tk)), np.concatenate((pnum, tnum)),
                         np.concatenate((pstart, tstart)))
    lo = min([x for x in (fresh.lo, int(tn.min()) if len(tn) else None) if x is not None],
             default=None)
    hi = max([x for x in (*fresh.top, int(tn.max()) if len(tn) else None) if x is not None],
             default=None)
    return _Part(tuple(own), (*fresh.times, KeyedRun(tk, tt, nk)),
                 (*fresh.lags, KeyedRun(lk, lag, nk)), lo, hi)


def _prefix_ok(pairs, settled, st) -> bool:
    """Whether the rows ``st`` took of each process are still the first rows it has."""
    return all(n <= m and rows_key(p.data[:n]) == rk for (p, _), m, n, rk in zip(
        pairs, settled, st.n, st.rk, strict=True))


def _no_steps() -> tuple:
    z = np.zeros(0, np.int64)
    return z, z, z


def _flat(keys: list, steps: list) -> tuple:
    """``(key, number, start, time)`` of the processes' ``steps`` (:func:`_steps`)."""
    lengths = np.fromiter((len(x[0]) for x in steps), np.int64, len(steps))
    key = np.repeat(np.asarray(keys, np.int64), lengths)
    return (key, *(np.concatenate([x[i] for x in steps]) for i in range(3)))


def _fold(st: _Running, keys, new, nk, ids, pairs, settled) -> _Running | None:
    """``st`` with the processes' ``new`` steps taken in (None: one is numbered at or
    below the settled number)."""
    k, num, start, t = _flat(keys, new)
    numbered = num != NONE
    if st.sealed is not None and numbered.any() and int(num[numbered].min()) <= st.sealed:
        return None
    times = _grow(st.times, KeyedRun(k, t, nk), nk) if len(k) else st.times
    top = list(st.top)
    for i, (sn, *_rest) in enumerate(new):
        sn = sn[sn != NONE]
        if len(sn):
            top[i] = int(sn.max()) if top[i] is None else max(top[i], int(sn.max()))
    pk, pnum, pstart = (np.concatenate((a, b)) for a, b in zip(
        st.pending, (k[numbered], num[numbered], start[numbered]), strict=True))
    sealed, lags = st.sealed, st.lags
    reach = None if any(x is None for x in top) else min(top)
    if reach is not None and (sealed is None or reach > sealed):
        done = pnum <= reach
        if done.any():
            lk, lag = _start_lag(pk[done], pnum[done], pstart[done])
            lags = _grow(lags, KeyedRun(lk, lag, nk), nk)
            pk, pnum, pstart = pk[~done], pnum[~done], pstart[~done]
        sealed = reach
    lo = st.lo
    if numbered.any():
        m = int(num[numbered].min())
        lo = m if lo is None else min(lo, m)
    return _Running(ids, tuple(settled), tuple(rows_key(p.data[:m]) for (p, _), m in zip(
        pairs, settled, strict=True)), times, lags, sealed, (pk, pnum, pstart), tuple(top),
        lo)


def _grow(runs: tuple, run: KeyedRun, nk: int) -> tuple:
    """``runs`` and ``run``, the last two merged while the one before is under twice the
    last's size (so there are O(log n) runs)."""
    out = [*runs, run]
    while len(out) > 1 and out[-2].size < 2 * out[-1].size:
        b, a = out.pop(), out.pop()
        out.append(KeyedRun(np.concatenate((a.keys(), b.keys())),
                            np.concatenate((a.values(), b.values())), nk))
    return tuple(out)


def _components(ranges: list) -> list[list[int]]:
    """The parts (indexes, in order) whose step-number ranges ``(lo, hi)`` overlap,
    grouped (transitively); a part without numbers is its own. One group per part when
    none overlap, as attempts' kept steps do (a later attempt resumes above the bound)."""
    spans = sorted((lo, hi, i) for i, (lo, hi) in enumerate(ranges) if lo is not None)
    groups, reach = [], None
    for lo, hi, i in spans:
        if reach is not None and lo <= reach:
            groups[-1].append(i)
            reach = max(reach, hi)
        else:
            groups.append([i])
            reach = hi
    groups += [[i] for i, (lo, _) in enumerate(ranges) if lo is None]
    return sorted(sorted(g) for g in groups)


def _loc(names: tuple, ident: dict) -> np.ndarray:
    """Per job-wide key (``ident``'s), its key in a part of host processes ``names`` (-1:
    not in it)."""
    loc = np.full(len(ident), -1, np.int64)
    loc[[ident[n] for n in names]] = np.arange(len(names))
    return loc


def _merge(parts: list, locs: list, nkeys: int) -> tuple[KeyedRun, KeyedRun]:
    """The runs of step times and of start lags of ``parts`` as one of each, by job-wide
    key."""
    out = []
    for what in ("times", "lags"):
        runs = [(r, loc) for pt, loc in zip(parts, locs, strict=True)
                for r in getattr(pt, what)]
        keys = np.concatenate([loc_of(r, loc) for r, loc in runs])
        out.append(KeyedRun(keys, np.concatenate([r.values() for r, _ in runs]), nkeys))
    return out[0], out[1]


def _steps(d: np.ndarray, cap: int) -> tuple:
    """Of one process's rows ``d``: the blocking step spans numbered at most ``cap``
    (NONE: any), as ``(step numbers, starts ns, ns per step)`` (a span of ``count``
    steps: its time over the count, whole ns)."""
    snum = d[:, C_IVAL]
    use = ((d[:, C_KIND] == K_STEP) & ((d[:, C_FLAGS] & F_NONBLOCKING) == 0)
           & ((cap == NONE) | (snum <= cap)))
    rows = d[use]
    count = np.where(rows[:, C_AUX] == NONE, 1, np.maximum(rows[:, C_AUX], 1))
    # (copies: a memo keeps them, not the rows they come from)
    return (rows[:, C_IVAL].copy(), rows[:, C_START].copy(),
            (rows[:, C_END] - rows[:, C_START]) // count)


def _start_lag(key, snum, start) -> tuple[np.ndarray, np.ndarray]:
    """Of one part's numbered steps (``key`` per step: its host process): ``(keys, lags)``,
    one per step number a process ran, for the step numbers at least two ran: its start
    minus the median start of that step number over the processes (whole ns, the median
    rounded down; starts taken from the part's earliest, so exact below 104 days)."""
    ok = snum != NONE
    key, snum, start = key[ok], snum[ok], start[ok]
    if not len(key):
        return key, start
    # A step number run twice by a process (a restart redid it) keeps its latest start.
    order = np.lexsort((start, snum, key))
    key, snum, start = key[order], snum[order], start[order]
    last = np.ones(len(key), bool)
    last[:-1] = (key[1:] != key[:-1]) | (snum[1:] != snum[:-1])
    key, snum, start = key[last], snum[last], start[last]
    # Median start of each step number over processes.
    _, step_id = np.unique(snum, return_inverse=True)
    nsteps = int(step_id.max()) + 1
    rel = start - start.min()
    step_med, step_n = _group_median(step_id, rel, nsteps)
    # Only steps run by at least two processes compare anything (lags in whole ns).
    shared = step_n[step_id] >= 2
    return key[shared], rel[shared] - np.floor(step_med[step_id][shared]).astype(np.int64)
