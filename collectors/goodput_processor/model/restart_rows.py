"""What the recovery phases read of the rows of an attempt that took over
(:func:`goodput_processor.analysis.recovery.recovery_report`), at a live poll's cost of the
new rows.

The phases of the attempt ``r`` after a disruption read its primary process's rows, starts
and ends clipped to ``[r.start_ns, end]`` (all times ns since the epoch): ``end`` is the
attempt's end, or the latest start or end of those rows when earlier, so that a running
attempt whose rows did not change keeps its result as now moves. They read the first
phase's start, the first kept step's start (a kept step: a blocking ``goodput.step`` that
lasts, numbered at most the attempt's kept-step bound), the restore and compilation spans
before it and the compilation spans after it, and the end of the kept steps that start at
a given time (the first one, the last warm-up step).

When ``end`` is that latest time (a running attempt: it always is), the upper clip changes
no row, and all of this comes from a summary of the rows that combines in order (the
earliest phase start, the latest time, the restore and compilation spans, the kept steps
with the :data:`LEAD` earliest starts): :func:`goodput_processor.model.memo.folded` keeps it
for the rows that only grow, and a poll summarises only the rows added since. Else (an
attempt cut or ended before its rows' latest time, or without a phase or a kept step) the
rows are read whole, as before (kept by the memo while they do not change). A kept step
later than the summary's leading ones (a warm-up longer than :data:`LEAD` steps) is looked
up in all the rows. Either way the result is the same to the nanosecond.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..read.rows import (
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_START,
    F_NONBLOCKING,
    K_CHECKPOINT_RESTORE,
    K_PROGRAM_STARTUP,
    K_STEP,
    clip_ns,
    is_phase,
)
from .memo import cached, folded, proc_key

__all__ = ["LEAD", "RestartRows", "restart_rows", "union_ns"]

#: Kept steps a summary keeps (those with the earliest starts, ties at the last included):
#: the first kept step and a warm-up of up to about that many steps are read from it. Kept
#: for every process of a live job (8 KiB of starts and ends each): 512 is far more than a
#: warm-up lasts (a few steps after compilation), and 200 attempts hold 1.6 MiB, not 12.5 as
#: with 4,096 (issue 40 item 3). A longer warm-up reads that attempt's rows whole (exact).
LEAD = 512


def union_ns(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> tuple[int, list]:
    """Length (ns) of the union of [starts, ends) (int64 ns) clipped to [lo, hi), and its
    pieces (disjoint ``(start, end)`` pairs, sorted)."""
    s, e = clip_ns(starts, lo, hi), clip_ns(ends, lo, hi)
    keep = e > s
    pieces: list[tuple[int, int]] = []
    for x, y in sorted(zip(s[keep].tolist(), e[keep].tolist(), strict=True)):
        if pieces and x <= pieces[-1][1]:
            pieces[-1] = (pieces[-1][0], max(pieces[-1][1], y))
        else:
            pieces.append((x, y))
    return sum(y - x for x, y in pieces), pieces


@dataclass(frozen=True)
class RestartRows:
    """What the recovery phases read of attempt ``r``'s primary rows, clipped to
    ``[r.start_ns, end]`` (all ns since the epoch).

    ``first``: the first phase's start (``end`` if none); ``t_fk``: the first kept step's
    start (``end`` if none; not before ``first``); ``restore_ns``, ``rest_pieces``: the
    blocking restores' union in ``[first, t_fk)`` (ns, and its sorted pieces);
    ``comp_pieces``: the blocking compilations' (``goodput.program_startup``) union there;
    ``comp_starts``, ``comp_ends``: those compilation spans (int64 arrays, row order);
    ``restored``: a blocking restore was recorded; ``kept``: a kept step was.
    ``_starts``, ``_ends``: kept steps' starts (sorted) and ends (int64), all those that
    start at or before ``_upto`` (None: all of them); ``_more``: the same read from all the
    rows (for a later start), None when ``_upto`` is None.
    """

    first: int
    t_fk: int
    restore_ns: int
    rest_pieces: list
    comp_pieces: list
    comp_starts: np.ndarray
    comp_ends: np.ndarray
    restored: bool
    kept: bool
    _starts: np.ndarray
    _ends: np.ndarray
    _upto: int | None = None
    _more: Callable[[], RestartRows] | None = None

    def latest_end(self, t: int) -> int | None:
        """The latest end of the kept steps that start at ``t`` (ns), None if none does."""
        if self._upto is not None and t > self._upto:
            return self._more().latest_end(t)
        ks = self._starts
        i, j = np.searchsorted(ks, t, "left"), np.searchsorted(ks, t, "right")
        return int(self._ends[i:j].max()) if j > i else None


def _full(d: np.ndarray, start: int, bound: int | None, end: int) -> RestartRows:
    """:class:`RestartRows` of rows ``d`` (``(n, NCOLS)``) clipped to ``[start, end]``, all
    read; ``bound``: the highest kept step number (None = all kept)."""
    kinds, flags = d[:, C_KIND], d[:, C_FLAGS]
    blocking = (flags & F_NONBLOCKING) == 0
    s, e = clip_ns(d[:, C_START], start, end), clip_ns(d[:, C_END], start, end)
    phase = is_phase(kinds) & (e >= s)
    first = int(s[phase].min()) if phase.any() else end
    kept = (kinds == K_STEP) & blocking & (e > s)
    if bound is not None:
        kept &= d[:, C_IVAL] <= bound
    t_fk = max(int(s[kept].min()) if kept.any() else end, first)
    rest = (kinds == K_CHECKPOINT_RESTORE) & blocking
    comp = (kinds == K_PROGRAM_STARTUP) & blocking
    restore_ns, rest_pieces = union_ns(s[rest], e[rest], first, t_fk)
    _, comp_pieces = union_ns(s[comp], e[comp], first, t_fk)
    ks, ke = s[kept], e[kept]
    order = np.argsort(ks, kind="stable")
    return RestartRows(first, t_fk, restore_ns, rest_pieces, comp_pieces, s[comp], e[comp],
                       bool(rest.any()), bool(kept.any()), ks[order], ke[order])


@dataclass(frozen=True)
class _Summary:
    """Rows summarised with starts and ends raised to the attempt's start (ns): ``first``,
    the earliest phase start (None: no phase); ``last``, the latest start or end (None: no
    rows); ``ks``, ``ke``: kept steps' starts (sorted) and ends, all those starting at or
    before ``upto`` (None: all); ``rs``, ``re`` / ``cs``, ``ce``: the blocking restores' /
    compilations' starts and ends (row order). All arrays int64."""

    first: int | None
    last: int | None
    ks: np.ndarray
    ke: np.ndarray
    upto: int | None
    rs: np.ndarray
    re: np.ndarray
    cs: np.ndarray
    ce: np.ndarray


def _leading(ks: np.ndarray, ke: np.ndarray, upto: int | None) -> tuple:
    """The kept steps ``ks`` (starts), ``ke`` (ends) starting at or before ``upto`` (None:
    all), cut to the :data:`LEAD` earliest (ties at the last kept), sorted by start (stable):
    ``(starts, ends, upto)``, ``upto`` lowered to the last start kept when cut."""
    if upto is not None:
        sel = ks <= upto
        ks, ke = ks[sel], ke[sel]
    if len(ks) > LEAD:
        upto = int(np.partition(ks, LEAD - 1)[LEAD - 1])
        sel = ks <= upto
        ks, ke = ks[sel], ke[sel]
    order = np.argsort(ks, kind="stable")
    return ks[order], ke[order], upto


def _summary(start: int, bound: int | None, d: np.ndarray) -> _Summary:
    """:class:`_Summary` of rows ``d`` (``(k, NCOLS)``, ``k >= 0``) of an attempt that
    started at ``start`` (ns) with kept-step bound ``bound`` (None = all kept)."""
    kinds = d[:, C_KIND]
    blocking = (d[:, C_FLAGS] & F_NONBLOCKING) == 0
    s, e = np.maximum(d[:, C_START], start), np.maximum(d[:, C_END], start)
    phase = is_phase(kinds) & (e >= s)
    kept = (kinds == K_STEP) & blocking & (e > s)
    if bound is not None:
        kept &= d[:, C_IVAL] <= bound
    rest = (kinds == K_CHECKPOINT_RESTORE) & blocking
    comp = (kinds == K_PROGRAM_STARTUP) & blocking
    ks, ke, upto = _leading(s[kept], e[kept], None)
    return _Summary(int(s[phase].min()) if phase.any() else None,
                    int(max(s.max(), e.max())) if len(d) else None,
                    ks, ke, upto, s[rest], e[rest], s[comp], e[comp])


def _pick(f, x, y):
    return x if y is None else y if x is None else f(x, y)


def _both(a: _Summary, b: _Summary) -> _Summary:
    """:func:`_summary` of rows A then rows B, from theirs."""
    ks, ke, upto = _leading(np.concatenate([a.ks, b.ks]), np.concatenate([a.ke, b.ke]),
                            _pick(min, a.upto, b.upto))
    return _Summary(_pick(min, a.first, b.first), _pick(max, a.last, b.last), ks, ke, upto,
                    *(np.concatenate([x, y]) for x, y in zip(
                        (a.rs, a.re, a.cs, a.ce), (b.rs, b.re, b.cs, b.ce), strict=True)))


def restart_rows(r, bound: int | None, memo=None) -> RestartRows:
    """:class:`RestartRows` of attempt ``r``'s primary process (an
    :class:`~goodput_processor.model.attempts.Attempt`), its kept steps numbered at most ``bound``
    (None = all); ``memo``: an :class:`~goodput_processor.model.memo.AccountingMemo` that keeps
    the summary of its rows (a poll reads the rows added since) and what is read whole."""
    p, start = r.primary, r.start_ns
    summ = cached(memo, ("restart_summary", proc_key(p), start, bound),
                  lambda: folded(memo, "restart", p, lambda d: _summary(start, bound, d),
                                 _both, start, bound))
    # rows that end (and start) by the attempt's end read the same clipped at their own
    # latest time: a running attempt whose rows did not change keeps its result as now moves
    last = summ.last if summ.first is not None and len(summ.ks) else None
    end = r.end_ns if last is None else min(r.end_ns, last)

    def whole() -> RestartRows:
        return cached(memo, ("restart", r.attempt, start, end, proc_key(p), bound),
                      lambda: _full(p.data, start, bound, end))

    if last is None or last > r.end_ns:  # the upper clip may change rows: read them all
        return whole()

    def phases() -> tuple:
        t_fk = max(int(summ.ks[0]), summ.first)
        restore_ns, rest_pieces = union_ns(summ.rs, summ.re, summ.first, t_fk)
        return t_fk, restore_ns, rest_pieces, union_ns(summ.cs, summ.ce, summ.first, t_fk)[1]

    # (kept apart from the rows object, whose ``_more`` reads this poll's rows)
    t_fk, restore_ns, rest_pieces, comp_pieces = cached(
        memo, ("restart_phases", start, proc_key(p), bound), phases)
    return RestartRows(summ.first, t_fk, restore_ns, rest_pieces, comp_pieces, summ.cs,
                       summ.ce, len(summ.rs) > 0, True, summ.ks, summ.ke, summ.upto,
                       None if summ.upto is None else whole)
