"""A job's timeline as painted segments: one bucket per instant, per attempt and process.

:func:`bucket_segments` runs the accounting (:mod:`goodput_processor.account.accounting`, the same
rules and painting as ``goodput report``) and returns, for every attempt, the elementary
segments of its primary process with the bucket each instant belongs to, plus rows for the
attempt's other processes on request (painted by the same priorities, not accounted),
and the :class:`~.fleet.Fleet` of all processes (the heat strip's input).

Step-level time of a kept step is ``productive``; for an anomalous step its first
``count x ideal`` ns are ``productive`` and the rest ``training_slowdown`` (so each
anomalous step's slowdown is exact to 1 ns). Step time of a step that is not kept is
``wasted_progress``, as is everything in an attempt's wasted region; the gap from an
attempt's end to the next attempt's start is ``infrastructure_recovery``. Over a primary
row (gap included) the bucket lengths sum to the job's buckets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from goodput import schema

from ..account.accounting import _account
from ..account.painting import _Acc
from ..read.rows import C_END, C_FLAGS, C_IVAL, C_KIND, C_START, F_NONBLOCKING, K_STEP, NONE
from ..results.job import JobResult
from .fleet import Fleet, fleet_of

__all__ = ["JobSegments", "Row", "bucket_segments"]

#: Step number of a segment that no step span covers.
NO_STEP = -1


@dataclass(frozen=True)
class Row:
    """One timeline row: a process of an attempt.

    ``bounds_ns`` (int64, n + 1 entries, ns since the epoch) delimit ``n`` segments;
    ``bucket`` (int16) indexes :attr:`JobSegments.names`; ``step`` (int64) is the step
    number of the step span covering the segment (:data:`NO_STEP` if none). Adjacent
    segments differ in bucket or step. ``primary`` rows are the accounted ones; the
    primary row of an attempt that has a successor ends with the recovery gap.
    """

    attempt: int
    process: int
    primary: bool
    host: str | None
    bounds_ns: np.ndarray
    bucket: np.ndarray
    step: np.ndarray


@dataclass(frozen=True)
class JobSegments:
    """:func:`bucket_segments`' answer: the result, bucket names, the rows in order
    (per attempt: the primary process first, then the others by process index), and every
    process's step spans (None: not gathered)."""

    result: JobResult
    names: tuple[str, ...]
    rows: tuple[Row, ...]
    fleet: Fleet | None = None

    def primary_rows(self) -> list[Row]:
        """The accounted rows (one per attempt), in time order."""
        return [r for r in self.rows if r.primary]


def _covering_step(seg_start, ss, se, snum) -> np.ndarray:
    """Step number of the step span covering each segment start (latest-ending on overlap)."""
    out = np.full(len(seg_start), NO_STEP, np.int64)
    if not len(ss) or not len(seg_start):
        return out
    j = np.searchsorted(ss, seg_start, side="right") - 1
    ok = j >= 0
    jj = np.where(ok, j, 0)
    cummax = np.maximum.accumulate(se)
    pam = np.maximum.accumulate(np.where(se == cummax, np.arange(len(ss)), 0))
    jj = np.where(se[jj] > seg_start, jj, pam[jj])  # as painting._step_times
    ok &= se[jj] > seg_start
    out[ok] = np.where(snum[jj[ok]] == NONE, NO_STEP, snum[jj[ok]])
    return out


def _steps_of(d: np.ndarray, a0: int, a1: int):
    """Blocking step spans of a process clipped to ``[a0, a1]``, sorted by start."""
    s, e = np.clip(d[:, C_START], a0, a1), np.clip(d[:, C_END], a0, a1)
    sel = (d[:, C_KIND] == K_STEP) & ((d[:, C_FLAGS] & F_NONBLOCKING) == 0) & (e > s)
    order = np.argsort(s[sel], kind="stable")
    return s[sel][order], e[sel][order], d[:, C_IVAL][sel][order]


def _merge(b, bucket, step):
    """Drop boundaries between segments with the same bucket and step (and empty ones)."""
    keep = np.diff(b) > 0
    if not keep.all():
        b = np.append(b[:-1][keep], b[-1])
        bucket, step = bucket[keep], step[keep]
    if len(bucket) < 2:
        return b, bucket, step
    change = np.flatnonzero((bucket[1:] != bucket[:-1]) | (step[1:] != step[:-1])) + 1
    idx = np.concatenate(([0], change))
    return np.append(b[idx], b[-1]), bucket[idx], step[idx]


def _split_slowdown(b, bucket, seg_kept, result: JobResult, productive: int, slow: int):
    """Split anomalous kept steps' segments: productive up to count x ideal, then slowdown."""
    st = result.steps
    if result.ideal_step_time_s is None or not st.anomalous.any():
        return b, bucket, seg_kept
    seg = np.flatnonzero(seg_kept >= 0)
    seg = seg[st.anomalous[seg_kept[seg]]]
    if not len(seg):
        return b, bucket, seg_kept
    k = seg_kept[seg]
    length = b[seg + 1] - b[seg]
    order = np.argsort(k, kind="stable")  # each step's segments, in time order
    seg, k, length = seg[order], k[order], length[order]
    csum = np.cumsum(length)
    first = np.concatenate(([True], k[1:] != k[:-1]))
    base = np.maximum.accumulate(np.where(first, csum - length, 0))
    before = csum - length - base  # step time before this segment
    ideal_ns = st.count[k] * result.ideal_step_time_s * 1e9
    room = np.rint(ideal_ns - before).astype(np.int64)  # productive ns left in the step
    whole = room <= 0
    bucket[seg[whole]] = slow
    cut = (room > 0) & (room < length)
    if cut.any():
        at = b[seg[cut]] + room[cut]
        nb = np.sort(np.concatenate((b, at)))
        src = np.searchsorted(b, nb[:-1], side="right") - 1
        new_bucket, new_kept = bucket[src], seg_kept[src]
        # a cut point lies strictly inside a segment: the new segment starting there is
        # the step's slowdown tail
        tail = np.isin(nb[:-1], at)
        new_bucket[tail] = slow
        return nb, new_bucket, new_kept
    return b, bucket, seg_kept


def bucket_segments(job, ideal_step_time_s: float | None = None, now_ns: int | None = None,
                    max_process_rows: int = 0) -> JobSegments:
    """Account ``job`` (a :class:`~goodput_processor.read.rows.JobSpans`) and paint its
    timeline: one :class:`Row` per attempt's primary process, then up to
    ``max_process_rows`` of its other processes (the HTML report draws none: its heat
    strip shows every process from :attr:`JobSegments.fleet`).

    Raises:
        ValueError: bad ``ideal_step_time_s`` (as
            :func:`~goodput_processor.account.accounting.account`).
    """
    result, attempts, acc = _account(job, ideal_step_time_s, now_ns, True)
    names = tuple(result.buckets_ns)
    code = {n: i for i, n in enumerate(names)}
    productive, slow = code[schema.PRODUCTIVE], code["training_slowdown"]
    wasted, other = code["wasted_progress"], code["other"]
    rows: list[Row] = []
    segments = acc.attempt_segments()
    for i, (a, (b, owner, seg_kept)) in enumerate(zip(attempts, segments, strict=True)):
        lv = _level_codes(acc, code, productive, other)
        bucket = lv[owner]
        is_step = owner == acc.level["step"]
        bucket[is_step & (seg_kept < 0)] = wasted
        b, bucket, seg_kept = _split_slowdown(b.copy(), bucket, seg_kept.copy(), result,
                                              productive, slow)
        ss, se, snum = _steps_of(a.primary.data, a.start_ns, a.end_ns)
        step = _covering_step(b[:-1], ss, se, snum)
        if i + 1 < len(attempts) and attempts[i + 1].start_ns > a.end_ns:
            b = np.append(b, attempts[i + 1].start_ns)
            bucket = np.append(bucket, np.int16(code["infrastructure_recovery"]))
            step = np.append(step, NO_STEP)
        b, bucket, step = _merge(b, bucket.astype(np.int16), step)
        rows.append(Row(a.attempt, a.primary.index, True, a.primary.host, b, bucket, step))
        rows += _other_rows(job, a, i, attempts, result, code, max_process_rows)
    return JobSegments(result, names, tuple(rows), fleet_of(attempts))


def _level_codes(acc, code, productive, other) -> np.ndarray:
    """Bucket code of each accounting level (the step level -> productive)."""
    lv = np.empty(acc.other + 1, np.int16)
    for lev, name in enumerate(acc.names):
        lv[lev] = productive if name == "step" else code.get(name, other)
    lv[acc.other] = other
    return lv


def _other_rows(job, a, i, attempts, result, code, limit) -> list[Row]:
    """Rows of an attempt's non-primary processes: their own spans painted by the same
    priorities and kept-step rule; their steps are not judged for slowdown."""
    out = []
    later = [r.resume_step for r in result.attempts[i + 1:] if r.resume_step is not None]
    bound = min(later) if later else None
    has_next = i + 1 < len(attempts)
    for p in [p for p in a.processes if p is not a.primary][:limit]:
        alt = dataclasses.replace(a, primary=p)
        acc = _Acc(job, [alt], keep_segments=True)
        acc.attempt(alt, bound, has_next)
        b, owner, seg_kept = acc.attempt_segments()[0]
        bucket = _level_codes(acc, code, code[schema.PRODUCTIVE], code["other"])[owner]
        bucket[(owner == acc.level["step"]) & (seg_kept < 0)] = code["wasted_progress"]
        ss, se, snum = _steps_of(p.data, a.start_ns, a.end_ns)
        step = _covering_step(b[:-1], ss, se, snum)
        b, bucket, step = _merge(b, bucket.astype(np.int16), step)
        out.append(Row(a.attempt, p.index, False, p.host, b, bucket, step))
    return out
