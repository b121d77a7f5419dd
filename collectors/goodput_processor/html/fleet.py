"""Every process of every attempt as flat arrays, and who was missing, late or gone early.

The HTML report draws a job's processes as a heat strip (:mod:`.heat`) instead of one row
each; this module gathers what that needs from the accounted attempts
(:func:`fleet_of`): per (attempt, process) when it was first and last seen, and every
blocking step span of every process. A :class:`Fleet` can also be built directly from
arrays (``benchmarks/html_jobs.py`` does, for 10^7 processes x attempts).

:func:`process_lists` tells, per attempt, the processes that were

- **missing**: a rank below the attempt's expected count (its declared
  ``goodput.process.count``, else the highest rank + 1 seen in the job) with no spans;
- **late**: first seen more than :func:`late_bound_ns` after the median first-seen time of
  the attempt's processes;
- **gone early**: last seen (by a record after its start) more than that bound before the
  attempt's end (the process that failed first is usually here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..read.rows import (
    C_AUX,
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_START,
    F_NONBLOCKING,
    K_JOB_END,
    K_JOB_START,
    K_STEP,
    NONE,
)

__all__ = ["Fleet", "ProcessLists", "fleet_of", "format_ranks", "late_bound_ns",
           "process_lists"]

_NS = 1_000_000_000
#: A process is late / gone early beyond max(this, LATE_FRACTION x attempt duration).
LATE_MIN_NS = 10 * _NS
LATE_FRACTION = 0.1


@dataclass(frozen=True)
class Fleet:
    """A job's processes and their step spans, as flat arrays.

    ``hosts``: host names; ``*_host`` arrays index it (-1: unknown). ``expected``: per
    attempt position (index into ``JobResult.attempts``), the ranks expected (int64).
    Per (attempt, process), sorted by attempt then rank: ``p_attempt`` (int32 position),
    ``p_rank`` (int32), ``p_host`` (int32), ``p_first_ns``/``p_last_ns`` (int64: first
    record, last sign of life), ``p_ended`` (bool: wrote an end marker). Per blocking step
    span of any process: ``s_attempt``, ``s_rank`` (int32), ``s_start_ns``, ``s_end_ns``
    (int64, clipped to the attempt), ``s_count`` (int32 steps it covers), ``s_step``
    (int64 step number, ``NONE`` if absent).
    """

    hosts: tuple[str, ...]
    expected: np.ndarray
    p_attempt: np.ndarray
    p_rank: np.ndarray
    p_host: np.ndarray
    p_first_ns: np.ndarray
    p_last_ns: np.ndarray
    p_ended: np.ndarray
    s_attempt: np.ndarray
    s_rank: np.ndarray
    s_start_ns: np.ndarray
    s_end_ns: np.ndarray
    s_count: np.ndarray
    s_step: np.ndarray

    @property
    def max_processes(self) -> int:
        """The most processes any attempt had."""
        if not len(self.p_attempt):
            return 0
        return int(np.bincount(self.p_attempt).max())

    def host_of(self, attempt: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Host index of each (attempt position, rank) pair (-1 where there is none)."""
        keys = _key(self.p_attempt, self.p_rank)
        want = _key(np.asarray(attempt), np.asarray(rank))
        if not len(keys):
            return np.full(len(want), -1, np.int32)
        pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        return np.where(keys[pos] == want, self.p_host[pos], -1).astype(np.int32)


def _key(attempt: np.ndarray, rank: np.ndarray) -> np.ndarray:
    return (attempt.astype(np.int64) << 32) | rank.astype(np.int64)


def fleet_of(attempts) -> Fleet:
    """The :class:`Fleet` of a job's accounted attempts
    (:class:`~goodput_processor.model.attempts.Attempt`, as ``accounting._account`` returns)."""
    hosts: dict[str, int] = {}
    cols: dict[str, list] = {k: [] for k in ("pa", "pr", "ph", "pf", "pl", "pe")}
    steps, keys = [], []
    for i, a in enumerate(attempts):
        seen = set()
        for p in a.processes:
            d = p.data
            if not len(d) or p.index in seen:  # a rank claimed twice: the first (longest)
                continue
            seen.add(p.index)
            kinds = d[:, C_KIND]
            js = d[kinds == K_JOB_START]
            cols["pa"].append(i)
            cols["pr"].append(p.index)
            cols["ph"].append(-1 if not p.host else hosts.setdefault(p.host, len(hosts)))
            cols["pf"].append(int(js[:, C_START].min() if len(js) else d[:, C_START].min()))
            cols["pl"].append(int(d[:, C_END].max()))
            cols["pe"].append(bool((kinds == K_JOB_END).any()))
            sel = (kinds == K_STEP) & ((d[:, C_FLAGS] & F_NONBLOCKING) == 0)
            if sel.any():
                rows = d[sel]
                s = np.clip(rows[:, C_START], a.start_ns, a.end_ns)
                e = np.clip(rows[:, C_END], a.start_ns, a.end_ns)
                ok = e > s
                steps.append(np.stack((s[ok], e[ok], rows[ok, C_AUX], rows[ok, C_IVAL]), 1))
                keys.append((i, p.index, int(ok.sum())))
    st = np.concatenate(steps) if steps else np.zeros((0, 4), np.int64)
    n = np.array([k[2] for k in keys], np.int64)
    present = np.asarray(cols["pr"], np.int64)
    top = int(present.max()) + 1 if len(present) else 0
    expected = np.array([a.declared_process_count or top for a in attempts], np.int64)
    order = np.lexsort((present, np.asarray(cols["pa"], np.int64)))
    return Fleet(
        hosts=tuple(hosts),
        expected=expected,
        p_attempt=np.asarray(cols["pa"], np.int32)[order],
        p_rank=np.asarray(cols["pr"], np.int32)[order],
        p_host=np.asarray(cols["ph"], np.int32)[order],
        p_first_ns=np.asarray(cols["pf"], np.int64)[order],
        p_last_ns=np.asarray(cols["pl"], np.int64)[order],
        p_ended=np.asarray(cols["pe"], bool)[order],
        s_attempt=np.repeat(np.array([k[0] for k in keys], np.int32), n),
        s_rank=np.repeat(np.array([k[1] for k in keys], np.int32), n),
        s_start_ns=st[:, 0].copy(),
        s_end_ns=st[:, 1].copy(),
        s_count=np.where(st[:, 2] == NONE, 1, np.maximum(st[:, 2], 1)).astype(np.int32),
        s_step=st[:, 3].copy(),
    )


def late_bound_ns(duration_ns: int) -> int:
    """How far from the others a process must be to be late or gone early:
    max(10 s, 10 % of the attempt's duration)."""
    return max(LATE_MIN_NS, int(LATE_FRACTION * duration_ns))


@dataclass(frozen=True)
class ProcessLists:
    """Per attempt position: present process count and the ranks missing, late and gone
    early (int arrays, ascending)."""

    present: list[int]
    missing: list[np.ndarray]
    late: list[np.ndarray]
    early: list[np.ndarray]


def process_lists(result, fleet: Fleet) -> ProcessLists:
    """Missing, late and gone-early processes of each attempt of ``result`` (see the
    module docstring)."""
    out = ProcessLists([], [], [], [])
    bounds = np.searchsorted(fleet.p_attempt, np.arange(len(result.attempts) + 1))
    for i, a in enumerate(result.attempts):
        lo, hi = bounds[i], bounds[i + 1]
        ranks = fleet.p_rank[lo:hi]
        first, last = fleet.p_first_ns[lo:hi], fleet.p_last_ns[lo:hi]
        out.present.append(int(hi - lo))
        seen = np.zeros(int(fleet.expected[i]), bool)
        seen[ranks[ranks < len(seen)]] = True
        out.missing.append(np.flatnonzero(~seen))
        if hi - lo < 2:
            out.late.append(ranks[:0])
            out.early.append(ranks[:0])
            continue
        bound = late_bound_ns(a.end_ns - a.start_ns)
        out.late.append(ranks[first - np.median(first) > bound])
        # only a start marker (an imported log's other nodes) is no sign of life after it
        out.early.append(ranks[(last < a.end_ns - bound) & (last > first)])
    return out


def format_ranks(ranks, limit: int = 12) -> str:
    """Ranks as compact ranges: ``"p3, p7-p9, p12"``; past ``limit`` ranges,
    ``"... (+N more)"``; ``"-"`` when empty."""
    ranks = [int(r) for r in ranks]
    if not ranks:
        return "-"
    runs, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append((start, prev))
        if r is not None:
            start = prev = r
    text = ", ".join(f"p{a}" if a == b else f"p{a}\u2013p{b}" for a, b in runs[:limit])
    more = sum(b - a + 1 for a, b in runs[limit:])
    return text + (f", \u2026 (+{more} more)" if more else "")
