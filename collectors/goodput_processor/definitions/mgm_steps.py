"""Step times of the mgm event stream: mgm 0.2.3's ideal step time
(:func:`compute_ideal_step_time`) and step deviation (``get_step_deviation``)."""

from __future__ import annotations

import numpy as np

from .mgm_events import E_STEP, Events
from .mgm_result import _NS

__all__ = ["compute_ideal_step_time"]


def compute_ideal_step_time(step_times_s) -> float | None:
    """mgm 0.2.3 ``goodput_utils.compute_ideal_step_time`` (seconds in, seconds out).

    Step times under 1 s are dropped (None when none is left: sub-second steps never get
    an ideal step time); of the rest, the mean of those at most median + 3 x MAD (median
    absolute deviation from the median).
    """
    x = (step_times_s.astype(np.float64, copy=False) if isinstance(step_times_s, np.ndarray)
         else np.asarray(list(step_times_s), np.float64))
    x = x[x >= 1.0]
    if not len(x):
        return None
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    return float(np.mean(x[x <= med + 3 * mad]))


def _step_times(ev: Events) -> dict[int, float]:
    """mgm 0.2.3 ``_get_step_times``: over all step events in stream order, the time from
    a step start to the next one when the next number is one higher, keyed by the first
    step's number (a later occurrence overwrites an earlier one). Raw seconds: custom
    badput and restarts are not taken out."""
    keys, times = _step_time_arrays(ev)
    return dict(zip(keys.tolist(), times.tolist(), strict=True))


def _step_time_arrays(ev: Events) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_step_times` as arrays: the step numbers in the dict's order (of first
    occurrence) and their times (seconds, of the last occurrence)."""
    sel = ev.kind == E_STEP
    num, t = ev.val[sel], ev.t[sel]
    ok = np.flatnonzero(num[1:] == num[:-1] + 1)
    keys, times = num[ok], (t[ok + 1] - t[ok]) / _NS
    if len(keys) < 2 or (keys[1:] > keys[:-1]).all():
        return keys, times
    # repeated numbers: the first occurrence's place, the last occurrence's time
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    head = np.ones(len(sk), bool)
    head[1:] = sk[1:] != sk[:-1]
    tail = np.ones(len(sk), bool)
    tail[:-1] = head[1:]
    first, last = order[head], order[tail]
    o = np.argsort(first)
    return keys[first[o]], times[last[o]]


def _deviation(ev: Events, ideal_step_time_s) -> tuple[float | None, dict[int, float]]:
    """``(ideal step time, step deviation)`` of :class:`MgmResult` (seconds) for the step
    events of ``ev``: ``ideal_step_time_s``, else :func:`compute_ideal_step_time` of the
    step times (:func:`_step_times`)."""
    keys, times = _step_time_arrays(ev)
    ideal = ideal_step_time_s
    if ideal is None:
        ideal = compute_ideal_step_time(times)
    deviation = {} if ideal is None else dict(zip(
        keys.tolist(), np.abs(times - ideal).tolist(), strict=True))
    return ideal, deviation
