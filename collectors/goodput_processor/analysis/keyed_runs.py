"""Int64 values grouped by an integer key, each key's sorted, and exact medians of unions.

The straggler report (:mod:`goodput_processor.analysis.stragglers`) needs, per host process, the
median of its step times over every attempt. Each attempt's values are sorted once
(:class:`KeyedRun`) and kept; a poll that adds steps to the running attempt sorts only
that attempt's again, and :func:`union_median` reads the medians of the runs' union
without merging them: a binary search on the value, the same for every key at once, each
round counting the values at or below it by one ``np.searchsorted`` per run, exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["KeyedRun", "union_median"]


class KeyedRun:
    """``values`` (int64) grouped by ``keys`` (ints in ``[0, nkeys)``), each key's sorted.

    Kept as one sorted int64 array of ``key << shift | (value - lo)`` (``enc``) when that
    fits in 62 bits (step times under 13 days with 4,096 keys), else as the values sorted
    by key then value (``vals``). ``counts``: values per key.

    Raises:
        ValueError: ``keys`` and ``values`` differ in length.
    """

    __slots__ = ("counts", "enc", "hi", "lo", "shift", "starts", "vals")

    def __init__(self, keys: np.ndarray, values: np.ndarray, nkeys: int):
        keys, values = np.asarray(keys, np.int64), np.asarray(values, np.int64)
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        self.counts = np.bincount(keys, minlength=nkeys).astype(np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(np.int64)
        self.enc = self.vals = None
        self.lo = int(values.min()) if len(values) else 0
        self.hi = int(values.max()) if len(values) else 0
        self.shift = max((self.hi - self.lo).bit_length(), 1)
        if self.shift + max(nkeys - 1, 1).bit_length() <= 62:
            self.enc = np.sort((keys << self.shift) | (values - self.lo))
        else:
            self.vals = values[np.lexsort((values, keys))]

    @property
    def size(self) -> int:
        """How many values."""
        return int(self.counts.sum())

    @property
    def nkeys(self) -> int:
        """Keys the run was made for (a key from there on has no values in it)."""
        return len(self.counts)

    def values(self) -> np.ndarray:
        """The values, key by key, each key's sorted (int64; a new array when encoded)."""
        if self.enc is None:
            return self.vals
        return (self.enc & ((1 << self.shift) - 1)) + self.lo

    def keys(self) -> np.ndarray:
        """The key of each of :meth:`values` (int64)."""
        return np.repeat(np.arange(self.nkeys, dtype=np.int64), self.counts)

    def count_le(self, keys: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Per query: how many values of key ``keys[i]`` are <= ``x[i]`` (int64 arrays of
        the same length; a key outside ``[0, nkeys)`` has none)."""
        out = np.zeros(len(keys), np.int64)
        ok = (keys >= 0) & (keys < self.nkeys)
        k, xs = keys[ok], x[ok]
        if not len(k):
            return out
        if self.enc is not None:
            q = (k << self.shift) + np.clip(xs - self.lo, -1, (1 << self.shift) - 1)
            out[ok] = np.searchsorted(self.enc, q, "right") - self.starts[k]
        else:  # (values too wide to encode: key by key)
            got = np.empty(len(k), np.int64)
            for i, (kk, xx) in enumerate(zip(k.tolist(), xs.tolist(), strict=True)):
                a = self.starts[kk]
                got[i] = np.searchsorted(self.vals[a : a + self.counts[kk]], xx, "right")
            out[ok] = got
        return out


def union_median(runs: Sequence[tuple[KeyedRun, np.ndarray]], nkeys: int):
    """Per key in ``[0, nkeys)``, the median of its values in all ``runs``; ``(medians
    float64, counts int64)``, NaN and 0 for a key without values. Each run comes with the
    key in it of each of the ``nkeys`` keys (int64, -1: not in it).

    The median of ``n`` sorted values ``v`` is ``(v[(n - 1) // 2] + v[n // 2]) / 2``, as
    ``numpy.median``; each of those two is read where it is in a single run, else found
    exactly by bisecting on the value (at most 64 rounds), whatever the runs' sizes.
    """
    counts = np.zeros(nkeys, np.int64)
    for run, loc in runs:
        has = loc >= 0
        counts[has] += run.counts[loc[has]]
    med = np.full(nkeys, np.nan)
    keys = np.flatnonzero(counts > 0)
    if not len(keys):
        return med, counts
    live = [r for r in runs if int(r[0].counts.sum())]
    lo_v = min(r.lo for r, _ in live)
    hi_v = max(r.hi for r, _ in live)
    n = counts[keys]
    ranks = np.concatenate(((n - 1) // 2, n // 2))  # the lower and upper middles
    q = np.concatenate((keys, keys))
    if len(live) == 1:  # one run: read where the ranks are
        run, loc = live[0]
        at = run.starts[loc[q]] + ranks
        got = run.enc[at] & ((1 << run.shift) - 1) if run.enc is not None else run.vals[at]
        got = got + (run.lo if run.enc is not None else 0)
    elif hi_v - lo_v >= 1 << 62:  # (wider than the bisection's int64: merged)
        vals = np.concatenate([r.values() for r, _ in live])
        own = np.concatenate([loc_of(r, loc) for r, loc in live])
        vals, own = vals[own >= 0], own[own >= 0]
        v = vals[np.lexsort((vals, own))]
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        got = v[starts[q] + ranks]
    else:
        lo = np.full(len(q), lo_v - 1, np.int64)  # fewer than rank + 1 values <= lo
        hi = np.full(len(q), hi_v, np.int64)  # at least rank + 1 values <= hi
        locs = [loc[q] for _, loc in live]
        while True:
            go = hi - lo > 1
            if not go.any():
                break
            mid = lo + (hi - lo) // 2
            c = sum(r.count_le(k, mid) for (r, _), k in zip(live, locs, strict=True))
            enough = c >= ranks + 1
            hi = np.where(go & enough, mid, hi)
            lo = np.where(go & ~enough, mid, lo)
        got = hi
    m = len(keys)
    med[keys] = (got[:m].astype(np.float64) + got[m:]) / 2.0
    return med, counts


def loc_of(run: KeyedRun, loc: np.ndarray) -> np.ndarray:
    """The caller's key (an index into ``loc``) of each of ``run``'s values, -1 where the
    run's key is none of them; ``loc``: per caller's key, its key in the run or -1."""
    back = np.full(run.nkeys, -1, np.int64)
    has = loc >= 0
    back[loc[has]] = np.flatnonzero(has)
    return back[run.keys()]
