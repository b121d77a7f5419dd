"""Step-time statistics of a job's kept steps (``docs/accounting.md``, "Ideal step time"
and "Training slowdown"); the per-step arrays of the result are :mod:`.step_arrays`.

The accounting hands over the kept steps as one *part* per attempt: ``(step numbers,
attempt numbers, starts (ns), times (ns), counts)``, int64 arrays in time order. From them:

- the ideal step time (the median time per step, unless given), the noise band (3 sigma of
  the differences of consecutive single-step times, sigma from their median absolute value,
  at least 5 % of the ideal and 1 µs), the percentiles (linear interpolation between
  closest ranks, numpy's default ``linear`` method, Hyndman & Fan type 7), and the count
  and time of the anomalous steps (time per step above ideal + band);
- :class:`~.step_arrays.StepArrays` (:mod:`.step_arrays`), whose arrays are concatenated
  from the parts when first read.

Without a memo, order statistics come from ``np.partition`` of all steps. With a
:class:`~goodput_processor.model.memo.AccountingMemo`, the finished attempts' steps are sorted
once (with running sums of time and count in that order) and kept; a poll sorts only the
last attempt's steps and answers each order statistic and threshold sum with binary
searches over the two sorted runs. Both ways give the same numbers, bit for bit
(``tests/model/test_incremental.py``): every statistic is a function of selected values and
integer sums, never of a floating-point sum's order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .order_stats import kth_runs, kth_union, median_of, quantiles_of

__all__ = ["StepStats", "runs_median", "step_stats"]

_NS = 1_000_000_000
_MIN_TOL_NS = 1_000
_MIN_TOL_REL = 0.05
_MAD_NORMAL = 0.6745
_QUANTILES = (0.5, 0.9, 0.99, 1.0)


@dataclass(frozen=True)
class StepStats:
    """What the accounting takes from the kept steps. ``ideal_ns``, ``tol_ns``: float ns
    (``ideal_ns`` None without steps and without a given ideal); ``source``: "given",
    "estimated" or None; ``percentiles_s``: p50, p90, p99, max in seconds (None without
    steps); ``anomalous``: steps (counts) above ideal + band; ``slowdown_ns``: their time
    above the ideal (int ns); ``steps``/``time_ns``: kept steps and their time;
    ``max_step``: highest step number (None if none)."""

    ideal_ns: float | None
    source: str | None
    tol_ns: float
    percentiles_s: tuple
    anomalous: int
    slowdown_ns: int
    steps: int
    time_ns: int
    max_step: int | None
    #: ``kth(ranks) -> values``: order statistics of the time per step (float ns)
    kth: object = field(default=None, compare=False, repr=False)


#: Where every kept step is one step (recorded steps) and its time is below 2**53 ns (its
#: float64 time per step is then the time itself), the running sums of time are kept at
#: every ``_BLOCK``-th sorted step only, and a sum up to any other place adds the sorted
#: times in between: 8 bytes a step fewer for the sums of count, and 8 for those of time.
_BLOCK = 64
_EXACT = float(2**53)


class _Sorted:
    """Kept steps of some parts for order statistics: time per step sorted (float64 ns),
    running sums of time (int64 ns) and count in that order, the sorted absolute
    differences of consecutive single-step times (float64 ns, in time order within these
    steps), their first and last single-step times, and the highest step number (None if
    none). Built from ``per``, ``t`` and ``cnt`` in sorted order (int64 times and
    counts); the running sums are kept whole only where some step counts more than one."""

    def __init__(self, per, t, cnt, diffs, first, last, max_step):
        self.per, self.diffs = per, diffs
        self.first, self.last, self.max_step = first, last, max_step
        cum_t = np.concatenate(([0], np.cumsum(t)))
        self.ones = bool((cnt == 1).all()) and (not len(per) or float(per[-1]) < _EXACT
                                                and float(per[0]) >= 0)
        if self.ones:  # (the times are the sorted times per step themselves)
            self.cum_t, self.cum_cnt = cum_t[::_BLOCK].copy(), None
            self.total_t, self.total_cnt = int(cum_t[-1]), len(per)
        else:
            self.cum_t, self.cum_cnt = cum_t, np.concatenate(([0], np.cumsum(cnt)))
            self.total_t, self.total_cnt = int(cum_t[-1]), int(self.cum_cnt[-1])

    @classmethod
    def of(cls, parts: list, none: int) -> _Sorted:
        """From kept-step parts ``(step, attempt, start_ns, time_ns, count)`` in time order."""
        snum, t, cnt = (np.concatenate([p[i] for p in parts]) for i in (0, 3, 4))
        per = t / cnt
        order = np.argsort(per, kind="stable")
        single = t[cnt == 1]
        valid = snum[snum != none]
        return cls(per[order], t[order], cnt[order],
                   np.sort(np.abs(np.diff(single)).astype(np.float64)), single[:1].copy(),
                   single[-1:].copy(),  # (copies: a view would keep every single-step time)
                   int(valid.max()) if len(valid) else None)

    def times(self) -> np.ndarray:
        """The time of each step, in sorted order (int64 ns)."""
        return self.per.astype(np.int64) if self.ones else np.diff(self.cum_t)

    def counts(self) -> np.ndarray:
        """The count of each step, in sorted order (int64)."""
        return np.ones(len(self.per), np.int64) if self.ones else np.diff(self.cum_cnt)

    def sums(self, i: int) -> tuple[int, int]:
        """(count, time ns) of the first ``i`` sorted steps."""
        if not self.ones:
            return int(self.cum_cnt[i]), int(self.cum_t[i])
        b = i // _BLOCK
        rest = self.per[b * _BLOCK : i].astype(np.int64)
        return i, int(self.cum_t[b]) + int(rest.sum())

    def merge(self, later: _Sorted) -> _Sorted:
        """These steps followed (in time) by ``later``'s: the same as :meth:`of` of all the
        parts, in one pass over two sorted runs (timsort)."""
        per = np.concatenate((self.per, later.per))
        order = np.argsort(per, kind="stable")
        t = np.concatenate((self.times(), later.times()))[order]
        cnt = np.concatenate((self.counts(), later.counts()))[order]
        diffs = np.sort(np.concatenate((self.diffs, later.diffs, self.boundary(later))),
                        kind="stable")
        maxes = [m for m in (self.max_step, later.max_step) if m is not None]
        return _Sorted(per[order], t, cnt, diffs,
                       self.first if len(self.first) else later.first,
                       later.last if len(later.last) else self.last,
                       max(maxes) if maxes else None)

    def boundary(self, later: _Sorted) -> np.ndarray:
        """The difference between these steps' last single-step time and ``later``'s first
        (float64, one value, or none when either has no single step)."""
        joint = later.first if len(self.last) else later.first[:0]
        return np.abs(self.last[:1] - joint).astype(np.float64)

    def same(self, other: _Sorted) -> bool:
        """Whether ``other`` holds the same steps, element by element."""
        return (self.ones == other.ones and self.max_step == other.max_step and all(
            np.array_equal(a, b) for a, b in (
                (self.per, other.per), (self.diffs, other.diffs), (self.cum_t, other.cum_t),
                (self.first, other.first), (self.last, other.last)))
            and (self.ones or np.array_equal(self.cum_cnt, other.cum_cnt)))

    def spill(self, mapper) -> bool:
        """Keep the arrays (not the first and last times) where ``mapper(list of arrays)``
        puts them (equal arrays, such as :meth:`~goodput_processor.serve.spill.Spill.map`'s
        memory-mapped ones; None: they stay). In place: whoever holds this run reads them
        there. Returns whether they moved."""
        names = [n for n in ("per", "diffs", "cum_t", "cum_cnt") if getattr(self, n) is not None]
        got = mapper([getattr(self, n) for n in names])
        if got is None:
            return False
        for n, a in zip(names, got, strict=True):
            setattr(self, n, a)
        return True

    def above(self, thr: float) -> tuple[int, int]:
        """(count, time ns) of the steps whose time per step is > ``thr``."""
        n, t = self.sums(int(np.searchsorted(self.per, thr, "right")))
        return self.total_cnt - n, self.total_t - t


#: how many parts back :func:`_sorted_parts` looks for a kept sorted run to extend
_LOOK_BACK = 4


def _sorted_parts(memo, tag: str, parts: list, keys: list, none: int) -> _Sorted:
    """:meth:`_Sorted.of` ``parts``, kept in ``memo`` under ``(tag, keys)``; built by
    extending the run kept for a shorter prefix of the same parts when there is one (a
    running attempt's pieces come one at a time)."""
    found, i = None, len(parts)
    while i > max(0, len(parts) - _LOOK_BACK):
        found = memo.peek((tag, tuple(keys[:i])))
        if found is not None:
            break
        i -= 1
    if found is None:
        return memo.get((tag, tuple(keys)), lambda: _Sorted.of(parts, none))
    if i == len(parts):
        return memo.get((tag, tuple(keys)), lambda: found)
    return memo.get((tag, tuple(keys)), lambda: found.merge(_Sorted.of(parts[i:], none)))


def runs_median(parts: list, keys: list, none: int, memo=None) -> float:
    """Median time per step (float ns, as ``np.median``) of the kept-step ``parts``
    (at least one step); with ``memo``, the parts but the last sorted once and kept
    under their ``keys``, and the median of the same parts kept too (a poll with nothing
    new reads it; it keeps the sorted parts it extends alive)."""
    if memo is None or len(parts) < 2:
        return float(np.median(np.concatenate([p[3] / p[4] for p in parts]),
                               overwrite_input=True))
    key = ("runs_median", tuple(keys))
    median = memo.peek(key)
    if median is not None:
        memo.peek(("sorted_attempt", tuple(keys[:-1])))
        return median
    head = _sorted_parts(memo, "sorted_attempt", parts[:-1], keys[:-1], none)
    tail = _Sorted.of(parts[-1:], none)
    median = median_of(lambda ks: kth_union(head.per, tail.per, ks), len(head.per) + len(tail.per))
    memo.put(key, median)
    return median


def _finish(ideal_given_ns, n: int, kth_per, nd: int, kth_diff, above, steps: int,
            time_ns: int, max_step) -> StepStats:
    """The statistics from order-statistic and threshold functions (see :func:`step_stats`)."""
    if ideal_given_ns is not None:
        ideal, source = ideal_given_ns, "given"
    elif n:
        ideal, source = median_of(kth_per, n), "estimated"
    else:
        ideal, source = None, None
    tol = float(_MIN_TOL_NS)
    if ideal is not None:
        tol = max(tol, _MIN_TOL_REL * ideal)
    if nd >= 1:  # the noise estimate uses recorded (single) steps only
        sigma = median_of(kth_diff, nd) / (math.sqrt(2) * _MAD_NORMAL)
        tol = max(3 * sigma, tol)
    n_anom, t_anom = above(ideal + tol) if ideal is not None and n else (0, 0)
    slowdown = round(t_anom - n_anom * ideal) if n_anom else 0
    pct = tuple(quantiles_of(kth_per, n, _NS, _QUANTILES)) if n else (None,) * 4
    return StepStats(ideal, source, tol, pct, n_anom, slowdown, steps, time_ns, max_step,
                     kth_per)


def step_stats(parts: list, ideal_given_ns, none: int, memo=None,
               part_keys: list | None = None) -> StepStats:
    """:class:`StepStats` of the kept steps ``parts`` (one per attempt, or per piece of the
    running one: see the module docstring). ``ideal_given_ns``: the given ideal step time
    (ns) or None; ``none``: the step number of a step span without one. With ``memo``,
    ``part_keys`` are the memo keys of the parts (:meth:`~goodput_processor.account.painting._Acc.
    attempt`'s: a whole attempt's begins with "attempt"); the whole attempts before the
    last part are sorted once and kept (until an attempt is added), and so are a running
    attempt's pieces before its last (under the key :func:`runs_median` keeps them by: one
    copy), so that a new piece sorts that attempt's steps again, not the job's; the
    statistics are kept under the parts' keys and the given ideal step time."""
    if memo is None or len(parts) < 2:
        return _fresh(parts, ideal_given_ns, none)
    f = 0
    while f < len(parts) - 1 and part_keys[f][0] == "attempt":
        f += 1
    heads = [(t, tuple(ks)) for t, ks in (("sorted_steps", part_keys[:f]),
                                          ("sorted_attempt", part_keys[f:-1])) if ks]
    key = ("step_stats", tuple(part_keys), ideal_given_ns, none)
    kept = memo.peek(key)  # the same parts (a poll with nothing new): the same statistics
    if kept is not None:
        for h in heads:  # (what the next poll extends stays kept)
            memo.peek(h)
        return kept
    runs = []
    if f:
        runs.append(_sorted_parts(memo, "sorted_steps", parts[:f], part_keys[:f], none))
    if f < len(parts) - 1:
        runs.append(_sorted_parts(memo, "sorted_attempt", parts[f:-1], part_keys[f:-1], none))
    runs.append(_Sorted.of(parts[-1:], none))
    diffs, prev, gaps = [r.diffs for r in runs[:-1]], runs[0], []
    for r in runs[1:]:  # the differences across the joins, from the last run with singles
        gaps.append(prev.boundary(r))
        prev = r if len(r.last) else prev
    diffs.append(np.sort(np.concatenate((runs[-1].diffs, *gaps))))

    def above(thr):
        got = [r.above(thr) for r in runs]
        return sum(g[0] for g in got), sum(g[1] for g in got)

    maxes = [r.max_step for r in runs if r.max_step is not None]
    pers = [r.per for r in runs]
    stats = _finish(ideal_given_ns, sum(len(x) for x in pers),
                    lambda ks: kth_runs(pers, ks), sum(len(x) for x in diffs),
                    lambda ks: kth_runs(diffs, ks), above,
                    sum(r.total_cnt for r in runs), sum(r.total_t for r in runs),
                    max(maxes) if maxes else None)
    memo.put(key, stats)
    return stats


def _fresh(parts, ideal_given_ns, none: int) -> StepStats:
    """:func:`step_stats` without a memo: ``np.partition`` of all the steps.

    Memory: the parts are read where they are (never concatenated); what is made is the
    differences of consecutive single-step times (float64, 8 bytes a step, partitioned in
    place for their median, then let go), then the time per step (float64, 8 bytes a step,
    kept for the order statistics), and one part's temporaries at a time (at most
    :data:`_CHUNK` steps of them)."""
    if not parts:
        parts = [(np.zeros(0, np.int64),) * 5]
    ts, cnts = [p[3] for p in parts], [p[4] for p in parts]
    ones = [not len(c) or (c.min() == 1 and c.max() == 1) for c in cnts]
    nd, diff_mid = _diff_median_ranks(ts, cnts, ones)
    per = np.empty(sum(len(t) for t in ts))
    at = 0
    for t, c in zip(ts, cnts, strict=True):
        np.divide(t, c, out=per[at : at + len(t)])
        at += len(t)

    def kth_per(ks):  # per is ours alone: partitioned in place, any later ranks stay right
        per.partition(ks)
        return [float(v) for v in per[ks]]

    def kth_diff(ks):  # (only the median's ranks are asked for, see _finish)
        return [diff_mid[k] for k in ks]

    def above(thr):  # from the parts, in their order (per is partitioned)
        n = tot = 0
        for t, c, one in zip(ts, cnts, ones, strict=True):
            for i in range(0, len(t), _CHUNK):
                tc, cc = t[i : i + _CHUNK], c[i : i + _CHUNK]
                hit = tc > thr if one else tc / cc > thr  # (t / 1 is t, exactly)
                n += int(hit.sum()) if one else int(cc[hit].sum())
                tot += int(tc[hit].sum())
        return n, tot

    maxes = []  # the highest step number of each part (a mask, not a copy)
    for p in parts:
        numbered = p[0] != none
        if numbered.any():
            maxes.append(int(np.max(p[0], where=numbered, initial=none)))
    return _finish(ideal_given_ns, len(per), kth_per, nd, kth_diff, above,
                   sum(int(c.sum()) for c in cnts), sum(int(t.sum()) for t in ts),
                   max(maxes) if maxes else None)


#: Steps a part's temporaries cover at a time in :func:`_fresh`.
_CHUNK = 1 << 18


def _diff_median_ranks(ts, cnts, ones) -> tuple[int, dict[int, float]]:
    """The number of absolute differences of consecutive single-step times (across the
    parts too, as of all of them) and their values at the ranks
    :func:`~.order_stats.median_of` reads (``rank -> float ns``); the differences are made,
    partitioned and let go here."""
    singles = [t if one else t[c == 1] for t, c, one in zip(ts, cnts, ones, strict=True)]
    diffs = np.empty(max(sum(len(x) for x in singles) - 1, 0))
    at, prev = 0, None
    for x in singles:
        if not len(x):
            continue
        if prev is not None:
            diffs[at] = abs(int(x[0]) - prev)
            at += 1
        for i in range(0, len(x) - 1, _CHUNK):  # (np.diff of a chunk, one step over it)
            step = np.diff(x[i : i + _CHUNK + 1])
            np.abs(step, out=step)
            diffs[at : at + len(step)] = step
            at += len(step)
        prev = int(x[-1])
    del singles
    got: dict[int, float] = {}

    def kth(ks):  # (the ranks median_of asks for, kept for _finish to ask again)
        diffs.partition(ks)
        got.update((k, float(diffs[k])) for k in ks)
        return [got[k] for k in ks]

    if len(diffs):
        median_of(kth, len(diffs))
    return len(diffs), got
