"""The sorted kept steps a live job keeps between polls (``steptimes._Sorted``) answer every
threshold sum exactly, whether their running sums are kept whole or one in 64, and
every order statistic of the union of several runs (Hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput_processor.analysis.order_stats import kth_runs
from goodput_processor.analysis.steptimes import _BLOCK, _Sorted
from goodput_processor.read.rows import NONE


def _part(times, counts, first_step=0):
    n = len(times)
    return (np.arange(first_step, first_step + n, dtype=np.int64), np.zeros(n, np.int64),
            np.arange(n, dtype=np.int64), np.asarray(times, np.int64),
            np.asarray(counts, np.int64))


_times = st.one_of(  # (mostly below 2**53 ns; a few runs with times around it)
    st.lists(st.integers(0, 10**10), max_size=8),
    st.lists(st.integers(0, 10**10), min_size=_BLOCK - 1, max_size=3 * _BLOCK),
    st.lists(st.one_of(st.integers(0, 10**10), st.integers(2**53 - 3, 2**53 + 3)),
             max_size=3 * _BLOCK))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(a=_times, b=_times, multi=st.booleans(), data=st.data())
def test_sums_and_merge_are_exact(a, b, multi, data):
    """For kept steps of one count each (sums one in 64) or some of several (sums whole),
    ``above`` of any threshold equals summing the steps above it, and merging two runs
    equals sorting both at once."""
    def counts(n):
        return [data.draw(st.integers(1, 3)) if multi else 1 for _ in range(n)]

    pa, pb = _part(a, counts(len(a))), _part(b, counts(len(b)), len(a))
    whole = _Sorted.of([pa, pb], NONE)
    t = np.concatenate((pa[3], pb[3]))
    c = np.concatenate((pa[4], pb[4]))
    per = t / c
    for thr in [-1.0, 0.0, *per[:: max(1, len(per) // 7)].tolist(), float(2**60)]:
        hit = per > thr
        assert whole.above(thr) == (int(c[hit].sum()), int(t[hit].sum()))
    assert (whole.total_cnt, whole.total_t) == (int(c.sum()), int(t.sum()))
    order = np.argsort(per, kind="stable")
    for i in range(len(per) + 1):
        assert whole.sums(i) == (int(c[order][:i].sum()), int(t[order][:i].sum()))
    if len(a) and len(b):
        merged = _Sorted.of([pa], NONE).merge(_Sorted.of([pb], NONE))
        assert np.array_equal(merged.per, whole.per)
        assert np.array_equal(merged.diffs, whole.diffs)
        assert np.array_equal(merged.times(), t[order])
        assert np.array_equal(merged.counts(), c[order])
        assert merged.ones == whole.ones
        assert [merged.sums(i) for i in range(len(per) + 1)] == [
            whole.sums(i) for i in range(len(per) + 1)]
    if not multi and all(x < 2**53 for x in a + b):
        assert whole.ones and whole.cum_cnt is None  # one running sum in 64 kept


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(runs=st.lists(st.lists(st.integers(0, 40) | st.integers(0, 10**12), max_size=40),
                     min_size=1, max_size=4).filter(lambda r: sum(map(len, r)) > 0))
def test_order_statistics_of_several_runs(runs):
    """Each rank of the union of 1 to 4 sorted runs (ties across them, empty runs) is the
    value of sorting them all at once."""
    seqs = [np.sort(np.asarray(r, np.float64)) for r in runs]
    whole = np.sort(np.concatenate(seqs))
    ks = list(range(len(whole)))
    assert kth_runs(seqs, ks) == whole.tolist()
