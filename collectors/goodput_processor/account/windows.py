"""Goodput and badput of part of a job: the last W seconds (rolling windows) or any interval.

A window's buckets are the cumulative buckets of :mod:`goodput_processor.account.accounting`
restricted to the window's instants: the accounting keeps its painted segments
(``keep_segments``) and each window sums the parts of them inside it, in integer ns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from goodput import schema

from ..model.packed import PackedSegments
from ..read.rows import JobSpans
from ..results.job import JobResult
from .accounting import AccountingInvariantError, _account
from .painting import _Acc

__all__ = ["WindowResult", "account_excluding", "account_interval", "account_windows",
           "check_windows", "merge_intervals"]

_NS = 1_000_000_000


@dataclass(frozen=True)
class WindowResult:
    """Goodput and badput of one rolling window: the last ``window_s`` seconds of a job.

    The window is ``[start_ns, end_ns)`` with ``end_ns`` the job's end (its last attempt's
    end, i.e. *now* while running) and ``start_ns = max(job start, end_ns - window_s)``, so
    ``total_ns`` (= ``end_ns - start_ns``) is shorter than the window while the job is
    younger than it. ``buckets_ns`` has the same keys as :attr:`JobResult.buckets_ns` and
    sums exactly to ``total_ns``; ``goodput`` is a fraction in [0, 1] (0 when empty).
    """

    window_s: float
    start_ns: int
    end_ns: int
    total_ns: int
    goodput: float
    buckets_ns: dict[str, int]

    @property
    def badput_s(self) -> dict[str, float]:
        """Seconds per badput bucket (every key of ``buckets_ns`` but ``productive``)."""
        return {k: v / _NS for k, v in self.buckets_ns.items() if k != schema.PRODUCTIVE}

    @property
    def productive_time_s(self) -> float:
        """Productive seconds in the window."""
        return self.buckets_ns[schema.PRODUCTIVE] / _NS


def check_windows(windows_s) -> tuple[float, ...]:
    out = []
    for w in windows_s:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (
            math.isfinite(w) and w > 0
        ):
            raise ValueError(f"rolling window must be a finite number of seconds > 0, got {w!r}")
        out.append(w)
    return tuple(out)


def account_windows(
    job: JobSpans,
    windows_s,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
    memo=None,
) -> tuple[JobResult, tuple[WindowResult, ...]]:
    """:func:`account` plus goodput and badput over the last W seconds, for each W.

    The windows use the same rules as the cumulative result (priorities, kept steps and
    wasted progress as known *now*, the job-wide ideal step time and noise band): a
    window's buckets are the cumulative buckets restricted to the window's instants. An
    anomalous step's time is split between ``productive`` and ``training_slowdown`` in
    proportion (ideal : excess) over its whole length. A window covering the whole job
    equals the cumulative result to within 1 ns per bucket (rounding of the split).

    Args:
        job: one job's spans.
        windows_s: window lengths in seconds (numbers > 0), e.g. ``(60, 300, 900)``.
        ideal_step_time_s, now_ns, memo: as for :func:`account`.

    Returns:
        ``(result, windows)``: the :class:`JobResult` (identical to :func:`account`'s) and
        one :class:`WindowResult` per entry of ``windows_s``, in the same order.

    Raises:
        ValueError: a window is not a finite number > 0, or bad ``ideal_step_time_s``.
    """
    windows = check_windows(windows_s)
    result, attempts, acc = _account(job, ideal_step_time_s, now_ns, True, memo)
    out = []
    slow_frac = _slow_fractions(result)
    for w in windows:
        w1 = result.end_ns
        w0 = max(result.start_ns, w1 - round(w * _NS))
        out.append(_window(result, attempts, acc, slow_frac, w, w0, w1))
    return result, tuple(out)


def account_interval(
    job: JobSpans,
    start_ns: int,
    end_ns: int,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
) -> tuple[JobResult, WindowResult]:
    """:func:`account` plus goodput and badput of the interval ``[start_ns, end_ns)``.

    The interval is clipped to the job (first attempt start to last attempt end) and
    accounted with the same rules as :func:`account_windows` (the buckets are the
    cumulative buckets restricted to the interval's instants).

    Args:
        job: one job's spans.
        start_ns, end_ns: the interval in ns since the Unix epoch.
        ideal_step_time_s, now_ns: as for :func:`account`.

    Returns:
        ``(result, interval)``: the job's :class:`JobResult` and a :class:`WindowResult`
        whose ``window_s`` is the clipped interval's length in seconds.

    Raises:
        ValueError: the interval does not overlap the job (message gives both), or bad
            ``ideal_step_time_s``.
    """
    result, attempts, acc = _account(job, ideal_step_time_s, now_ns, True)
    w0, w1 = max(int(start_ns), result.start_ns), min(int(end_ns), result.end_ns)
    if w1 <= w0:
        raise ValueError(
            f"interval [{start_ns}, {end_ns}) ns does not overlap job {job.name!r}, which runs "
            f"[{result.start_ns}, {result.end_ns}) ns"
        )
    window = _window(result, attempts, acc, _slow_fractions(result), (w1 - w0) / _NS, w0, w1)
    return result, window


def merge_intervals(intervals) -> list[tuple[int, int]]:
    """``(start_ns, end_ns)`` pairs sorted and merged where they overlap or touch.

    Raises:
        ValueError: a pair whose end is not after its start (the message names it).
    """
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals):
        if b <= a:
            raise ValueError(f"exclusion interval [{a}, {b}) ns: its end is not after its start")
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def account_excluding(
    job: JobSpans,
    exclusions_ns,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
) -> JobResult:
    """:func:`account` with the instants of ``exclusions_ns`` taken out of the job.

    The semantics of this project's model (``docs/accounting.md``, "Exclusions"): the
    intervals are merged and clipped to the job; each excluded instant leaves the total and
    the bucket it was in (the buckets are restricted to the instants kept, as a window is;
    every rule, e.g. which steps were kept and the ideal step time, is the whole job's).
    Step statistics, disruptions and the max productive step are the whole job's.

    Args:
        job: one job's spans.
        exclusions_ns: ``(start_ns, end_ns)`` pairs, ns since the epoch.
        ideal_step_time_s, now_ns: as for :func:`account`.

    Returns:
        A :class:`JobResult` whose ``total_ns``, buckets and goodput leave the excluded
        time out and whose ``excluded_time_s`` says how much that was (seconds).

    Raises:
        ValueError: an interval whose end is not after its start; bad ``ideal_step_time_s``.
    """
    merged = merge_intervals(exclusions_ns)
    result, attempts, acc = _account(job, ideal_step_time_s, now_ns, True)
    if not merged or not result.total_ns:
        return result
    slow = _slow_fractions(result)
    buckets = dict(result.buckets_ns)
    excluded = 0
    for a, b in merged:
        w0, w1 = max(a, result.start_ns), min(b, result.end_ns)
        if w1 <= w0:
            continue
        w = _window(result, attempts, acc, slow, (w1 - w0) / _NS, w0, w1)
        for k, v in w.buckets_ns.items():
            buckets[k] -= v
        excluded += w.total_ns
    total = result.total_ns - excluded
    # rounding of the slowdown split can leave a bucket 1 ns below 0: give it back to productive
    for k, v in buckets.items():
        if v < 0 and k != schema.PRODUCTIVE:
            buckets[schema.PRODUCTIVE] += v
            buckets[k] = 0
    if sum(buckets.values()) != total:  # pragma: no cover - a bug, never expected
        raise AccountingInvariantError(f"buckets {buckets} do not sum to {total} ns")
    goodput = buckets[schema.PRODUCTIVE] / total if total else 0.0
    return replace(
        result, total_ns=total, total_time_s=total / _NS,
        productive_time_s=buckets[schema.PRODUCTIVE] / _NS, goodput=goodput,
        useful_compute=None if result.mfu is None else goodput * result.mfu,
        badput_s={k: v / _NS for k, v in buckets.items() if k != schema.PRODUCTIVE},
        buckets_ns=buckets, excluded_time_s=excluded / _NS,
        # the hosts' charges are over the whole timeline: they do not split the badput
        # left after the exclusions, so that split is not given
        badput_charged={})


def _slow_fractions(result: JobResult):
    """``share(idx)``: for kept step spans ``idx`` (indexes into ``result.steps``), the share
    of each one's time that is training slowdown (float64 array); reads only those steps."""
    st = result.steps

    def share(idx: np.ndarray) -> np.ndarray:
        if result.ideal_step_time_s is None or not len(idx):
            return np.zeros(len(idx))
        t = st.take("time_ns", idx).astype(np.float64)
        cnt = st.take("count", idx)
        anomalous = t / cnt > st.ideal_ns + st.tol_ns  # = st.anomalous[idx]
        excess = np.where(anomalous, t - cnt * result.ideal_step_time_s * _NS, 0.0)
        return np.divide(excess, t, out=np.zeros_like(t), where=t > 0)

    return share


def _window(result, attempts, acc: _Acc, slow_frac, w, w0: int, w1: int) -> WindowResult:
    """One :class:`WindowResult` for ``[w0, w1)`` from the kept segments."""
    nlev = acc.other + 1
    level_ns = np.zeros(nlev, np.int64)
    step_level, wasted_level = acc.level["step"], acc.level["wasted_progress"]
    kept_ns = 0
    slow = 0.0
    recovery = 0
    for a, r in zip(attempts[:-1], attempts[1:], strict=True):  # gaps between attempts
        recovery += max(0, min(r.start_ns, w1) - max(a.end_ns, w0))
    for _i, b, owner, seg_kept, off in acc.segments:  # each attempt, or piece of one
        if isinstance(b, PackedSegments):  # (a part the windows had left behind)
            if b.n < 2 or b.last <= w0 or b.first >= w1:
                continue
            b, owner, seg_kept = b.arrays()
        if len(b) < 2 or b[-1] <= w0 or b[0] >= w1:
            continue
        lo = max(int(np.searchsorted(b, w0, side="right")) - 1, 0)
        hi = min(int(np.searchsorted(b, w1, side="left")), len(b) - 1)
        seg = np.diff(np.clip(b[lo : hi + 1], w0, w1))
        own, sk = owner[lo:hi], seg_kept[lo:hi]
        np.add.at(level_ns, own, seg)  # integer sums: exact
        is_step = own == step_level
        lost = is_step & (sk < 0)
        level_ns[wasted_level] += int(seg[lost].sum())
        level_ns[step_level] -= int(seg[lost].sum())
        good = is_step & (sk >= 0)
        kept_ns += int(seg[good].sum())
        slow += float((seg[good] * slow_frac(sk[good] + off)).sum())
    slowdown = min(round(slow), kept_ns)
    buckets = {}
    for name in result.buckets_ns:
        if name == schema.PRODUCTIVE:
            buckets[name] = kept_ns - slowdown
        elif name == "training_slowdown":
            buckets[name] = slowdown
        elif name == "infrastructure_recovery":
            buckets[name] = recovery
        elif name == "other":
            buckets[name] = int(level_ns[acc.other])
        else:
            buckets[name] = int(level_ns[acc.level[name]])
    total = w1 - w0
    if sum(buckets.values()) != total:  # pragma: no cover - a bug, never expected
        raise AccountingInvariantError(f"window buckets {buckets} do not sum to {total} ns")
    return WindowResult(window_s=w, start_ns=w0, end_ns=w1, total_ns=total,
                        goodput=buckets[schema.PRODUCTIVE] / total if total else 0.0,
                        buckets_ns=buckets)
