"""Training slowdown split among hosts: each anomalous step's excess over the ideal step
time, shared by the hosts that arrived late at its synchronisation point (the waterfall of
:mod:`.attribution`'s docstring, "Slow steps").

:func:`slowdown_by_host` gives, per host process, the slowdown it caused (int ns) and what
no host explains. A host's *arrival* at a step is the step span's end minus the
``goodput.collective_wait`` time recorded inside it (schema 1.3), else the step's end. The
warm-up excess after a restart (:func:`~.warmup.warmup`) is the disruption's, taken out
first. With a memo, a live job's finished parts and the running attempt's candidate steps
are kept between polls (:data:`SPARE_CANDIDATES`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model.memo import cached, proc_key, rows_key
from ..read.rows import (
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_START,
    F_ENDLESS,
    F_NONBLOCKING,
    K_COLLECTIVE_WAIT,
    K_STEP,
    NONE,
)
from .recovery import stacked
from .warmup import warmup

__all__ = ["SPARE_CANDIDATES", "slowdown_by_host"]

#: Candidates (:class:`_Candidates`) kept beyond twice the anomalous steps, so that the
#: threshold can fall this far (in steps) before a part's steps are read again.
SPARE_CANDIDATES = 1024


def _arrivals(d: np.ndarray, key: np.ndarray, rows: bool = False):
    """(process index, step number, arrival ns) of the blocking, completed, numbered step
    spans in rows ``d`` (of processes ``key``): the span's end minus the collective wait
    recorded inside it (waits matched to the step of the same process whose start is the
    latest at or before theirs). ``rows``: also the step spans' indexes in ``d``."""
    flags, kinds = d[:, C_FLAGS], d[:, C_KIND]
    ss = np.flatnonzero((kinds == K_STEP) & ((flags & (F_NONBLOCKING | F_ENDLESS)) == 0)
                        & (d[:, C_IVAL] != NONE))
    ww = np.flatnonzero((kinds == K_COLLECTIVE_WAIT) & ((flags & F_NONBLOCKING) == 0))
    wait = np.zeros(len(ss), np.int64)
    if len(ss) and len(ww):
        k = np.concatenate((key[ss], key[ww]))
        t = np.concatenate((d[ss, C_START], d[ww, C_START]))
        typ = np.concatenate((np.zeros(len(ss), np.int8), np.ones(len(ww), np.int8)))
        src = np.concatenate((np.arange(len(ss)), np.arange(len(ww))))
        o = np.lexsort((typ, t, k))
        k, typ, src = k[o], typ[o], src[o]
        pos = np.where(typ == 0, np.arange(len(o)), -1)
        last = np.maximum.accumulate(pos)  # the latest step row at or before each row
        q = np.flatnonzero((typ == 1) & (last >= 0))
        q = q[k[last[q]] == k[q]]  # a step of the same process
        si, wi = src[last[q]], ww[src[q]]
        s_end = d[ss[si], C_END]
        ok = d[wi, C_START] < s_end
        dur = np.minimum(d[wi[ok], C_END], s_end[ok]) - d[wi[ok], C_START]
        wait = np.rint(np.bincount(si[ok], weights=dur, minlength=len(ss))).astype(np.int64)
    st = d[ss]
    arrival = st[:, C_END] - np.minimum(wait, st[:, C_END] - st[:, C_START])
    return (key[ss], st[:, C_IVAL], arrival) + ((ss,) if rows else ())


def _relevant(d: np.ndarray) -> np.ndarray:
    """Whether each row of ``d`` can change an arrival (:func:`_arrivals`): a blocking
    step span or a blocking collective wait."""
    kinds, flags = d[:, C_KIND], d[:, C_FLAGS]
    return ((kinds == K_STEP) | (kinds == K_COLLECTIVE_WAIT)) & ((flags & F_NONBLOCKING) == 0)


def slowdown_by_host(attempts: Sequence, result, memo=None) -> tuple[dict[tuple, int], int]:
    """Attributed slowdown per host process, ``{(host, rank): ns}``, and the unattributed ns.

    ``result`` is the accounting's :class:`~goodput_processor.results.job.JobResult` (its kept
    steps, anomalous flags and ideal step time). ``memo`` keeps, per attempt and per piece
    of the running one, the kept steps that can be anomalous (:class:`_Candidates`) and, for
    a finished attempt of several processes, their arrivals' waterfall: neither depends on
    the ideal step time, so a poll that moves it reads only the steps above the new
    threshold. Each attempt's share is kept under its inputs and the ideal and noise band.
    """
    out: dict[tuple, int] = {}
    unattributed = 0
    if result.ideal_step_time_s is None or not result.step_time.anomalous_steps:
        return out, 0
    for a in attempts:
        off, parts, pkeys = result.steps.of_attempt(a.attempt)
        if not parts:
            continue
        procs = tuple(proc_key(p) for p in a.processes)
        key = ("slow_by_host", tuple(pkeys), a is attempts[0], result.ideal_step_time_s,
               result.noise_tolerance_s, procs)
        if memo is not None and len(procs) > 1 and len(parts) > 1:  # the running attempt's
            memo.peek(_running_key(a))  # arrivals, folded as its rows arrive
        got, lost = cached(memo if pkeys[0] is not None else None, key, lambda a=a, off=off,
                           parts=parts, pkeys=pkeys: _attempt_slowdown(
                               a, a is attempts[0], result, off, parts, pkeys, memo))
        for k, v in got.items():
            out[k] = out.get(k, 0) + v
        unattributed += lost
    return out, max(unattributed, 0)


class _Candidates:
    """The kept steps of one part (an attempt, or a piece of the running one) that can be
    anomalous while the threshold (ideal step time + noise band, float ns per step) stays
    at or above ``floor``: every step whose time per step is above ``floor``, at most
    ``2 m +`` :data:`SPARE_CANDIDATES` of them for ``m`` anomalous when made. In canonical
    order, slowest first (ties: earlier step first), with ``idx`` (the steps' indexes in
    the part), ``ratio`` (time per step, float ns), ``nums`` (step numbers) and the running
    sums ``ct``, ``cc`` (int64, a leading 0) of their time (ns) and count: 40 bytes per
    candidate."""

    __slots__ = ("cc", "ct", "floor", "idx", "nums", "ratio", "waterfall")

    def __init__(self, part: tuple, thr: float):
        snum, _att, _start, t, cnt = part
        per = t / cnt
        n, m = len(per), int(np.count_nonzero(per > thr))
        k = 2 * m + SPARE_CANDIDATES
        if k >= n:
            self.floor, cand = -np.inf, np.arange(n)
        else:  # the (n - k)-th smallest time per step: at or below the threshold
            self.floor = float(np.partition(per, n - k - 1)[n - k - 1])
            cand = np.flatnonzero(per > self.floor)
        o = np.lexsort((cand, -per[cand]))
        self.idx = cand[o]
        self.ratio = per[self.idx]
        self.nums = snum[self.idx]
        self.ct = np.concatenate(([0], np.cumsum(t[self.idx])))
        self.cc = np.concatenate(([0], np.cumsum(cnt[self.idx])))
        self.waterfall = None

    def above(self, thr: float) -> int:
        """How many candidates are anomalous at threshold ``thr`` (>= ``floor``): the first
        ones, time per step above ``thr``."""
        return int(np.searchsorted(-self.ratio, -thr, "left"))


def _candidates(memo, key, part: tuple, thr: float, procs: tuple | None = None) -> _Candidates:
    """The :class:`_Candidates` of ``part`` for threshold ``thr``, kept in ``memo`` under
    ``key`` (the part's memo key; None: not kept) while ``thr`` stays at or above their
    floor; with ``procs`` (an attempt of several processes: ``(attempt, process keys)``),
    with their arrivals' waterfall (:func:`_waterfall`) kept beside them."""
    tag = ("slow_steps", key) if procs is None else ("slow_hosts", key, procs[1])
    c = memo.peek(tag) if memo is not None and key is not None else None
    if c is None or thr < c.floor:
        c = _Candidates(part, thr)
        if procs is not None:
            c.waterfall = _waterfall(procs[0], c.nums)
        if memo is not None and key is not None:
            memo.put(tag, c)
    return c


def _sorted_arrivals(a) -> tuple:
    """Attempt ``a``'s arrivals (:func:`_arrivals`) as one run sorted by step number,
    latest arrival first (ties: process order): ``(who, num, arr)``."""
    return _sort_run(*_arrivals(*stacked(a)[:2]))


def _sort_run(who, num, arr) -> tuple:
    o = np.lexsort((who, -arr, num))
    return who[o], num[o], arr[o]


def _gather(runs: list, nums: np.ndarray) -> tuple:
    """The arrivals of step numbers ``nums`` from sorted ``runs`` (:func:`_sort_run`), as
    one sorted run with each number's first entry and count: ``(who, num, arr, starts,
    size)``."""
    want = np.unique(nums[nums != NONE])
    if not runs:  # (no numbered step yet)
        z = np.zeros(0, np.int64)
        return z, z, z, z, z
    if len(runs) == 1:
        who, num, arr = runs[0]
    else:
        got = []
        for w, n, r in runs:
            lo, hi = np.searchsorted(n, want, "left"), np.searchsorted(n, want, "right")
            take = np.repeat(lo, hi - lo) + (np.arange(int((hi - lo).sum()))
                                              - np.repeat(np.cumsum(hi - lo) - (hi - lo),
                                                          hi - lo))
            got.append((w[take], n[take], r[take]))
        who, num, arr = _sort_run(*(np.concatenate([g[i] for g in got]) for i in range(3)))
    starts = np.flatnonzero(np.concatenate(([True], num[1:] != num[:-1]))) if len(num) \
        else np.zeros(0, np.int64)
    return who, num, arr, starts, np.diff(np.append(starts, len(num)))


def _waterfall(a, nums: np.ndarray, memo=None) -> tuple:
    """The arrivals' waterfall (module docstring) of attempt ``a``'s steps numbered
    ``nums`` (one entry per kept step, in its order; NONE: no number), independent of the
    ideal step time: ``(spread, bounds, who, blame)``: per step the spread of its arrivals
    ``a1 - ak`` (float ns; 0 without arrivals), and ``bounds`` (``len(nums) + 1``
    offsets) into ``who`` (process indexes into ``a``'s processes with rows) and
    ``blame`` (float ns, unscaled), the step's blames latest arrival first. Each step's
    blames are computed from its own arrivals alone, so the same step gets the same floats
    whatever else is asked for. With ``memo`` (the running attempt), the arrivals are
    folded as its rows arrive (:func:`_running_arrivals`)."""
    runs = [_sorted_arrivals(a)] if memo is None else _running_arrivals(a, memo)
    who, num, arr, starts, size = _gather(runs, nums)
    spread = np.zeros(len(nums))
    if not len(num):  # no arrivals: nothing to blame
        return spread, np.zeros(len(nums) + 1, np.int64), who, spread[:0]
    g = np.minimum(np.searchsorted(num[starts], nums), len(starts) - 1)
    has = (nums != NONE) & (num[starts][g] == nums)
    cnt = np.where(has, size[g], 0)
    bounds = np.concatenate(([0], np.cumsum(cnt)))
    blame = np.zeros(int(bounds[-1]))
    sel = np.flatnonzero(has)
    src = np.repeat(starts[g[sel]], cnt[sel]) + (np.arange(int(bounds[-1]))
                                                  - np.repeat(bounds[sel], cnt[sel]))
    if len(sel):
        k = int(size.max())
        # one row per step, arrivals latest first, the last padded with itself: row by row
        # (whatever the other rows), c_j = (a_j - a_(j+1)) / j and blame_j = sum over i >= j
        for lo in range(0, len(sel), max(1, (1 << 20) // k)):
            rows = sel[lo : lo + max(1, (1 << 20) // k)]
            r0, rn = starts[g[rows]], size[g[rows]]
            col = np.minimum(np.arange(k), (rn - 1)[:, None])
            m = arr[r0[:, None] + col].astype(float)
            c = np.zeros_like(m)
            c[:, :-1] = (m[:, :-1] - m[:, 1:]) / np.arange(1, k)
            b = np.cumsum(c[:, ::-1], axis=1)[:, ::-1]
            spread[rows] = m[:, 0] - m[:, -1]
            into = np.arange(k) < rn[:, None]
            blame[bounds[rows][:, None].repeat(k, 1)[into] + np.nonzero(into)[1]] = b[into]
    return spread, bounds, who[src], blame


def _running_key(a) -> tuple:
    return ("arrivals_running", tuple(
        (o[0], o[2]) if (o := getattr(p, "origin", None)) is not None
        else (p.host, p.index, getattr(p, "attempt", None)) for p in a.processes
        if len(p.data)))


def _running_arrivals(a, memo) -> list:
    """The running attempt ``a``'s arrivals as sorted runs (:func:`_sort_run`), folded as
    its rows arrive: per process, the rows that only grow (``p.settled`` of an attempt's
    process, else all) are read from where the last poll stopped. A step's arrival is
    final once a later step of its process has started (a wait belongs to the latest step
    of its process that started at or before it); the latest steps and the waits from
    their start are kept as rows and read again with the new ones. A new step or wait that
    starts before the latest step taken starts again from the first row; one among the
    other rows (open records resolved) reads every row of the attempt (one run)."""
    procs = [p for p in a.processes if len(p.data)]
    skey = _running_key(a)
    settled = [len(p.data) if getattr(p, "origin", None) is None or p.settled is None
               else p.settled for p in procs]
    st = memo.peek(skey)
    if st is None or not all(n <= m and rows_key(p.data[:n]) == rk for p, m, (n, rk) in zip(
            procs, settled, st["taken"], strict=True)):
        st = None
    got = None if st is None else _fold_arrivals(st, procs, settled)
    if got is None:
        st = {"taken": [(0, rows_key(p.data[:0])) for p in procs], "latest": [None] * len(
            procs), "pending": [p.data[:0] for p in procs], "runs": ()}
        got = _fold_arrivals(st, procs, settled)
    memo.put(skey, got)
    rest = []
    for i, (p, m) in enumerate(zip(procs, settled, strict=True)):
        tail = p.data[m:]
        tail = tail[_relevant(tail)]
        t0 = got["latest"][i]
        if t0 is not None and len(tail) and int(tail[:, C_START].min()) < t0:
            return [_sorted_arrivals(a)]
        d = np.concatenate((got["pending"][i], tail))
        if len(d):
            w, n, r = _arrivals(d, np.zeros(len(d), np.int64))
            rest.append((w + i, n, r))
    if rest:
        return [*got["runs"], _sort_run(*(np.concatenate([x[j] for x in rest])
                                          for j in range(3)))]
    return list(got["runs"])


def _fold_arrivals(st: dict, procs: list, settled: list) -> dict | None:
    """``st`` (:func:`_running_arrivals`' state) with each process's rows up to
    ``settled`` taken in; None when a new row starts before its process's latest step."""
    taken, latest, pending, sealed = [], [], [], []
    for i, (p, m) in enumerate(zip(procs, settled, strict=True)):
        n = st["taken"][i][0]
        new = p.data[n:m]
        new = new[_relevant(new)]
        t0 = st["latest"][i]
        if t0 is not None and len(new) and int(new[:, C_START].min()) < t0:
            return None
        d = np.concatenate((st["pending"][i], new))
        w, num, arr, ss = _arrivals(d, np.zeros(len(d), np.int64), rows=True)
        if len(ss):
            t0 = int(d[ss, C_START].max())
            done = d[ss, C_START] < t0
            sealed.append((w[done] + i, num[done], arr[done]))
        keep = d[:, C_START] >= t0 if t0 is not None else np.ones(len(d), bool)
        pending.append(d[keep])
        latest.append(t0)
        taken.append((m, rows_key(p.data[:m])))
    runs = st["runs"]
    if sealed:
        run = _sort_run(*(np.concatenate([x[j] for x in sealed]) for j in range(3)))
        if len(run[0]):
            runs = _grow_runs(runs, run)
    return {"taken": taken, "latest": latest, "pending": pending, "runs": runs}


def _grow_runs(runs: tuple, run: tuple) -> tuple:
    """``runs`` and ``run``, the last two merged while the one before is under twice the
    last's size (so there are O(log n) runs)."""
    out = [*runs, run]
    while len(out) > 1 and len(out[-2][0]) < 2 * len(out[-1][0]):
        b, a = out.pop(), out.pop()
        out.append(_sort_run(*(np.concatenate((a[j], b[j])) for j in range(3))))
    return tuple(out)


def _attempt_slowdown(a, first: bool, result, off: int, parts: list, pkeys: list,
                      memo) -> tuple[dict[tuple, int], int]:
    """One attempt's share of :func:`slowdown_by_host`: ``({(host, rank): ns}, unattributed
    ns)``; ``off``, ``parts``, ``pkeys``: where its kept steps begin in ``result.steps``,
    their parts and the parts' memo keys (:meth:`~.steptimes.StepSeries.of_attempt`).

    The anomalous steps' excess is ``sum(t) - sum(count) * ideal`` from integer running
    sums, the warm-up steps' share (:func:`~.warmup.warmup`, after a restart) taken out
    step by step; with several processes, each step's excess scales its waterfall's blames
    (by ``min(1, excess / spread)``), summed per process in the candidates' canonical
    order, so that the result does not depend on how the steps were split into parts.
    """
    st = result.steps
    ideal = float(st.ideal_ns)  # (an int when the ideal step time was given)
    thr = ideal + st.tol_ns
    multi = len(a.processes) > 1
    procs = (a, tuple(proc_key(p) for p in a.processes)) if multi and len(parts) == 1 else None
    cands, base = [], off
    for p, k in zip(parts, pkeys, strict=True):
        c = _candidates(memo, k, p, thr, procs)
        cands.append((c, c.above(thr), base))
        base += len(p[0])
    t_sum = sum(int(c.ct[m]) for c, m, _ in cands)
    c_sum = sum(int(c.cc[m]) for c, m, _ in cands)
    if not c_sum:
        return {}, 0
    warm_idx, warm_ex = np.zeros(0, np.int64), np.zeros(0)
    if not first:  # its warm-up after a restart is the disruption's badput
        widx, wex, _ = warmup(result, a.attempt, memo)
        if len(widx):
            wt, wc = st.take("time_ns", widx), st.take("count", widx)
            anom = wt / wc > thr
            warm_idx, e = widx[anom], wt[anom] - wc[anom] * ideal
            warm_ex = e - np.maximum(e - wex[anom], 0)  # what the warm-up takes of each
    total = (t_sum - c_sum * ideal) - float(warm_ex.sum())
    if not multi:
        return {(a.primary.host, a.primary.index): int(round(total))}, 0
    if procs is not None:  # a finished attempt: its waterfall kept with its candidates
        c, m, _ = cands[0]
        idx = c.idx[:m] + off
        spread, bounds, who, blame = c.waterfall
        ne = int(bounds[m])
        spread, bounds, who, blame = spread[:m], bounds[: m + 1], who[:ne], blame[:ne]
    else:  # the running attempt: its anomalous steps in canonical order, arrivals anew
        idx = np.concatenate([c.idx[:m] + b for c, m, b in cands])
        ratio = np.concatenate([c.ratio[:m] for c, m, _ in cands])
        nums = np.concatenate([c.nums[:m] for c, m, _ in cands])
        o = np.lexsort((idx, -ratio))
        idx = idx[o]
        spread, bounds, who, blame = _waterfall(a, nums[o], memo)
    excess = st.take("time_ns", idx) - st.take("count", idx) * ideal
    if len(warm_idx):
        o = np.argsort(idx)
        at = o[np.searchsorted(idx[o], warm_idx)]
        excess[at] -= warm_ex
    scale = np.where(spread > 0, np.minimum(1.0, np.maximum(excess, 0) / np.where(
        spread > 0, spread, 1)), 0.0)
    blame = blame * np.repeat(scale, np.diff(bounds))
    keys = [(p.host, p.index) for p in a.processes if len(p.data)]
    got = np.bincount(who, weights=blame, minlength=len(keys))
    out = {k: int(round(float(v))) for k, v in zip(keys, got, strict=True) if v > 0}
    return out, int(round(total - float(blame.sum())))
