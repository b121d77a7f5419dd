"""mgm's replay resumed where an earlier poll of a live job left it (``account_mgm(memo=)``).

mgm 0.2.3 computes a job by walking its log in order (:func:`~.mgm_calc._calculate` does
the same walk on the whole stream at once). Its state after a prefix of the stream is
small: the sums of the segments a repeated step number closed, the open segment's steps,
phase starts not yet ended, the custom badput intervals, checkpoint statistics per step
(and, for the ideal step time and step deviation, mgm's step times so far).
:class:`Replay` is that state; :func:`advance` carries it over the next events and
:func:`core` finishes it into the same :class:`~.mgm_calc._Core` as ``_calculate`` of the
whole stream, to the bit (sums in the same order: ``tests/definitions/test_mgm_incremental.py``).

:func:`resumed_core` keeps a :class:`Replay` in the memo at a *settled* point of the
stream (all attempts but the last, and the last one's events older than
:data:`SETTLE_NS` before its latest). The next poll replays only from there when the new
stream begins with the same events up to that point (the earlier attempts' events are
unchanged, the last one's first events compare equal), else replays the whole stream.
Elastic replays are not resumed (the caller replays them whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..model.memo import AccountingMemo, cached
from .mgm_calc import _Core, _repeats, _segment, add_segment_sums
from .mgm_events import (
    E_CUSTOM_END,
    E_CUSTOM_START,
    E_DL_END,
    E_DL_START,
    E_JOB_END,
    E_JOB_START,
    E_PREP_END,
    E_PREP_START,
    E_RESTORE,
    E_SAVE,
    E_STEP,
    E_TPU_END,
    E_TPU_START,
    Events,
    in_order,
    renumber,
    stream,
)
from .mgm_result import _NS, BADPUT_TYPES
from .mgm_steps import dict_order

__all__ = ["SETTLE_NS", "Replay", "advance", "core", "resumed_core", "settled_box"]

#: Events of the last attempt younger than this (ns) before its latest event are replayed
#: again at each poll (a span written late starts before the latest event).
SETTLE_NS = 300 * _NS
_PHASES = ((E_TPU_START, E_TPU_END), (E_PREP_START, E_PREP_END), (E_DL_START, E_DL_END))
_PRESENT = frozenset({"TPU_INITIALIZATION", "TRAINING_PREP", "DATA_LOADING_ASYNC",
                      "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
                      "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"})
_Z = np.zeros(0, np.int64)
_NO_CKPT = (_Z, np.zeros(0, np.float64), _Z)


@dataclass(frozen=True)
class Replay:
    """mgm's replay (:func:`~.mgm_calc._calculate`) after the first ``n`` events of a
    stream. Times ns; sums of closed segments in their order (floats as ``_calculate``
    adds them); the open segment's step numbers and times as array pieces."""

    n: int = 0
    productive_s: float = 0.0
    startup_s: float = 0.0
    wasted_ns: int = 0
    custom_ns: tuple = ()  # ((custom type, ns), ...) of closed segments
    present: frozenset = frozenset()
    recovery_ns: int = 0
    disruptions: int = 0
    seg_num: tuple = ()
    seg_t: tuple = ()
    seg_max: int | None = None
    last_js: int | None = None
    last_je: int | None = None
    pending: tuple = (None, None, None)  # start without end yet: tpu, prep, data loading
    pending_custom: tuple = ()  # ((custom type, start), ...)
    phase_ns: tuple = (0, 0, 0)  # paired time: tpu, prep, data loading
    dl_any: bool = False
    sync_ns: int = 0  # DATA_LOADING_SYNC of the runs a repeat closed
    run_first: int | None = None  # the open run's first and last data loading (ns)
    run_last: int | None = None
    custom: tuple = (_Z, _Z, _Z)  # custom badput intervals (start < end): start, end, type
    ckpt: tuple = (_NO_CKPT, _NO_CKPT)  # save, restore: (steps, sums of s, counts)
    # mgm's step times (``_step_time_arrays``): step numbers in the dict's order, times
    # (ns), whether the numbers increase, the last step (number, start)
    st_keys: np.ndarray = field(default_factory=lambda: _Z)
    st_ns: np.ndarray = field(default_factory=lambda: _Z)
    st_sorted: bool = True
    st_last: tuple | None = None


def _phase_pairs(ev: Events, k0: int, k1: int, pending):
    """:func:`~.mgm_events.pairs` of ``ev`` after a start ``pending`` (ns or None) left
    open: ``(start_t, end_t, end_pos, start still open)``."""
    pos = np.flatnonzero((ev.kind == k0) | (ev.kind == k1))
    if not len(pos):
        return _Z, _Z, _Z, pending
    is_start = ev.kind[pos] == k0
    t = ev.t[pos]
    if pending is not None:
        is_start = np.concatenate(([True], is_start))
        t = np.concatenate(([pending], t))
        pos = np.concatenate(([-1], pos))
    close = ~is_start[1:] & is_start[:-1]
    return t[:-1][close], t[1:][close], pos[1:][close], int(t[-1]) if is_start[-1] else None


def _custom_pairs(ev: Events, pending: tuple):
    """Custom badput pairs of ``ev`` per type (as ``pairs(by_val=True)``, in order of their
    ends) after the starts ``pending`` left open; returns them and the starts left open."""
    pos = np.flatnonzero((ev.kind == E_CUSTOM_START) | (ev.kind == E_CUSTOM_END))
    if not len(pos):
        return _Z, _Z, _Z, pending
    is_start, t, v = ev.kind[pos] == E_CUSTOM_START, ev.t[pos], ev.val[pos]
    if pending:
        pv, pt = (np.array(x, np.int64) for x in zip(*pending, strict=True))
        is_start = np.concatenate((np.ones(len(pv), bool), is_start))
        t, v = np.concatenate((pt, t)), np.concatenate((pv, v))
        pos = np.concatenate((np.full(len(pv), -1), pos))
    o = np.lexsort((pos, v))  # grouped by type, stream order within
    is_start, t, v, pos = is_start[o], t[o], v[o], pos[o]
    close = ~is_start[1:] & is_start[:-1] & (v[1:] == v[:-1])
    s, e, cv, ends = t[:-1][close], t[1:][close], v[1:][close], pos[1:][close]
    o = np.argsort(ends, kind="stable")
    last = np.ones(len(v), bool)
    last[:-1] = v[1:] != v[:-1]
    left = tuple((int(a), int(b)) for a, b, k in zip(v[last], t[last], is_start[last],
                                                      strict=True) if k)
    return s[o], e[o], cv[o], left


def _ckpt_add(ck, steps: np.ndarray, w: np.ndarray):
    """Checkpoint statistics ``ck`` (steps sorted, sums of seconds in stream order,
    counts) with entries ``steps``/``w`` (seconds) added, as ``np.bincount`` adds them."""
    keys, sums, counts = ck
    idx = np.searchsorted(keys, steps)
    old = idx < len(keys)
    old[old] = keys[idx[old]] == steps[old]
    sums, counts = sums.copy(), counts.copy()
    for i in np.flatnonzero(old).tolist():
        sums[idx[i]] += w[i]
        counts[idx[i]] += 1
    if not old.all():
        u, inv = np.unique(steps[~old], return_inverse=True)
        keys = np.concatenate((keys, u))
        sums = np.concatenate((sums, np.bincount(inv, weights=w[~old])))
        counts = np.concatenate((counts, np.bincount(inv)))
        o = np.argsort(keys, kind="stable")
        keys, sums, counts = keys[o], sums[o], counts[o]
    return keys, sums, counts


def _ckpt_total_s(ck) -> float:
    """:func:`~.mgm_calc._checkpoint_total_s` of the statistics ``ck``."""
    keys, sums, counts = ck
    return float((sums / counts).sum()) if len(keys) else 0.0


def _pieces(p: tuple) -> tuple:
    return (np.concatenate(p),) if len(p) > 32 else p


def advance(st: Replay, ev: Events) -> Replay:
    """:class:`Replay` ``st`` carried over ``ev``, the events that follow its ``n`` first
    (their type indices those of the same stream)."""
    if not len(ev.t):
        return st
    kind, t = ev.kind, ev.t
    pending, phase_ns = list(st.pending), list(st.phase_ns)
    for i, (k0, k1) in enumerate(_PHASES):
        s, e, pos, pending[i] = _phase_pairs(ev, k0, k1, st.pending[i])
        phase_ns[i] += int((e - s).sum())
        if i == 2:
            dl, dpos = e - s, pos
    cs, ce, cv, pending_custom = _custom_pairs(ev, st.pending_custom)
    keep = cs < ce
    custom = tuple(np.concatenate((a, b[keep])) for a, b in
                   zip(st.custom, (cs, ce, cv), strict=True)) if keep.any() else st.custom
    ckpt = list(st.ckpt)
    for i, k in enumerate((E_SAVE, E_RESTORE)):
        sel = kind == k
        if sel.any():
            ckpt[i] = _ckpt_add(ckpt[i], ev.val[sel], ev.dur[sel] / _NS)
    jpos = np.flatnonzero(kind == E_JOB_START)
    je = t[kind == E_JOB_END]

    sp = np.flatnonzero(kind == E_STEP)
    y, ty = ev.val[sp], t[sp]
    nseg = sum(len(p) for p in st.seg_num)
    cuts: list[int] = []
    if len(y) and not ((st.seg_max is None or y[0] > st.seg_max)
                       and bool((y[1:] > y[:-1]).all())):
        cuts = [i - nseg for i in _repeats(np.concatenate(st.seg_num + (y,)))]
    productive_s, startup_s, wasted_ns = st.productive_s, st.startup_s, st.wasted_ns
    custom_ns, present = dict(st.custom_ns), set(st.present)
    recovery_ns = st.recovery_ns
    sync_ns, first, last = st.sync_ns, st.run_first, st.run_last
    run = np.searchsorted(sp[cuts], dpos, side="left")
    if cuts:
        allnum = np.concatenate(st.seg_num + (y,))
        allt = np.concatenate(st.seg_t + (ty,))
    b = 0
    for r in range(len(cuts) + 1):
        d = dl[run == r]
        if len(d):
            first = int(d[0]) if first is None else first
            last = int(d[-1])
        if r == len(cuts):
            break
        i = cuts[r] + nseg
        seg = _segment(allnum[b:i], allt[b:i], int(allnum[i]), custom)
        productive_s, wasted_ns, startup_s = add_segment_sums(
            seg, (productive_s, wasted_ns, startup_s), custom_ns, present)
        k = int(np.searchsorted(jpos, sp[cuts[r]], side="left")) - 1
        js = int(t[jpos[k]]) if k >= 0 else st.last_js
        if js is not None and js > allt[i - 1]:
            recovery_ns += int(js - allt[i - 1])
            present.add("INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION")
        if first is not None:  # a repeat closes the run of data loadings
            sync_ns += first + last
        first = last = None
        b = i
    if cuts:
        seg_num, seg_t = (allnum[b:],), (allt[b:],)
        seg_max = int(allnum[b:].max())
    elif len(y):
        seg_num, seg_t = _pieces(st.seg_num + (y,)), _pieces(st.seg_t + (ty,))
        seg_max = int(y[-1])
    else:
        seg_num, seg_t, seg_max = st.seg_num, st.seg_t, st.seg_max
    st_keys, st_ns, st_sorted = _step_times(st, y, ty)
    return Replay(
        st_keys=st_keys, st_ns=st_ns, st_sorted=st_sorted,
        st_last=(int(y[-1]), int(ty[-1])) if len(y) else st.st_last,
        n=st.n + len(t), productive_s=productive_s, startup_s=startup_s, wasted_ns=wasted_ns,
        custom_ns=tuple(custom_ns.items()), present=frozenset(present),
        recovery_ns=recovery_ns, disruptions=st.disruptions + len(cuts), seg_num=seg_num,
        seg_t=seg_t, seg_max=seg_max,
        last_js=int(t[jpos[-1]]) if len(jpos) else st.last_js,
        last_je=int(je[-1]) if len(je) else st.last_je, pending=tuple(pending),
        pending_custom=pending_custom, phase_ns=tuple(phase_ns),
        dl_any=st.dl_any or bool(len(dl)), sync_ns=sync_ns, run_first=first, run_last=last,
        custom=custom, ckpt=tuple(ckpt))


def _step_times(st: Replay, y: np.ndarray, ty: np.ndarray):
    """``(st_keys, st_ns, st_sorted)`` of ``st`` after the step starts ``y``/``ty``: the
    pairs of consecutive numbers (from ``st``'s last step on) added as mgm's dict adds
    them (a number's first place, its last time)."""
    if st.st_last is not None:
        y = np.concatenate(([st.st_last[0]], y))
        ty = np.concatenate(([st.st_last[1]], ty))
    ok = np.flatnonzero(y[1:] == y[:-1] + 1)
    if not len(ok):
        return st.st_keys, st.st_ns, st.st_sorted
    nk, nv = y[ok], ty[ok + 1] - ty[ok]
    if st.st_sorted and bool((nk[1:] > nk[:-1]).all()) and (
            not len(st.st_keys) or nk[0] > st.st_keys[-1]):
        return np.concatenate((st.st_keys, nk)), np.concatenate((st.st_ns, nv)), True
    keys, ns = dict_order(np.concatenate((st.st_keys, nk)), np.concatenate((st.st_ns, nv)))
    return keys, ns, bool((keys[1:] > keys[:-1]).all())


def core(st: Replay, types: tuple) -> _Core:
    """mgm's result for the stream ``st`` was carried over (``types``: its custom badput
    types), equal to :func:`~.mgm_calc._calculate` of it (not elastic)."""
    unprod = dict.fromkeys(BADPUT_TYPES, 0.0)
    del unprod["OTHER"]
    custom_ns, present = dict(st.custom_ns), set(_PRESENT | st.present)
    productive_s, startup_s, wasted_ns = st.productive_s, st.startup_s, st.wasted_ns
    unprod["TPU_INITIALIZATION"] = st.phase_ns[0] / _NS
    unprod["TRAINING_PREP"] = st.phase_ns[1] / _NS
    sync_ns = st.sync_ns + (st.run_first or 0)
    unprod["DATA_LOADING_SYNC"] = sync_ns / _NS
    if st.dl_any:
        present.add("DATA_LOADING_SYNC")
    unprod["DATA_LOADING_ASYNC"] = (st.phase_ns[2] - sync_ns) / _NS
    save_s = _ckpt_total_s(st.ckpt[0])
    unprod["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] = save_s
    unprod["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] = _ckpt_total_s(st.ckpt[1])
    unprod["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] = st.recovery_ns / _NS
    max_productive = last_step = 0
    if st.seg_num:
        fnum, ft = np.concatenate(st.seg_num), np.concatenate(st.seg_t)
        last_step = int(fnum.max())
        seg = _segment(fnum, ft, last_step, st.custom)
        productive_s, wasted_ns, startup_s = add_segment_sums(
            seg, (productive_s, wasted_ns, startup_s), custom_ns, present)
        if seg is not None:
            max_productive = seg.max_productive_step
        if st.last_je is not None:
            productive_s += int(st.last_je - ft[int(np.argmax(fnum))]) / _NS
            max_productive = last_step
        productive_s -= save_s
    unprod["PROGRAM_STARTUP"] = startup_s
    unprod["WASTED_PROGRESS_FROM_DISRUPTION"] = wasted_ns / _NS
    return _Core(
        productive_s=productive_s,
        unproductive=unprod,
        custom={types[v]: ns / _NS for v, ns in sorted(custom_ns.items())},
        max_productive_step=max_productive,
        last_step=last_step,
        disruptions=st.disruptions,
        present=frozenset(present),
    )


@dataclass(frozen=True)
class _Settled:
    """A :class:`Replay` at a settled point of a stream: ``heads`` (the keys of all
    attempts but the last) unchanged and the last attempt's first events ``last`` (time,
    kind, value, duration arrays, in the stream's numbering) equal, the stream begins
    with the same ``replay.n`` events. ``size``: the heads' events; ``head_types`` /
    ``head_wait_types``: the type numbering after the heads; ``types``/``wait_types``:
    the stream's."""

    heads: tuple
    size: int
    head_types: tuple
    head_wait_types: tuple
    types: tuple
    wait_types: tuple
    last: tuple
    replay: Replay


def _tail(chunks, vals, skip: int) -> Events:
    """The events of ``chunks`` (values ``vals``) after the first ``skip`` of the first."""
    parts = [(c.t, c.kind, v, c.dur) for c, v in zip(chunks, vals, strict=True)]
    parts[0] = tuple(a[skip:] for a in parts[0])
    t, kind, val, dur = (np.concatenate(x) for x in zip(*parts, strict=True))
    return Events(t, kind, val, dur, ())


def _resume(ck: _Settled | None, chunks, keys):
    """``(replay, events after it, heads' type numbering, numbering of the whole)`` from the
    settled replay ``ck`` when the stream of ``chunks`` begins as its did, else None."""
    m = len(ck.heads) + 1 if ck is not None else 0
    if not m or len(keys) < m or keys[:m - 1] != ck.heads or not in_order(chunks):
        return None
    types = {n: i for i, n in enumerate(ck.head_types)}
    wait_types = {n: i for i, n in enumerate(ck.head_wait_types)}
    vals = renumber(chunks[m - 1:], types, wait_types)
    if (tuple(types)[:len(ck.types)] != ck.types
            or tuple(wait_types)[:len(ck.wait_types)] != ck.wait_types):
        return None
    c, k = chunks[m - 1], ck.replay.n - ck.size
    if len(c.t) < k or not all(np.array_equal(a[:k], b) for a, b in zip(
            (c.t, c.kind, vals[0], c.dur), ck.last, strict=True)):
        return None
    return ck.replay, _tail(chunks[m - 1:], vals, k), tuple(types), tuple(wait_types)


def settled_box(memo: AccountingMemo) -> dict:
    """Where ``memo`` keeps the settled replay of :func:`resumed_core` (to be asked for in
    every round that may resume, so that it is kept while the job is polled)."""
    return cached(memo, ("mgm_settled",), dict)


def resumed_core(chunks: list, keys: tuple, memo: AccountingMemo, box: dict
                 ) -> tuple[_Core, Replay]:
    """:func:`~.mgm_calc._calculate` (not elastic) of the stream of ``chunks`` (attempts'
    events, :func:`~.mgm_events.keyed_chunks`; ``keys`` theirs), resumed from the settled
    replay kept in ``box`` (:func:`settled_box`) when the stream begins as that one's
    did, else from the start (the stream taken from ``memo``); a replay at this stream's
    settled point is kept there for the next call. Returns the result and the replay
    carried over the whole stream (its step times: ``st_keys``, ``st_ns``)."""
    got = _resume(box.get("ck"), chunks, keys)
    if got is None:
        ev = stream(chunks, keys, memo)
        st, tail, types, wait_types = Replay(), ev, ev.types, ev.wait_types
    else:
        st, tail, types, wait_types = got
    box.pop("ck", None)
    if not chunks or not in_order(chunks):
        st = advance(st, tail)
        return core(st, types), st
    # the settled point: all attempts but the last, and the last one's events up to
    # SETTLE_NS before its latest (at least where the replay is)
    size = sum(len(c.t) for c in chunks[:-1])
    c = chunks[-1]
    at = max(st.n, size + int(np.searchsorted(c.t, c.t[-1] - SETTLE_NS, side="right")))
    settled = advance(st, _cut(tail, 0, at - st.n))
    head_types: dict = {}
    head_wait_types: dict = {}
    for h in chunks[:-1]:  # (the numbering only: renumber would copy values)
        for n in h.types:
            head_types.setdefault(n, len(head_types))
        for n in h.wait_types:
            head_wait_types.setdefault(n, len(head_wait_types))
    last_val = renumber(chunks[-1:], dict(head_types), dict(head_wait_types))[0]
    k = at - size
    box["ck"] = _Settled(keys[:-1], size, tuple(head_types), tuple(head_wait_types), types,
                         wait_types, (c.t[:k], c.kind[:k], last_val[:k], c.dur[:k]), settled)
    st = advance(settled, _cut(tail, at - st.n, len(tail.t)))
    return core(st, types), st


def _cut(ev: Events, i: int, j: int) -> Events:
    return Events(ev.t[i:j], ev.kind[i:j], ev.val[i:j], ev.dur[i:j], ev.types, ev.wait_types)
