"""mgm 0.2.3's replay of its event stream (``_get_current_productive_and_unproductive_time``
and its helpers) on the arrays of :mod:`.mgm_events`: :func:`_calculate` gives the productive
time and the unproductive time per badput type of a stream (see :mod:`.mgm` for the rules and
what the results become)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .mgm_events import (
    E_CUSTOM_END,
    E_CUSTOM_START,
    E_DL_END,
    E_DL_START,
    E_JOB_END,
    E_JOB_START,
    E_PREP_END,
    E_PREP_START,
    E_REINIT_END,
    E_REINIT_START,
    E_RESTORE,
    E_SAVE,
    E_STEP,
    E_TPU_END,
    E_TPU_START,
    E_WAIT_END,
    E_WAIT_START,
    Events,
    pairs,
)
from .mgm_result import _NS, BADPUT_TYPES, ELASTIC_TYPES


@dataclass
class _Segment:
    """Result of one step segment (mgm's ``_get_segment_productive_and_unproductive_time``)."""

    productive_s: float = 0.0
    startup_s: float = 0.0
    wasted_ns: int = 0
    custom_ns: dict[int, int] = field(default_factory=dict)  # custom type index -> ns
    max_productive_step: int = 0
    counted: bool = False  # a consecutive delta counted (mgm then has its three keys)


def _contained(p: np.ndarray, c: np.ndarray, cs: np.ndarray, ce: np.ndarray):
    """Pairs (delta index, interval index) with interval ``[cs, ce]`` inside ``[p, c]``."""
    if not len(p) or not len(cs):
        z = np.zeros(0, np.intp)
        return z, z
    if (p[1:] >= p[:-1]).all():  # (as the steps are recorded: no sorted copies)
        o, ps, pc = None, p, c
    else:
        o = np.argsort(p, kind="stable")
        ps, pc = p[o], c[o]
    if np.all(pc[:-1] <= ps[1:]):  # deltas in time order, not overlapping: at most one each
        j = np.searchsorted(ps, cs, side="right") - 1
        jj = np.clip(j, 0, None)
        ok = (j >= 0) & (ce <= pc[jj]) & (cs >= ps[jj])
        return jj[ok] if o is None else o[jj[ok]], np.flatnonzero(ok)
    di, ci = [], []  # times running backwards: check every pair
    for k in range(len(cs)):
        hit = np.flatnonzero((p <= cs[k]) & (ce[k] <= c))
        di.append(hit)
        ci.append(np.full(len(hit), k))
    return np.concatenate(di), np.concatenate(ci)


def _segment(num, t, bound: int, custom) -> _Segment | None:
    """Productive time of one segment of step starts (``num``/``t`` in stream order).

    mgm 0.2.3 ``_get_segment_productive_and_unproductive_time`` with
    ``_compute_adjusted_segment_productive_and_unproductive_time`` and
    ``_compute_segment_final_metrics``:

    - ``bound == 0`` (a restart from step 0, or only step 0): nothing at all (None).
    - For each pair of consecutive step starts (previous, current) in stream order: if the
      current number is above ``bound`` the delta is wasted progress (raw, whatever the
      numbers); else it counts only if the numbers are consecutive, minus the custom
      badput intervals lying fully inside it (clamped at 0).
    - The counted delta that starts at the segment's smallest step number is the first
      step; its excess over the mean of the other counted deltas is program startup.
    - Max productive step: the previous step number of the last counted delta.
    """
    if bound == 0:
        return None
    seg = _Segment()
    if len(num) < 2:
        return seg
    pn, cn, pt, ct = num[:-1], num[1:], t[:-1], t[1:]
    raw = ct - pt
    wasted = cn > bound
    seg.wasted_ns = int(raw[wasted].sum())
    counted = ~wasted & (cn == pn + 1)
    idx = np.flatnonzero(counted)
    if not len(idx):
        return seg
    seg.counted = True
    sync = np.zeros(len(idx), np.int64)
    cs, ce, cv = custom
    di, ci = _contained(pt[idx], ct[idx], cs, ce)
    if len(di):
        dur = ce[ci] - cs[ci]
        np.add.at(sync, di, dur)
        for v in np.unique(cv[ci]):
            seg.custom_ns[int(v)] = int(dur[cv[ci] == v].sum())
    adjusted = np.maximum(raw[idx] - sync, 0)
    total_ns = int(adjusted.sum())
    first = pn[idx] == num.min()
    first_ns = int(adjusted[first].sum())  # at most one delta starts at the smallest number
    others = int((~first).sum())
    seg.max_productive_step = int(pn[idx[-1]])
    if others == 0:
        seg.productive_s = first_ns / _NS
        return seg
    mean_other_s = (total_ns - first_ns) / _NS / others
    seg.startup_s = max(0.0, first_ns / _NS - mean_other_s)
    seg.productive_s = total_ns / _NS - seg.startup_s
    return seg


def _checkpoint_total_s(ev: Events, kind: int) -> float:
    """Sum over checkpoint steps of the mean duration of that step's entries (seconds).

    mgm 0.2.3 ``CheckpointBadputCalculator.calculate_save_operation_checkpoint_manager_
    blocking_time`` / ``calculate_restore_operation_checkpoint_manager_blocking_time``:
    entries are grouped by step (and local vs ``gs://`` directory: one kind here),
    averaged per step, and the averages summed.
    """
    sel = ev.kind == kind
    if not sel.any():
        return 0.0
    _, inv = np.unique(ev.val[sel], return_inverse=True)
    sums = np.bincount(inv, weights=ev.dur[sel] / _NS)
    counts = np.bincount(inv)
    return float((sums / counts).sum())


@dataclass
class _Core:
    productive_s: float
    unproductive: dict[str, float]
    custom: dict[str, float]
    max_productive_step: int
    last_step: int
    disruptions: int
    #: the badput names mgm's own dict would hold (``get_job_goodput_details``), OTHER
    #: excepted, CUSTOM_BADPUT_EVENTS included
    present: frozenset = frozenset()


def _overlap_ns(a_s, a_e, b_s, b_e) -> int:
    """Sum over every pair (interval of a, interval of b) of their positive overlap (ns)."""
    total = 0
    for s0, e0 in zip(a_s.tolist(), a_e.tolist(), strict=True):
        for s1, e1 in zip(b_s.tolist(), b_e.tolist(), strict=True):
            total += max(0, min(e0, e1) - max(s0, s1))
    return total


def _elastic(ev: Events, unprod: dict[str, float], present: set) -> None:
    """mgm 0.2.3 ``ElasticGoodputCalculator._get_current_productive_and_unproductive_time``
    on top of the base rules: each elastic wait (paired per event type, kept if start <
    end) is ELASTIC_SCALE_UP when its type contains ``scale_up`` (any case), else
    ELASTIC_SLICE_DOWN; each reinitialisation pair (start < end) is ELASTIC_REINITIALIZATION;
    with any reinitialisation, TPU_INITIALIZATION and TRAINING_PREP lose their overlap with
    the reinitialisation intervals (at least 0)."""
    ws, we, wv, _ = pairs(ev, E_WAIT_START, E_WAIT_END, by_val=True)
    for s, e, v in zip(ws.tolist(), we.tolist(), wv.tolist(), strict=True):
        if s < e:
            name = ("ELASTIC_SCALE_UP" if "scale_up" in ev.wait_types[v].lower()
                    else "ELASTIC_SLICE_DOWN")
            unprod[name] += (e - s) / _NS
            present.add(name)
    rs, re_, _, _ = pairs(ev, E_REINIT_START, E_REINIT_END)
    keep = rs < re_
    rs, re_ = rs[keep], re_[keep]
    if not len(rs):
        return
    unprod["ELASTIC_REINITIALIZATION"] += int((re_ - rs).sum()) / _NS
    present.add("ELASTIC_REINITIALIZATION")
    for name, (k0, k1) in (("TPU_INITIALIZATION", (E_TPU_START, E_TPU_END)),
                           ("TRAINING_PREP", (E_PREP_START, E_PREP_END))):
        s, e, _, _ = pairs(ev, k0, k1)
        ok = s < e
        overlap = _overlap_ns(s[ok], e[ok], rs, re_)
        if overlap > 0:
            unprod[name] = max(0.0, unprod[name] - overlap / _NS)


def add_segment_sums(seg: _Segment | None, sums: tuple, custom_ns: dict,
                     present: set) -> tuple[float, int, float]:
    """``sums`` = (productive s, wasted ns, startup s) with the segment ``seg`` added (as
    mgm's replay adds each stretch between repeats; None: nothing to add). Its custom badput
    (ns by type index) is added to ``custom_ns`` and the badput names it makes present to
    ``present``."""
    if seg is None:
        return sums
    present.add("WASTED_PROGRESS_FROM_DISRUPTION")
    if seg.counted:
        present.update(("CUSTOM_BADPUT_EVENTS", "PROGRAM_STARTUP"))
    for v, ns in seg.custom_ns.items():
        custom_ns[v] = custom_ns.get(v, 0) + ns
    productive_s, wasted_ns, startup_s = sums
    return (productive_s + seg.productive_s, wasted_ns + seg.wasted_ns,
            startup_s + seg.startup_s)


def _calculate(ev: Events, elastic: bool = False) -> _Core:
    """mgm 0.2.3 ``_get_current_productive_and_unproductive_time`` on the event stream.

    Rules (seconds; all from that function and its helpers unless named):

    - Step starts form segments; a step number already in the current segment is a
      *disruption* (counted): the segment ends and is accounted with the repeated number
      as bound (:func:`_segment`); the new segment starts with the repeated step.
    - At each disruption, INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION += latest job start
      before it - start of the step recorded just before it, when positive.
    - TPU_INITIALIZATION, TRAINING_PREP: sums of the start/end pairs (:func:`pairs`).
    - Data loading pairs: DATA_LOADING_SYNC is the first pair after the job start and
      after each disruption, plus at each disruption the last pair completed since the
      previous one (so one data loading can count twice); DATA_LOADING_ASYNC is all
      data loading minus SYNC (negative values are sanitised later).
    - Checkpoints (``CheckpointBadputCalculator``): :func:`_checkpoint_total_s`.
    - The last segment is bounded by its largest step number; the last step counts as
      productive only with a ``job_end_time`` (the latest one of the stream, whichever
      attempt wrote it), from its start to that end; max productive step is then the
      last step.
    - Blocking checkpoint save time is subtracted from productive time (only when there
      are steps at all).
    - Last recorded step: the largest step number of the last segment (0 without steps).
    - ``elastic``: the rules of mgm's ``ElasticGoodputCalculator`` on top (:func:`_elastic`).
    """
    unprod = dict.fromkeys(BADPUT_TYPES + (ELASTIC_TYPES if elastic else ()), 0.0)
    del unprod["OTHER"]
    custom_ns: dict[int, int] = {}
    present = {"TPU_INITIALIZATION", "TRAINING_PREP", "DATA_LOADING_ASYNC",
               "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"}

    step_pos = np.flatnonzero(ev.kind == E_STEP)
    num, st = ev.val[step_pos], ev.t[step_pos]
    # Segments end where a step number repeats (a restart): the dict of step starts is
    # reset to the repeated step.
    cuts = _repeats(num)  # index into the step arrays of each repeated step
    cs, ce, cv, _ = pairs(ev, E_CUSTOM_START, E_CUSTOM_END, by_val=True)
    keep = cs < ce  # mgm keeps a custom interval only if start < end
    custom = (cs[keep], ce[keep], cv[keep])

    productive_s = 0.0
    wasted_ns = 0
    startup_s = 0.0

    def add_segment(seg: _Segment | None):
        nonlocal productive_s, wasted_ns, startup_s
        productive_s, wasted_ns, startup_s = add_segment_sums(
            seg, (productive_s, wasted_ns, startup_s), custom_ns, present)

    # Infrastructure recovery at each repeat: the latest job start before it minus the
    # start of the step recorded just before it, if later.
    js_pos = np.flatnonzero(ev.kind == E_JOB_START)
    recovery_ns = 0
    begin = 0
    for i in cuts:
        add_segment(_segment(num[begin:i], st[begin:i], int(num[i]), custom))
        k = np.searchsorted(js_pos, step_pos[i], side="left") - 1
        if k >= 0 and ev.t[js_pos[k]] > st[i - 1]:
            recovery_ns += int(ev.t[js_pos[k]] - st[i - 1])
            present.add("INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION")
        begin = i

    # Phases. DATA_LOADING_SYNC: the first data loading after the start and after each
    # repeat, plus, at each repeat, the last data loading completed since the previous
    # repeat (it may be the same one twice); the rest is DATA_LOADING_ASYNC.
    for name, (k0, k1) in (("TPU_INITIALIZATION", (E_TPU_START, E_TPU_END)),
                           ("TRAINING_PREP", (E_PREP_START, E_PREP_END))):
        s, e, _, _ = pairs(ev, k0, k1)
        unprod[name] = int((e - s).sum()) / _NS
    ds, de, _, dpos = pairs(ev, E_DL_START, E_DL_END)
    dl = np.subtract(de, ds, out=de)
    del ds
    sync_ns = _sync_data_loading_ns(dpos, dl, step_pos[cuts])
    unprod["DATA_LOADING_SYNC"] = sync_ns / _NS
    if len(dl):
        present.add("DATA_LOADING_SYNC")
    unprod["DATA_LOADING_ASYNC"] = (int(dl.sum()) - sync_ns) / _NS
    save_s = _checkpoint_total_s(ev, E_SAVE)
    unprod["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] = save_s
    unprod["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] = _checkpoint_total_s(ev, E_RESTORE)
    unprod["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] = recovery_ns / _NS

    max_productive = last_step = 0
    if len(num):
        # The last segment runs to its largest step number; its last step counts only
        # if the job has an end (the latest job_end_time of the stream), up to that end.
        fnum, ft = num[begin:], st[begin:]
        last_step = int(fnum.max())
        seg = _segment(fnum, ft, last_step, custom)
        add_segment(seg)
        if seg is not None:
            max_productive = seg.max_productive_step
        je = ev.t[ev.kind == E_JOB_END]
        if len(je):
            productive_s += int(je[-1] - ft[int(np.argmax(fnum))]) / _NS
            max_productive = last_step
        # Blocking checkpoint save time is taken out of productive time (only when there
        # are steps: mgm returns early otherwise).
        productive_s -= save_s
    unprod["PROGRAM_STARTUP"] = startup_s
    unprod["WASTED_PROGRESS_FROM_DISRUPTION"] = wasted_ns / _NS
    if elastic:
        _elastic(ev, unprod, present)
    return _Core(
        productive_s=productive_s,
        unproductive=unprod,
        custom={ev.types[v]: ns / _NS for v, ns in sorted(custom_ns.items())},
        max_productive_step=max_productive,
        last_step=last_step,
        disruptions=len(cuts),
        present=frozenset(present),
    )


def _repeats(num: np.ndarray) -> list[int]:
    """Indices of the steps that repeat a number of their segment: a segment runs from the
    start (or a repeat) up to the next step whose number it already holds."""
    if len(num) < 2:
        return []
    # the previous occurrence of each number: a repeat is one within the current segment
    order = np.argsort(num, kind="stable")
    same = num[order[1:]] == num[order[:-1]]
    later, prev = order[1:][same], order[:-1][same]
    o = np.argsort(later)
    cuts: list[int] = []
    begin = 0
    for i, j in zip(later[o].tolist(), prev[o].tolist(), strict=True):
        if j >= begin:
            cuts.append(i)
            begin = i
    return cuts


def _sync_data_loading_ns(pos: np.ndarray, dur: np.ndarray, repeats: np.ndarray) -> int:
    """DATA_LOADING_SYNC (ns) of :func:`_calculate`: data loadings at stream positions
    ``pos`` lasting ``dur`` ns, cut into runs by the repeated steps at positions ``repeats``
    (increasing; a data loading at a repeat's position comes before it): the first data
    loading of every run, plus the last one of every run a repeat closes."""
    if not len(pos):
        return 0
    if not (pos[1:] >= pos[:-1]).all():  # (pairs gives them in stream order)
        order = np.argsort(pos, kind="stable")
        pos, dur = pos[order], dur[order]
    run = np.searchsorted(repeats, pos, side="left")
    first = np.ones(len(run), bool)
    first[1:] = run[1:] != run[:-1]
    last = np.ones(len(run), bool)
    last[:-1] = run[1:] != run[:-1]
    closed = last & (run < len(repeats))
    return int(dur[first].sum()) + int(dur[closed].sum())
