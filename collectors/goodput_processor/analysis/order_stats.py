"""Order statistics of sorted runs: the k-th smallest of a union without merging it, the
median and the quantiles from any order-statistic function.

:mod:`goodput_processor.analysis.steptimes` keeps a live job's kept step times as sorted runs (the
finished attempts' merged, the running attempt's) and reads its median, percentiles and
noise band from them through :func:`kth_union` and :func:`kth_runs`; the results are the same
values ``np.partition`` of all the steps would select, so every statistic equals
accounting afresh bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SMALL", "SortedUnion", "kth_runs", "kth_union", "median_of", "quantiles_of",
           "runs_union"]


def kth_union(a, b, ks) -> list[float]:
    """The ``ks``-th smallest (0-based) values of the union of sorted ``a`` and ``b``
    (ndarrays, or any sorted sequences indexed by int: :class:`SortedUnion`). Where ``b`` is an
    array of at most :data:`SMALL` values, through their places in the merge
    (:class:`SortedUnion`: O(len(b) log len(a)), vectorised, and a search per rank); else by
    the split of the ``k + 1`` smallest between the two, at the first ``i`` with ``a[i] >=
    b[k - i]``: O(log len(a)) reads of each per rank (a few pages of a mapped ``a``)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and len(b) <= SMALL:
        u = SortedUnion(a, b)
        return [u[k] for k in ks]
    out = []
    n, m = len(a), len(b)
    for k in ks:
        lo, hi = max(0, k + 1 - m), min(k + 1, n)
        while lo < hi:  # i from a and k + 1 - i from b, the least i that is not too few
            i = (lo + hi) // 2
            if a[i] < b[k - i]:
                lo = i + 1
            else:
                hi = i
        j = k + 1 - lo
        if not lo:
            out.append(float(b[j - 1]))
        elif not j:
            out.append(float(a[lo - 1]))
        else:
            out.append(float(max(a[lo - 1], b[j - 1])))
    return out


#: The most values of the second run that :func:`kth_union` places in the merge at once.
SMALL = 1 << 16


class SortedUnion:
    """Two sorted sequences ``a`` and ``b`` seen as their sorted union, indexed by rank.
    Where both are arrays and ``b`` has at most :data:`SMALL` values, ``b``'s places in
    the merge are found once (a search per read after that); else each read is a
    :func:`kth_union`."""

    __slots__ = ("a", "b", "pos")

    def __init__(self, a, b) -> None:
        self.a, self.b = a, b
        self.pos = None
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and len(b) <= SMALL:
            self.pos = np.searchsorted(a, b, "right") + np.arange(len(b))

    def __len__(self) -> int:
        return len(self.a) + len(self.b)

    def __getitem__(self, k: int) -> float:
        pos = self.pos
        if pos is None:
            return kth_union(self.a, self.b, (k,))[0]
        if not len(self.b):
            return float(self.a[k])
        if not len(self.a):
            return float(self.b[k])
        j = int(np.searchsorted(pos, k, "right"))  # b's values at merged places <= k
        return float(self.b[j - 1]) if j and pos[j - 1] == k else float(self.a[k - j])


def runs_union(seqs: list):
    """The sorted union of sorted sequences ``seqs`` (the first, the largest, outermost:
    each of its reads is one value, each of the others' a search)."""
    out = seqs[-1]
    for s in reversed(seqs[:-1]):
        out = SortedUnion(s, out)
    return out


def kth_runs(seqs: list, ks) -> list[float]:
    """:func:`kth_union` over the sorted union of ``seqs`` (one or more)."""
    if len(seqs) == 1:
        return [float(seqs[0][k]) for k in ks]
    u = runs_union(seqs)
    return kth_union(u.a, u.b, ks)


def median_of(kth, n: int) -> float:
    """Median of ``n`` values given their order statistics ``kth(list of ranks)``, as
    ``np.median``: the middle one, or the mean of the two middle ones."""
    if n % 2:
        return kth([n // 2])[0]
    lo, hi = kth([n // 2 - 1, n // 2])
    return (lo + hi) / 2


def quantiles_of(kth, n: int, scale: float, quantiles) -> list[float]:
    """``quantiles`` (fractions) of ``n`` values scaled by ``1/scale``, linear interpolation
    between closest ranks (Hyndman & Fan type 7; numpy's ``linear``, with its ``_lerp``)."""
    ranks = []
    for q in quantiles:
        v = (n - 1) * q
        lo = math.floor(v)
        ranks += [lo, min(lo + 1, n - 1)]
    vals = [x / scale for x in kth(ranks)]
    out = []
    for i, q in enumerate(quantiles):
        v = (n - 1) * q
        g = v - math.floor(v)
        a, b = vals[2 * i], vals[2 * i + 1]
        out.append(a + (b - a) * g if g < 0.5 else b - (b - a) * (1 - g))
    return out
