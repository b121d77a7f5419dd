"""Summaries of one process's rows that combine in order, for :func:`.memo.folded`.

A live job's running process keeps growing, and a poll must not read all its rows again
(issue 17). Each summary here is a pure function of some rows (an ``(n, NCOLS)`` int64
array, :data:`~goodput_processor.read.rows.COLUMNS`), and a ``*_both(a, b)`` gives the
summary of rows A then rows B from A's and B's, exactly as summarising both at once would
(ties go to A's rows, as they do in row order). Each ``of_process`` function reads a
process (a ``ProcessSpans``) through a memo, :func:`~goodput_processor.model.memo.folded`: only
the rows added since the previous poll are summarised. Without a memo (or for a process
whose rows are not known to only grow) it summarises all its rows.

Summaries keep no view of the rows (an accounting's rows may be written over by the
next): numbers, tuples and copied arrays only.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np

from ..read.rows import (
    C_AUX,
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_SIDX,
    C_START,
    F_ERROR,
    K_ACCELERATOR_INIT,
    K_CHECKPOINT_RESTORE,
    K_CUSTOM_BADPUT,
    K_ELASTIC_SLICES,
    K_HEARTBEAT,
    K_IDENTITY,
    K_JOB_END,
    K_JOB_START,
    K_STEP,
    NONE,
)
from .memo import folded

__all__ = ["StepOrder", "custom_sids", "elastic_markers", "error_spans", "evidence",
           "evidence_both", "resume_of", "resume_step", "step_counts", "step_order",
           "step_order_both", "step_order_of"]

#: A span ending this long before its attempt's start (or steps overlapping by this much)
#: is a clock that moved, not a rounding.
CLOCK_SLACK_NS = 1_000_000_000
#: A span starting before this (2001-09-09) comes from a clock that was never set (a node
#: booted without NTP reads 1970) or from an explicit timestamp in the wrong unit.
PLAUSIBLE_NS = 10**18
#: A span starting after this (2191-10-26) comes from an explicit timestamp in the wrong
#: unit or a sentinel (2^63 - 1 ns is 2262): no clock reads it.
LATEST_PLAUSIBLE_NS = 7 * 10**18


def step_counts(aux: np.ndarray) -> np.ndarray:
    """Steps each step span covers: ``goodput.step.count`` (column aux), absent or < 1 = 1."""
    return np.where(aux == NONE, 1, np.maximum(aux, 1))


# --- resume step ------------------------------------------------------------------------

def _resume_rows(d: np.ndarray) -> tuple:
    """Of rows ``d`` (``(k, NCOLS)``, k >= 0): ``(restore, step)``, the earliest checkpoint
    restore with a step, ``(start ns, step)``, and the earliest step span with a number,
    ``(start ns, step, steps it covers)`` (ties: the lowest step, then the first row);
    None where there is none."""
    kinds, ival, start = d[:, C_KIND], d[:, C_IVAL], d[:, C_START]
    out = []
    for kind in (K_CHECKPOINT_RESTORE, K_STEP):
        rows = np.flatnonzero((kinds == kind) & (ival != NONE))
        if not len(rows):
            out.append(None)
            continue
        rows = rows[start[rows] == start[rows].min()]  # ties: the lowest step
        r = rows[np.argmin(ival[rows])]
        out.append((int(start[r]), int(ival[r]), int(step_counts(d[r : r + 1, C_AUX])[0])))
    return tuple(out)


def _resume_both(a: tuple, b: tuple) -> tuple:
    """:func:`_resume_rows` of rows A then rows B, from theirs (A's row wins a tie)."""
    return tuple(x if y is None or (x is not None and x[:2] <= y[:2]) else y
                 for x, y in zip(a, b, strict=True))


def _resume_value(s: tuple) -> int | None:
    restore, step = s
    if restore is not None:
        return restore[1]
    return None if step is None else step[1] - step[2]


def resume_step(d: np.ndarray) -> int | None:
    """Resume step of an attempt from its primary process's rows ``d`` (``(n, NCOLS)``;
    see the docs): the step of its first checkpoint restore, else its first step span's
    step minus the number of steps that span covers (1 for a recorded step); None when
    it has neither."""
    return _resume_value(_resume_rows(d))


def resume_of(p, memo=None) -> int | None:
    """:func:`resume_step` of process ``p``'s rows (a ``ProcessSpans``), through ``memo``
    (:func:`~goodput_processor.model.memo.folded`)."""
    return _resume_value(folded(memo, "summaries.resume", p, _resume_rows, _resume_both))


# --- step order, restarts and clock (goodput_processor.account.checks) ---------------------------

class StepOrder(NamedTuple):
    """What the checks read of a process's numbered step spans (kind step, a step number)
    in time order (by start, then number, then end) and of its other rows.

    ``steps``: how many; ``first``/``last``: ``(start ns, step, end ns)`` of the first and
    the last in time order (None without steps); ``back``: times the step number goes
    down from one to the next; ``overlap``: steps starting more than
    :data:`CLOCK_SLACK_NS` before the previous one ended; ``highest``: highest step number
    (None); ``restored``: a checkpoint restore row (any); ``early``: phase rows ending more
    than :data:`CLOCK_SLACK_NS` before the attempt's start; ``unset``: rows starting before
    :data:`PLAUSIBLE_NS` or after :data:`LATEST_PLAUSIBLE_NS`; ``exact``: False when rows
    were combined out of time order (``back`` and ``overlap`` are then unknown: summarise
    all rows at once).
    """

    steps: int
    first: tuple | None
    last: tuple | None
    back: int
    overlap: int
    highest: int | None
    restored: bool
    early: int
    unset: int
    exact: bool = True


def step_order(d: np.ndarray, start_ns: int) -> StepOrder:
    """:class:`StepOrder` of rows ``d`` (``(k, NCOLS)``, k >= 0) of an attempt that starts
    at ``start_ns`` (ns since the epoch)."""
    kinds = d[:, C_KIND]
    sel = np.flatnonzero((kinds == K_STEP) & (d[:, C_IVAL] != NONE))
    nums, starts, ends = d[sel, C_IVAL], d[sel, C_START], d[sel, C_END]
    if len(starts) > 1 and not (starts[1:] > starts[:-1]).all():
        # in time order, ties by step number: the order spans arrived in must not matter
        # (compared, not subtracted: no int64 wrap, even for rows no reader makes)
        order = np.lexsort((ends, nums, starts))
        nums, starts, ends = nums[order], starts[order], ends[order]
    n = len(nums)
    return StepOrder(
        steps=n,
        first=(int(starts[0]), int(nums[0]), int(ends[0])) if n else None,
        last=(int(starts[-1]), int(nums[-1]), int(ends[-1])) if n else None,
        back=int((np.diff(nums) < 0).sum()),
        overlap=int((starts[1:] < ends[:-1] - CLOCK_SLACK_NS).sum()) if n else 0,
        highest=int(nums.max()) if n else None,
        restored=bool((kinds == K_CHECKPOINT_RESTORE).any()),
        early=int(((kinds >= K_ACCELERATOR_INIT)
                   & (d[:, C_END] < start_ns - CLOCK_SLACK_NS)).sum()),
        unset=int(((d[:, C_START] < PLAUSIBLE_NS)
                   | (d[:, C_START] > LATEST_PLAUSIBLE_NS)).sum()),
    )


def _overlaps(start: int, prev_end: int) -> bool:
    """``start < prev_end - CLOCK_SLACK_NS`` in int64 (wrapping as the arrays do)."""
    return bool((np.array([start], np.int64)
                 < np.array([prev_end], np.int64) - CLOCK_SLACK_NS)[0])


def step_order_both(a: StepOrder, b: StepOrder) -> StepOrder:
    """:func:`step_order` of rows A then rows B (same ``start_ns``), from theirs: exact when
    B's first step comes at or after A's last in time order, else ``exact`` is False."""
    exact = a.exact and b.exact
    if not a.steps or not b.steps:
        x = b if not a.steps else a
        first, last, back, overlap = x.first, x.last, x.back, x.overlap
    else:
        first, last = a.first, b.last
        back, overlap = a.back + b.back, a.overlap + b.overlap
        if a.last <= b.first:  # (start, step, end): the order of the whole, sorted
            back += b.first[1] < a.last[1]
            overlap += _overlaps(b.first[0], a.last[2])
        else:
            exact = False
    return StepOrder(
        steps=a.steps + b.steps, first=first, last=last, back=int(back),
        overlap=int(overlap),
        highest=b.highest if a.highest is None else a.highest if b.highest is None
        else max(a.highest, b.highest),
        restored=a.restored or b.restored, early=a.early + b.early, unset=a.unset + b.unset,
        exact=exact)


def step_order_of(p, start_ns: int, memo=None) -> StepOrder:
    """:func:`step_order` of process ``p``'s rows, through ``memo`` (exact: when new rows
    came out of time order, all rows are summarised again)."""
    s = folded(memo, "summaries.steps", p, partial(step_order, start_ns=start_ns),
               step_order_both, start_ns)
    return s if s.exact else step_order(p.data, start_ns)


# --- small per-process reads ---------------------------------------------------------------

def _custom_rows(d: np.ndarray) -> np.ndarray:
    return np.unique(d[d[:, C_KIND] == K_CUSTOM_BADPUT][:, C_SIDX])


def custom_sids(p, memo=None) -> list[int]:
    """The string indices of the custom badput types of process ``p``'s rows, sorted,
    each once, through ``memo``."""
    return folded(memo, "summaries.custom", p, _custom_rows, np.union1d).tolist()


def _error_rows(d: np.ndarray) -> int:
    return int(((d[:, C_FLAGS] & F_ERROR) != 0).sum())


def error_spans(p, memo=None) -> int:
    """Rows of process ``p`` with status ERROR, through ``memo``."""
    return folded(memo, "summaries.errors", p, _error_rows, lambda a, b: a + b)


def _marker_rows(d: np.ndarray) -> np.ndarray:
    return d[d[:, C_KIND] == K_ELASTIC_SLICES]  # (a copy, of d's width)


def elastic_markers(p, memo=None) -> np.ndarray:
    """The ``goodput.elastic_slices`` rows of process ``p`` (``(k, NCOLS)`` int64, a copy,
    in row order), through ``memo``."""
    return folded(memo, "summaries.slices", p, _marker_rows,
                  lambda a, b: np.concatenate((a, b)) if len(b) else a)


# --- the evidence of a process (goodput_processor.model.attempts) ---------------------------


def _max_attr(rows: np.ndarray, col: int) -> int | None:
    vals = rows[:, col]
    vals = vals[vals != NONE]
    return int(vals.max()) if len(vals) else None


def _latest(rows: np.ndarray, *cols: int) -> tuple | None:
    """``(end, *cols)`` of the row with the latest end (the first of equals), or None."""
    if not len(rows):
        return None
    r = rows[int(np.argmax(rows[:, C_END]))]
    return (int(r[C_END]), *(int(r[c]) for c in cols))


def evidence(d: np.ndarray) -> tuple:
    """What :func:`goodput_processor.model.attempts._run` reads of a process's rows ``d``
    (>= 1 row): the earliest start of a start marker (None: none), the longest heartbeat
    interval they give (None), the earliest start of any row, the latest end marker
    ``(end, sidx)`` and identity marker ``(end, ival, aux)`` (None), the latest end of any
    row, and the highest recorder error and drop counts of the end markers and heartbeats
    (None). Summaries of consecutive rows combine by :func:`evidence_both`."""
    kinds = d[:, C_KIND]
    js = d[kinds == K_JOB_START]
    rec = d[(kinds == K_JOB_END) | (kinds == K_HEARTBEAT)]
    ivals = js[:, C_IVAL]
    ivals = ivals[(ivals != NONE) & (ivals > 0)]
    return (int(js[:, C_START].min()) if len(js) else None,
            int(ivals.max()) if len(ivals) else None,
            int(d[:, C_START].min()),
            _latest(d[kinds == K_JOB_END], C_SIDX),
            _latest(d[kinds == K_IDENTITY], C_IVAL, C_AUX),
            int(d[:, C_END].max()),
            _max_attr(rec, C_IVAL), _max_attr(rec, C_AUX))


def evidence_both(a: tuple, b: tuple) -> tuple:
    """:func:`evidence` of rows A then rows B, from theirs (A's marker wins a tie)."""
    def pick(f, x, y):
        return x if y is None else y if x is None else f(x, y)

    def later(x, y):
        return y if y[0] > x[0] else x

    return (pick(min, a[0], b[0]), pick(max, a[1], b[1]), min(a[2], b[2]),
            pick(later, a[3], b[3]), pick(later, a[4], b[4]), max(a[5], b[5]),
            pick(max, a[6], b[6]), pick(max, a[7], b[7]))
