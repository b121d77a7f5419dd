"""Where a running attempt can be cut into pieces that later rows cannot change.

A live job's last attempt keeps growing at its end: each poll adds the rows of the last
seconds. Accounting it whole at every poll costs its whole length. Instead it is cut, in
its primary process's rows (arrival order), at *quiet points*: a row index ``n`` and an
instant ``c`` such that every row before ``n`` ends at or before ``c`` and every row from
``n`` on starts at or after ``c``. No phase then crosses ``c``, so the attempt's painting,
step times and totals over ``[start, c)`` and ``[c, end)`` add up to those of the whole
(``docs/accounting.md``: every rule is local in time, except the process startup, which
lies before the first phase, and what elastic events and later attempts decide, for which
the attempt is not cut). The pieces before the last cut are kept in the
:class:`~goodput_processor.model.memo.AccountingMemo`; a poll accounts only the rows after it.

The cuts hold while the rows before the last cut are unchanged and every row after it
starts at or after it; a late row that breaks this (an old phase's span arriving late, an
open record superseded) drops every cut, and the attempt is accounted whole and cut anew.
``tests/model/test_incremental.py`` checks the result against accounting afresh.
"""

from __future__ import annotations

import numpy as np

from ..read.rows import (
    C_END,
    C_FLAGS,
    C_KIND,
    C_START,
    F_ENDLESS,
    K_ELASTIC_REINIT,
    K_ELASTIC_WAIT,
    is_phase,
)
from .memo import proc_key, rows_key

__all__ = ["PIECE_ROWS", "running_pieces"]

#: Rows after the last cut before a new cut is looked for (a piece has at least this many).
PIECE_ROWS = 4096
#: Rows at the end of the attempt never put in a piece (the flushes still arriving).
_KEEP_LAST = 64


def _elastic(d: np.ndarray) -> bool:
    k = d[:, C_KIND]
    return bool(((k == K_ELASTIC_WAIT) | (k == K_ELASTIC_REINIT)).any())


def _valid(state: dict, a, d: np.ndarray) -> bool:
    """Whether the cuts in ``state`` still hold for the rows ``d`` of attempt ``a``."""
    n, c = state["cuts"][-1]
    if n > len(d) or c > a.end_ns or rows_key(d[:n]) != state["rows"]:
        return False
    rest = d[n:]
    return not len(rest) or (int(rest[:, C_START].min()) >= c and not _elastic(rest))


def _find_cut(d: np.ndarray, n0: int, c0: int, end_ns: int) -> tuple[int, int] | None:
    """The latest quiet point ``(n, c)`` with ``n0 + PIECE_ROWS <= n <= len(d) -
    _KEEP_LAST`` and ``c0 < c < end_ns`` (a piece before it has a phase when ``n0`` is 0),
    or None."""
    rest = d[n0:]
    hi = len(rest) - _KEEP_LAST
    if hi < PIECE_ROWS:
        return None
    ends = np.maximum.accumulate(rest[:, C_END])  # latest end of the rows before each cut
    # (and of their starts: a damaged row that starts after it ends stays in its piece)
    ends = np.maximum(ends, np.maximum.accumulate(rest[:, C_START]))
    starts = np.append(np.minimum.accumulate(rest[::-1, C_START])[::-1],  # earliest start
                       np.iinfo(np.int64).max)                              # from it on
    j = np.arange(PIECE_ROWS, hi + 1)
    ok = (ends[j - 1] <= starts[j]) & (ends[j - 1] > c0) & (ends[j - 1] < end_ns)
    # open records resolved (F_ENDLESS: moved to the end of the rows, dropped once their
    # phase's span arrives) are never put in a piece
    endless = np.cumsum((rest[:, C_FLAGS] & F_ENDLESS) != 0)
    ok &= endless[j - 1] == 0
    if n0 == 0:  # the first piece needs a phase: the attempt's startup ends at its first
        has_phase = np.cumsum(is_phase(rest[:, C_KIND]))
        ok &= has_phase[j - 1] > 0
    hits = np.flatnonzero(ok)
    if not len(hits):
        return None
    k = int(j[hits[-1]])
    return n0 + k, int(ends[k - 1])


def running_pieces(memo, a) -> list[tuple[int, int]]:
    """The cuts of the running attempt ``a`` in its primary process's rows ``d``: ``[(n,
    c), ...]`` in order (rows before ``n`` end by ``c`` ns, rows from ``n`` start at or
    after it); [] when it is not cut. Kept in ``memo`` from one poll to the next, checked
    against ``d`` and moved on by at least :data:`PIECE_ROWS` rows at a time. Once a poll
    finds no new cut, the next ones with the same rows (:func:`~goodput_processor.model.memo.
    proc_key`) and the same attempt end read no row (rows ``goodput serve`` packed are
    not inflated)."""
    state = memo.get(("pieces", a.attempt, a.start_ns, a.primary.index), dict)
    still = (proc_key(a.primary), a.end_ns)
    if state.get("still") == still:
        return list(state.get("cuts", []))
    d = a.primary.data
    if state.get("cuts") and not _valid(state, a, d):
        state.clear()
    if not state.get("cuts") and _elastic(d):
        return []
    n0, c0 = state["cuts"][-1] if state.get("cuts") else (0, a.start_ns)
    cut = _find_cut(d, n0, c0, a.end_ns)
    if cut is not None:
        state["cuts"] = [*state.get("cuts", []), cut]
        state["rows"] = rows_key(d[:cut[0]])
        state.pop("still", None)
    else:  # (the same rows and end would find none again)
        state["still"] = still
    return list(state.get("cuts", []))
