"""The warm-up steps after a restart: an attempt's leading kept steps above the job's
noise band, which the recovery phases count as ``recompilation_warmup``
(:mod:`.recovery`) and the slowdown split among hosts takes out first (:mod:`.slow_hosts`).
"""

from __future__ import annotations

import numpy as np

from ..model.memo import cached
from ..read.rows import NONE
from .steptimes import runs_median

__all__ = ["warmup"]

_NS = 1_000_000_000


def warmup(result, attempt: int, memo=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The warm-up steps of an attempt: indexes into ``result.steps`` of its leading kept steps
    (in time order) slower than its own level, each one's warm-up excess (float ns), and
    their starts (int64 ns).

    The level is the larger of the ideal step time and the attempt's median step time, so
    that an attempt slow throughout (a slow host) has no warm-up: only steps more than the
    noise band above it, from its first kept step on, are warm-up; their excess over the
    level is recompilation and warm-up, the rest of their excess stays training slowdown.
    ``memo`` keeps the attempt's median step time under its part's key (found in the one
    temporary array of its times per step); the leading steps are read from the front
    until the first one at or below the level.
    """
    none = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    if result.ideal_step_time_s is None:
        return none
    off, parts, keys = result.steps.of_attempt(attempt)
    if not parts:
        return none
    if len(parts) == 1:
        t, cnt = parts[0][3], parts[0][4]
        median = cached(memo if keys[0] is not None else None, ("step_median", keys[0]),
                        lambda: float(np.median(t / cnt, overwrite_input=True)))
    else:  # a running attempt's pieces
        median = runs_median(parts, keys, NONE, memo)
    level = max(result.ideal_step_time_s * _NS, median)
    thr = level + (result.noise_tolerance_s or 0.0) * _NS

    def leading() -> tuple[np.ndarray, np.ndarray]:
        excess, starts = [], []
        for p in parts:  # in time order, as the accounting makes them
            t, cnt = p[3], p[4]
            lead = _leading_above(t, cnt, thr)
            excess.append((t[:lead] / cnt[:lead] - level) * cnt[:lead])
            starts.append(p[2][:lead])
            if lead < len(t):
                break
        return np.concatenate(excess), np.concatenate(starts)

    excess, starts = cached(memo if None not in keys else None,
                            ("warmup", tuple(keys), level, thr), leading)
    return np.arange(off, off + len(excess)), excess, starts


def _leading_above(t: np.ndarray, cnt: np.ndarray, thr: float) -> int:
    """How many leading steps have a time per step above ``thr`` (read in growing blocks,
    so a short warm-up costs a short read)."""
    lead, size = 0, 64
    while lead < len(t):
        above = t[lead:lead + size] / cnt[lead:lead + size] > thr
        if not above.all():
            return lead + int(np.argmin(above))
        lead += len(above)
        size *= 8
    return lead
