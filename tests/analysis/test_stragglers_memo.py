"""The straggler report kept per attempt equals the whole job's at once (Hypothesis).

``stragglers.straggler_report`` sorts each attempt's step times and start lags once
(``keyed_runs.KeyedRun``), merges the finished attempts', and reads the medians from the
runs (``keyed_runs.union_median``). :func:`_reference` is the report as it was computed
before, from every kept step of the job at once (one concatenation, a sort and group
medians): on random jobs (several processes, restarts that redo steps, attempts whose step
numbers overlap, steps run twice, unnumbered steps, spans of several steps) both must give
the same report, float for float, fresh and through a memo fed poll after poll.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodput_processor.analysis.keyed_runs import KeyedRun, union_median
from goodput_processor.analysis.stragglers import (
    StragglerHost,
    StragglerReport,
    _group_median,
    _steps,
    straggler_report,
)
from goodput_processor.model.memo import AccountingMemo
from goodput_processor.read.rows import (
    C_AUX,
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_START,
    F_NONBLOCKING,
    K_DATA_LOADING,
    K_STEP,
    NCOLS,
    NONE,
)

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000 * 10**9
S = 10**9


def _reference(attempts, bounds, top=5):
    """The straggler report from all kept steps at once (the code before the memo)."""
    ident, procs, keys = {}, [], []
    for a, bound in zip(attempts, bounds, strict=True):
        for p in a.processes:
            if not len(p.data):
                continue
            procs.append((p, NONE if bound is None else bound))
            keys.append(ident.setdefault((p.host, p.index), len(ident)))
    if len(ident) < 2:
        return None
    parts = [_steps(p.data, cap) for p, cap in procs]
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
    ratio[has] = med[has] / overall if overall > 0 else 1.0
    ok = snum != NONE
    lag = np.full(nkeys, np.nan)
    if ok.any():
        k, sn, s0 = key[ok], snum[ok], start[ok]
        o = np.lexsort((s0, sn, k))
        k, sn, s0 = k[o], sn[o], s0[o]
        last = np.ones(len(k), bool)
        last[:-1] = (k[1:] != k[:-1]) | (sn[1:] != sn[:-1])
        k, sn, s0 = k[last], sn[last], s0[last]
        _, step_id = np.unique(sn, return_inverse=True)
        rel = s0 - s0.min()
        step_med, step_n = _group_median(step_id, rel, int(step_id.max()) + 1)
        shared = step_n[step_id] >= 2
        lag, _ = _group_median(k[shared], rel[shared] - np.floor(
            step_med[step_id][shared]).astype(np.int64), nkeys)
    names = list(ident)
    idx = np.flatnonzero(has)
    proc = np.array([names[i][1] for i in idx], np.int64)
    order = idx[np.lexsort((proc, -ratio[idx]))][:top]
    return StragglerReport(
        hosts=int(has.sum()), median_step_time_s=overall / S,
        max_ratio=float(ratio[order[0]]),
        slowest=tuple(StragglerHost(
            host=names[i][0], process=int(names[i][1]), steps=int(n[i]),
            median_step_time_s=float(med[i]) / S, ratio=float(ratio[i]),
            median_start_lag_s=None if np.isnan(lag[i]) else float(lag[i]) / S)
            for i in order))


def _rows(draw, first: int, last: int, t0: int, slow: float) -> np.ndarray:
    """Step rows (with a data loading row before each) for steps first..last."""
    rows, t = [], t0
    for n in range(first, last + 1):
        load = draw(st.integers(0, 3)) * S // 10
        r = np.full(NCOLS, 0, np.int64)
        r[[C_START, C_END, C_KIND, C_IVAL, C_AUX]] = t, t + load, K_DATA_LOADING, NONE, NONE
        rows.append(r)
        t += load
        d = int(S * slow * draw(st.sampled_from([1.0, 1.0, 1.1, 2.0])))
        r = np.full(NCOLS, 0, np.int64)
        num = NONE if draw(st.integers(0, 15)) == 0 else n
        count = draw(st.sampled_from([NONE, NONE, NONE, 2]))
        r[[C_START, C_END, C_KIND, C_IVAL, C_AUX]] = t, t + d, K_STEP, num, count
        r[C_FLAGS] = F_NONBLOCKING if draw(st.integers(0, 20)) == 0 else 0
        rows.append(r)
        t += d
        if draw(st.integers(0, 25)) == 0:  # a step run twice
            rows.append(r.copy())
    return np.array(rows, np.int64).reshape(-1, NCOLS)


@st.composite
def jobs(draw):
    """Attempts of 1-4 processes on 2-5 hosts, each resuming at a drawn step (sometimes
    below the previous attempt's first: overlapping step numbers), and their bounds."""
    hosts = draw(st.integers(2, 5))
    n_att = draw(st.integers(1, 4))
    attempts, first, t0 = [], 1, T0
    for a in range(n_att):
        last = first + draw(st.integers(0, 12))
        procs = []
        for h in draw(st.lists(st.integers(0, hosts - 1), min_size=1, max_size=4,
                               unique=True)):
            lag = draw(st.integers(0, 4)) * S // 10
            slow = draw(st.sampled_from([1.0, 1.0, 1.5]))
            procs.append(SimpleNamespace(host=f"h{h}", index=h, attempt=a,
                                         data=_rows(draw, first, last, t0 + lag, slow)))
        attempts.append(SimpleNamespace(attempt=a, processes=procs))
        t0 += 100 * S
        first = max(1, last - draw(st.integers(-2, 6)))
    bounds = [draw(st.one_of(st.none(), st.integers(0, 60))) for _ in attempts[:-1]] + [None]
    return attempts, bounds


@given(jobs(), st.integers(1, 3))
@SETTINGS
def test_kept_per_attempt_equals_the_whole_job_at_once(job, top):
    attempts, bounds = job
    assert straggler_report(attempts, bounds, top) == _reference(attempts, bounds, top)


@given(jobs(), st.data())
@SETTINGS
def test_memo_poll_after_poll_equals_fresh(job, data):
    """The last attempt's rows arrive a piece at a time (each poll a memo round), in order
    or, for some processes, shuffled (late rows below a step number already settled)."""
    attempts, bounds = job
    memo = AccountingMemo()
    last = attempts[-1]
    full = [p.data[data.draw(st.permutations(range(len(p.data))))]
            if len(p.data) and data.draw(st.booleans()) else p.data for p in last.processes]
    cuts = sorted(data.draw(st.lists(st.integers(0, max(len(d) for d in full)), max_size=8)))
    for cut in [*cuts, None]:
        grown = SimpleNamespace(attempt=last.attempt, processes=[
            SimpleNamespace(host=p.host, index=p.index, attempt=p.attempt, data=d[:cut])
            for p, d in zip(last.processes, full, strict=True)])
        now = [*attempts[:-1], grown]
        assert straggler_report(now, bounds, 3, memo) == _reference(now, bounds, 3)
        memo.end_round()


def test_a_poll_sorts_only_the_running_attempt_and_nothing_when_nothing_is_new():
    def attempt(a, first, rows):
        return SimpleNamespace(attempt=a, processes=[SimpleNamespace(
            host=f"h{h}", index=h, attempt=a, data=np.array([
                [T0 + a * 10**12 + n * S + h, T0 + a * 10**12 + (n + 1) * S, K_STEP, n,
                 NONE, 0, 0, 0, 0] for n in range(first, first + rows)], np.int64))
            for h in range(3)])

    attempts = [attempt(0, 1, 50), attempt(1, 40, 50), attempt(2, 80, 50)]
    bounds = [39, 79, None]
    memo = AccountingMemo()
    assert straggler_report(attempts, bounds, memo=memo) == _reference(attempts, bounds)
    memo.end_round()
    misses = memo.misses  # two finished parts, them merged, the report (the running
    assert misses == 4  # attempt's is kept apart: stragglers._running)
    assert straggler_report(attempts, bounds, memo=memo) == _reference(attempts, bounds)
    memo.end_round()
    assert memo.misses == misses  # nothing new: all kept
    attempts[2] = attempt(2, 80, 60)  # the running attempt grew
    assert straggler_report(attempts, bounds, memo=memo) == _reference(attempts, bounds)
    assert memo.misses == misses + 1  # the report, not the finished parts


def test_union_median_of_runs_equals_numpy_median():
    rng = np.random.default_rng(0)
    keys = [rng.integers(0, 7, 500), rng.integers(0, 3, 40), rng.integers(0, 7, 0)]
    vals = [rng.integers(-10**12, 10**12, 500), rng.integers(0, 9, 40), np.zeros(0, np.int64)]
    runs = [(KeyedRun(k, v, 7), np.arange(7)) for k, v in zip(keys, vals, strict=True)]
    runs[1] = (KeyedRun(keys[1], vals[1], 3), np.array([2, 0, -1, 1, -1, -1, -1]))
    med, n = union_median(runs, 7)
    own = [keys[0], np.array([1, 3, 0])[keys[1]]]
    allk, allv = np.concatenate(own), np.concatenate(vals[:2])
    for k in range(7):
        want = allv[allk == k]
        assert n[k] == len(want)
        assert (np.isnan(med[k]) and not len(want)) or med[k] == np.median(want)
    wide = KeyedRun(np.array([0, 0, 1]), np.array([-(2**62), 2**62, 5]), 2)
    assert wide.enc is None  # (too wide to encode: kept as values)
    assert union_median([(wide, np.arange(2))], 2)[0].tolist() == [0.0, 5.0]
