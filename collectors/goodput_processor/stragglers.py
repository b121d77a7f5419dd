"""Straggler report: the hosts whose steps are slowest against the job's median host.

The goodput accounting uses each attempt's primary process; the other processes' step spans
(:attr:`~goodput_processor.timeline.ProcessSpans.data`) are used here only. For every host
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
a few ``reduceat``), so 4,096 hosts x thousands of steps cost tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .memo import cached, data_key, proc_key
from .packed import PackedProcessSpans
from .timeline import C_AUX, C_END, C_FLAGS, C_IVAL, C_KIND, C_START, F_NONBLOCKING, K_STEP, NONE

__all__ = ["DEFAULT_TOP", "StragglerHost", "StragglerReport", "straggler_report"]

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
                     top: int = DEFAULT_TOP, memo=None) -> StragglerReport | None:
    """The straggler report of a job's attempts.

    Args:
        attempts: the job's :class:`~goodput_processor.timeline.Attempt` objects.
        bounds: per attempt, the highest kept step number (None = all kept), as the
            accounting uses (the lowest resume step of the later attempts).
        top: how many of the slowest hosts to list (>= 1).
        memo: an :class:`~goodput_processor.memo.AccountingMemo`: the steps of processes
            whose rows are packed (:mod:`goodput_processor.packed`) are kept in it, so a
            poll does not inflate them again.

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
    ident: dict[tuple, int] = {}  # (host, process index) -> key
    procs, keys = [], []
    for a, bound in zip(attempts, bounds, strict=True):
        for p in a.processes:
            if not data_key(p)[0]:
                continue
            procs.append((p, NONE if bound is None else bound))  # NONE: no bound
            keys.append(ident.setdefault((p.host, p.index), len(ident)))
    if len(ident) < 2:
        return None
    parts = [cached(memo, ("straggler_steps", proc_key(p), cap), lambda p=p, cap=cap:
                    _steps(p.data, cap)) if isinstance(p, PackedProcessSpans)
             else _steps(p.data, cap) for p, cap in procs]
    lengths = np.fromiter((len(x[0]) for x in parts), np.int64, len(parts))
    key = np.repeat(np.asarray(keys, np.int64), lengths)
    snum, start, t = (np.concatenate([x[i] for x in parts]) for i in range(3))
    nkeys = len(ident)
    med, n = _group_median(key, t, nkeys)
    has = n > 0
    if int(has.sum()) < 2:
        return None
    overall = float(np.median(med[has]))
    ratio = np.full(nkeys, np.nan)
    if overall > 0:
        ratio[has] = med[has] / overall
    else:  # every host's median step is 0 ns: no host is slower than another
        ratio[has] = 1.0
    lag = _start_lag(key, snum, start, nkeys)
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


def _start_lag(key, snum, start, nkeys) -> np.ndarray:
    """Per key: median over its step numbers of (its start - median start of that step)."""
    ok = snum != NONE
    if not ok.any():
        return np.full(nkeys, np.nan)
    key, snum, start = key[ok], snum[ok], start[ok]
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
    lag = rel[shared] - np.floor(step_med[step_id][shared]).astype(np.int64)
    lag_med, _ = _group_median(key[shared], lag, nkeys)
    return lag_med
