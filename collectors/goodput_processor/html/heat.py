"""Processes as a heat strip (ranks x time) and per-attempt process rows, as uint8 codes.

Every blocking step span of every process (:class:`~.fleet.Fleet`) gets two values:

- **step time**: its time per step (span time / ``goodput.step.count``) over the job's
  ideal step time, coded ``1 + 254 x clip(log2(ratio) / log2(RATIO_MAX), 0, 1)``: 1 = at
  or below the ideal, 255 = ``RATIO_MAX`` (2x) or slower;
- **lag**: how much later it started than the median process of the same attempt started
  the same step number, over the ideal step time, coded ``1 + 254 x clip(lag / LAG_MAX,
  0, 1)`` (255 = a whole ideal step or more late); 0 where no other process ran that step.

Code 0 is "no step there". A cell of the job's strip (a group of consecutive ranks x a
time bin) holds the highest code of the spans that overlap it, and the rank and host of
that worst process. An **expansion** holds, per attempt, one row per process (all of
them up to :data:`EXPAND_ROWS`; beyond, the ones with the highest codes) over the
attempt's time in bins; the bins per attempt shrink so that all attempts together stay
within :data:`EXPAND_CELLS` cells. Everything is numpy over all spans at once.
"""

from __future__ import annotations

import math

import numpy as np

from ..analysis.stragglers import _group_median
from ..read.rows import NONE
from .fleet import Fleet

__all__ = ["EXPAND_CELLS", "EXPAND_ROWS", "LAG_MAX", "RATIO_MAX", "STRIP_BINS", "STRIP_ROWS",
           "heat_arrays", "record_codes"]

STRIP_ROWS = 100
STRIP_BINS = 1000
EXPAND_ROWS = 160
EXPAND_CELLS = 1_000_000
RATIO_MAX = 2.0
LAG_MAX = 1.0
_LOW = (1 << 20) - 1  # attempt positions and ranks packed in 20 bits each


def record_codes(fleet: Fleet, ideal_ns: float, attempt_start_ns: np.ndarray):
    """(step-time code, lag code) of each step span of ``fleet`` (uint8 arrays)."""
    n = len(fleet.s_start_ns)
    if not n or not ideal_ns > 0:
        return np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    per_step = (fleet.s_end_ns - fleet.s_start_ns) / fleet.s_count
    ratio = np.log2(np.maximum(per_step / ideal_ns, 1e-12)) / math.log2(RATIO_MAX)
    rc = (1 + np.rint(254 * np.clip(ratio, 0, 1))).astype(np.uint8)
    lc = np.zeros(n, np.uint8)
    has = fleet.s_step != NONE
    if has.any():
        idx = np.flatnonzero(has)
        key = (fleet.s_attempt[idx].astype(np.int64) << 40) | (fleet.s_step[idx] & ((1 << 40) - 1))
        _, gid = np.unique(key, return_inverse=True)
        rel = fleet.s_start_ns[idx] - attempt_start_ns[fleet.s_attempt[idx]]
        med, cnt = _group_median(gid, rel, int(gid.max()) + 1)
        ok = cnt[gid] >= 2
        lag = (rel - med[gid]) / ideal_ns / LAG_MAX
        lc[idx[ok]] = (1 + np.rint(254 * np.clip(lag[ok], 0, 1))).astype(np.uint8)
    return rc, lc


def _spread(b0: np.ndarray, b1: np.ndarray):
    """Each span's bins ``b0..b1`` (inclusive) listed: (span index, bin) per cell touched."""
    n = np.maximum(b1 - b0 + 1, 0)
    span = np.repeat(np.arange(len(b0)), n)
    first = np.cumsum(n) - n
    return span, b0[span] + (np.arange(len(span)) - first[span])


def _bins(s, e, t0, length, nbins):
    """First and last bin (inclusive) of spans ``[s, e)`` over ``[t0, t0 + length)``."""
    scale = nbins / np.maximum(length, 1)
    b0 = np.floor((s - t0) * scale).astype(np.int64)
    b1 = np.floor((e - 1 - t0) * scale).astype(np.int64)
    return np.clip(b0, 0, nbins - 1), np.clip(b1, 0, nbins - 1)


def heat_arrays(result, fleet: Fleet) -> tuple[dict, dict[str, np.ndarray]]:
    """The header (JSON-able) and arrays of the heat strip and the expansions.

    Header: ``{"ranks": P, "rows": R, "bins": C, "ideal_ms", "ratio_max", "lag_max",
    "hosts": [...], "expand": {"bins": Ca, "attempts": [[row offset, rows, present],
    ...]}}``; arrays ``hr``/``hl`` (R x C codes), ``hrr``/``hlr`` (rank of the worst),
    ``hrh``/``hlh`` (its host index), ``er``/``el`` (expansion codes, rows x Ca),
    ``ek``/``eh`` (rank and host index of each expansion row).
    """
    ideal = (result.ideal_step_time_s or 0) * 1e9
    starts = np.array([a.start_ns for a in result.attempts], np.int64)
    ends = np.array([a.end_ns for a in result.attempts], np.int64)
    if not ideal > 0 and len(fleet.s_start_ns):
        ideal = float(np.median((fleet.s_end_ns - fleet.s_start_ns) / fleet.s_count))
    rc, lc = record_codes(fleet, ideal, starts)
    ranks = int(fleet.p_rank.max()) + 1 if len(fleet.p_rank) else 0
    rows = min(ranks, STRIP_ROWS)
    head = {"ranks": ranks, "rows": rows, "bins": STRIP_BINS, "ideal_ms": ideal / 1e6,
            "ratio_max": RATIO_MAX, "lag_max": LAG_MAX, "hosts": list(fleet.hosts)}
    arrays: dict[str, np.ndarray] = {}
    # --- the job's strip
    b0, b1 = _bins(fleet.s_start_ns, fleet.s_end_ns, result.start_ns, result.total_ns,
                   STRIP_BINS)
    span, b = _spread(b0, b1)
    row = fleet.s_rank[span].astype(np.int64) * rows // max(ranks, 1)
    cell = row * STRIP_BINS + b
    who = ((np.minimum(fleet.s_attempt[span], _LOW).astype(np.int64) << 20)
           | np.minimum(fleet.s_rank[span], _LOW))
    for name, code in (("hr", rc), ("hl", lc)):
        best = np.zeros(rows * STRIP_BINS, np.int64)
        np.maximum.at(best, cell, (code[span].astype(np.int64) << 40) | who)
        arrays[name] = (best >> 40).astype(np.uint8)
        att, rank = (best >> 20) & _LOW, best & _LOW
        arrays[name + "r"] = rank.astype(np.int32)
        arrays[name + "h"] = np.where(best > 0, fleet.host_of(att, rank), -1).astype(np.int32)
    # --- per attempt: the processes with the highest codes, one row each
    head["expand"], more = _expansion(result, fleet, rc, lc, starts, ends)
    arrays.update(more)
    return head, arrays


def _expansion(result, fleet: Fleet, rc, lc, starts, ends):
    """Expansion rows of every attempt (see :func:`heat_arrays`)."""
    nattempts = len(result.attempts)
    pkeys = (fleet.p_attempt.astype(np.int64) << 32) | fleet.p_rank
    pos = np.searchsorted(pkeys, (fleet.s_attempt.astype(np.int64) << 32) | fleet.s_rank)
    bad = np.zeros(len(pkeys), np.int64)
    np.maximum.at(bad, pos, np.maximum(rc, lc).astype(np.int64))
    bounds = np.searchsorted(fleet.p_attempt, np.arange(nattempts + 1))
    order = np.argsort((fleet.p_attempt.astype(np.int64) << 40) | ((255 - bad) << 24)
                       | np.minimum(fleet.p_rank, (1 << 24) - 1), kind="stable")
    nth = np.arange(len(order)) - bounds[fleet.p_attempt[order]]
    chosen = np.sort(order[nth < EXPAND_ROWS])
    nrows = len(chosen)
    nbins = int(np.clip(EXPAND_CELLS // max(nrows, 1), 8, 240))
    rowid = np.full(len(pkeys), -1, np.int64)
    rowid[chosen] = np.arange(nrows)
    r = rowid[pos]
    use = np.flatnonzero(r >= 0)
    att = fleet.s_attempt[use]
    b0, b1 = _bins(fleet.s_start_ns[use], fleet.s_end_ns[use], starts[att],
                   (ends - starts)[att], nbins)
    span, b = _spread(b0, b1)
    cell = r[use][span] * nbins + b
    arrays = {}
    for name, code in (("er", rc), ("el", lc)):
        grid = np.zeros(nrows * nbins, np.uint8)
        np.maximum.at(grid, cell, code[use][span])
        arrays[name] = grid
    arrays["ek"] = fleet.p_rank[chosen].astype(np.int32)
    arrays["eh"] = fleet.p_host[chosen].astype(np.int32)
    offsets = np.searchsorted(fleet.p_attempt[chosen], np.arange(nattempts + 1))
    per = [[int(offsets[i]), int(offsets[i + 1] - offsets[i]), int(bounds[i + 1] - bounds[i])]
           for i in range(nattempts)]
    return {"bins": nbins, "attempts": per}, arrays
