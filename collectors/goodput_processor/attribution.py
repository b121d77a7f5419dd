"""Badput attributed to hosts: which host made the job slow, and which made it restart
(``docs/accounting.md``, "Badput attributed to hosts").

**Slow steps.** ``training_slowdown`` is measured on each attempt's primary process. For every
anomalous kept step, every host process of the attempt that ran the same step number gives
its *arrival*: when it finished its own part of the step and reached the synchronisation
point, i.e. the step span's end minus the ``goodput.collective_wait`` time recorded inside it
(schema 1.3; without such spans, the step's end). In synchronous data-parallel training the
step ends for everyone when the last host arrives, so the step's excess over the ideal step
time is caused by the hosts that arrived after the earliest one. It is split as a waterfall:
with arrivals sorted latest first, ``a1 >= a2 >= ... >= ak``, the stretch ``[a(j+1), a(j)]``
is shared equally by the ``j`` hosts that arrived after ``a(j+1)``; the host that alone
arrived last carries ``a1 - a2``. The blames sum to ``a1 - ak``; when that is more than the
step's excess they are scaled down to it, and what the spread does not explain (a step slow
on every host alike, or hosts whose step spans all end together at the collective because no
collective wait was recorded) stays *unattributed*. An attempt with a single process gets
all of its slowdown.

**Disruptions.** Each disruption (:mod:`.recovery`) is charged to the process that failed
first, with the badput it caused (:attr:`~.recovery.Recovery.lost_s`). The warm-up excess of
the steps after a restart (:func:`~.recovery.warmup`) is part of that, so it is taken out of
those steps' excess before the slowdown is split among hosts.

The table lists hosts by ``badput_s`` = attributed slowdown + the badput of the disruptions
they caused. Vectorised over all processes of an attempt (one concatenation, a sort and a
few cumulative sums).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .memo import cached, proc_key
from .recovery import stacked, warmup
from .timeline import (
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_START,
    F_ENDLESS,
    F_NONBLOCKING,
    K_COLLECTIVE_WAIT,
    K_STEP,
    NONE,
)

__all__ = ["DEFAULT_TOP", "HostBadput", "host_badput", "slowdown_by_host"]

#: Hosts listed in the report and the metric.
DEFAULT_TOP = 10
_NS = 1_000_000_000


@dataclass(frozen=True)
class HostBadput:
    """Badput one host process caused (seconds): ``slowdown_s`` of ``training_slowdown``
    attributed to it, ``disruptions_caused`` (it failed first), ``badput_s`` = slowdown +
    the badput of those disruptions."""

    host: str | None
    process: int
    slowdown_s: float
    disruptions_caused: int
    badput_s: float


def _arrivals(d: np.ndarray, key: np.ndarray, steps_wanted: np.ndarray):
    """(process index, step number, arrival ns) of the blocking, completed step spans in rows
    ``d`` (of processes ``key``) whose number is in ``steps_wanted``: the span's end minus the
    collective wait recorded inside it (waits matched to the step of the same process whose
    start is the latest at or before theirs)."""
    flags, kinds = d[:, C_FLAGS], d[:, C_KIND]
    ss = np.flatnonzero((kinds == K_STEP) & ((flags & (F_NONBLOCKING | F_ENDLESS)) == 0)
                        & np.isin(d[:, C_IVAL], steps_wanted))
    ww = np.flatnonzero((kinds == K_COLLECTIVE_WAIT) & ((flags & F_NONBLOCKING) == 0))
    wait = np.zeros(len(ss), np.int64)
    if len(ss) and len(ww):
        k = np.concatenate((key[ss], key[ww]))
        t = np.concatenate((d[ss, C_START], d[ww, C_START]))
        typ = np.concatenate((np.zeros(len(ss), np.int8), np.ones(len(ww), np.int8)))
        src = np.concatenate((np.arange(len(ss)), np.arange(len(ww))))
        o = np.lexsort((typ, t, k))
        k, typ, src = k[o], typ[o], src[o]
        pos = np.where(typ == 0, np.arange(len(o)), -1)
        last = np.maximum.accumulate(pos)  # the latest step row at or before each row
        q = np.flatnonzero((typ == 1) & (last >= 0))
        q = q[k[last[q]] == k[q]]  # a step of the same process
        si, wi = src[last[q]], ww[src[q]]
        s_end = d[ss[si], C_END]
        ok = d[wi, C_START] < s_end
        dur = np.minimum(d[wi[ok], C_END], s_end[ok]) - d[wi[ok], C_START]
        wait = np.rint(np.bincount(si[ok], weights=dur, minlength=len(ss))).astype(np.int64)
    st = d[ss]
    arrival = st[:, C_END] - np.minimum(wait, st[:, C_END] - st[:, C_START])
    return key[ss], st[:, C_IVAL], arrival


def slowdown_by_host(attempts: Sequence, result, memo=None) -> tuple[dict[tuple, int], int]:
    """Attributed slowdown per host process, ``{(host, rank): ns}``, and the unattributed ns.

    ``result`` is the accounting's :class:`~goodput_processor.report.JobResult` (its kept
    steps, anomalous flags and ideal step time). ``memo`` keeps each attempt's share under
    its inputs (its steps' part, its processes' rows, the ideal step time and noise band).
    """
    out: dict[tuple, int] = {}
    unattributed = 0
    if result.ideal_step_time_s is None or not result.step_time.anomalous_steps:
        return out, 0
    for a in attempts:
        off, parts, pkeys = result.steps.of_attempt(a.attempt)
        if not parts:
            continue
        key = ("slow_by_host", tuple(pkeys), a is attempts[0], result.ideal_step_time_s,
               result.noise_tolerance_s, tuple(proc_key(p) for p in a.processes))

        def compute(a=a, off=off, parts=parts):
            part = parts[0] if len(parts) == 1 else tuple(
                np.concatenate([p[i] for p in parts]) for i in range(5))
            return _attempt_slowdown(a, a is attempts[0], result, off, part, memo)

        got, lost = cached(memo if pkeys[0] is not None else None, key, compute)
        for k, v in got.items():
            out[k] = out.get(k, 0) + v
        unattributed += lost
    return out, max(unattributed, 0)


def _attempt_slowdown(a, first: bool, result, off: int, part: tuple,
                      memo) -> tuple[dict[tuple, int], int]:
    """One attempt's share of :func:`slowdown_by_host`: ``({(host, rank): ns}, unattributed
    ns)``; ``off``, ``part``: where its kept steps begin in ``result.steps`` and their
    arrays."""
    out: dict[tuple, int] = {}
    unattributed = 0
    ideal = result.ideal_step_time_s * _NS
    snum, _att, _start, t, cnt = part
    st = result.steps
    mine = np.flatnonzero(t / cnt > st.ideal_ns + st.tol_ns)
    if not len(mine):
        return out, 0
    idx = mine + off
    excess = t[mine] - cnt[mine] * ideal  # float ns per anomalous step
    if not first:  # its warm-up after a restart is the disruption's badput
        widx, wex, _ = warmup(result, a.attempt, memo)
        pos = np.searchsorted(idx, widx)
        ok = (pos < len(idx)) & (idx[np.minimum(pos, len(idx) - 1)] == widx)
        excess[pos[ok]] -= wex[ok]
        excess = np.maximum(excess, 0)
    if len(a.processes) == 1:
        return {(a.primary.host, a.primary.index): int(round(float(excess.sum())))}, 0
    nums = snum[mine]
    numbered = nums != NONE
    unattributed += int(round(float(excess[~numbered].sum())))
    nums, excess = nums[numbered], excess[numbered]
    order = np.argsort(nums, kind="stable")
    nums, excess = nums[order], excess[order]
    d, rowkey, procs = stacked(a)
    keys = [(p.host, p.index) for p in procs]
    who, num, arr = _arrivals(d, rowkey, nums)
    if not len(num):
        return out, unattributed + int(round(float(excess.sum())))
    # latest arrival first within each step number
    o = np.lexsort((-arr, num))
    who, num, arr = who[o], num[o], arr[o]
    starts = np.flatnonzero(np.concatenate(([True], num[1:] != num[:-1])))
    ends = np.append(starts[1:], len(num))
    pos = np.arange(len(num)) - np.repeat(starts, ends - starts) + 1  # 1-based position
    nxt = np.append(arr[1:], 0)
    d = np.where(np.isin(np.arange(len(num)), ends - 1), 0, arr - nxt).astype(float)
    c = d / pos
    suffix = np.append(np.cumsum(c[::-1])[::-1], 0.0)
    blame = suffix[:-1] - np.repeat(suffix[ends], ends - starts)
    spread = (arr[starts] - arr[ends - 1]).astype(float)  # a1 - ak per step number
    step_excess = excess[np.searchsorted(nums, num[starts])]
    scale = np.where(spread > 0, np.minimum(1.0, np.maximum(step_excess, 0) / np.where(
        spread > 0, spread, 1)), 0.0)
    blame *= np.repeat(scale, ends - starts)
    got = np.bincount(who, weights=blame, minlength=len(keys))
    for k, v in zip(keys, got, strict=True):
        if v > 0:
            out[k] = out.get(k, 0) + int(round(float(v)))
    attributed = float(blame.sum())
    seen = np.isin(nums, num[starts])
    unattributed += int(round(float(excess[~seen].sum()) + float(step_excess.sum())
                              - attributed))
    return out, unattributed


def host_badput(attempts: Sequence, result, recoveries: Sequence = (),
                top: int = DEFAULT_TOP, memo=None) -> tuple[tuple[HostBadput, ...], float]:
    """The hosts that caused the most badput, and the slowdown attributed to none.

    Args:
        attempts: the job's attempts (:func:`~goodput_processor.attempts.build_attempts`).
        result: its :class:`~goodput_processor.report.JobResult`.
        recoveries: its :class:`~goodput_processor.recovery.Recovery` records.
        top: how many hosts to list (>= 1), most badput first (ties: lower rank first).
        memo: an :class:`~goodput_processor.memo.AccountingMemo` (see
            :func:`slowdown_by_host`).

    Returns:
        ``(hosts, unattributed_slowdown_s)``; hosts with no badput are left out.

    Raises:
        ValueError: ``top`` < 1.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top!r}")
    slow, unattributed = slowdown_by_host(attempts, result, memo)
    caused: dict[tuple, list] = {}
    for rec in recoveries:
        key = (rec.first_failure.host, rec.first_failure.process)
        c = caused.setdefault(key, [0, 0.0])
        c[0] += 1
        c[1] += rec.lost_s
    rows = []
    for key in set(slow) | set(caused):
        s = slow.get(key, 0) / _NS
        n, lost = caused.get(key, (0, 0.0))
        if s > 0 or n:
            rows.append(HostBadput(key[0], int(key[1]), s, n, s + lost))
    rows.sort(key=lambda h: (-h.badput_s, h.process, h.host or ""))
    return tuple(rows[:top]), unattributed / _NS
