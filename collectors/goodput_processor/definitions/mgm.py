"""ml-goodput-measurement 0.2.3 definitions on our timeline (``--definitions mgm``).

Users who migrate from Google's ``ml-goodput-measurement`` (mgm) can ask for its numbers
on the same spans: :func:`account_mgm` turns one job's spans into the event stream mgm's
recorder would have written to Cloud Logging and applies the semantics of mgm 0.2.3's
``GoodputCalculator`` (``ml_goodput_measurement/src/goodput.py``), quirks included, with
its own code (integer nanoseconds and numpy, no mgm import). Every rule below names the
mgm function it reproduces.

**From spans to mgm events** (each attempt on its primary process, as in
``docs/accounting.md``; the stream is built in :mod:`.mgm_events`):

==============================================  ============================================
span / attempt                                  mgm log entry
==============================================  ============================================
attempt start                                   ``job_start_time``
attempt end, unless ``killed``/``running``/      ``job_end_time`` (a job_end marker of any
``restart``                                     other reason: explicit, exit, ...; a
                                                ``restart`` end is the recorder's own
                                                close at a second ``job_start``, which mgm
                                                never logs)
``goodput.step`` start (with ``goodput.step``)  ``step_start_time`` + ``step_count``
``goodput.accelerator_init``                    ``tpu_init_start_time`` / ``..._end_time``
``goodput.training_prep``                       ``training_prep_start_time`` / ``..._end_time``
``goodput.data_loading``                        ``data_loading_start_time`` / ``..._end_time``
``goodput.custom_badput``                       ``custom_badput_event_start_time`` /
                                                ``..._end_time`` with its type (``unknown``,
                                                mgm's default, when the span has none)
``goodput.checkpoint_save`` (blocking)          Orbax save statistics: ``step`` = checkpoint
                                                step, checkpoint-manager blocking duration =
                                                span length, at the span start
``goodput.checkpoint_restore`` (blocking)       Orbax restore statistics: duration = span
                                                length, at the span start
``goodput.elastic_wait``                        ``elastic_wait_start_time`` / ``..._end_time``
                                                with its ``elastic_wait_event_type``
``goodput.elastic_reinit``                      ``elastic_reinit_start_time`` / ``..._end_time``
``goodput.elastic_slices``                      ``elastic_slice_counts_timestamp`` (slice
                                                counts, read apart for slice efficiency)
==============================================  ============================================

A phase whose end is inferred (``F_ENDLESS``: in flight when its process died, or at
``--at``) contributes its start only, and a checkpoint save or restore in flight none (Orbax
logs its statistics when done). Jobs with elastic spans follow mgm's
``ElasticGoodputCalculator`` (``elastic=None``, the default of :func:`account_mgm`).

Non-blocking spans (``goodput.blocking = false``), ``goodput.program_startup`` spans,
heartbeats and step spans without a step number are not mgm events (mgm derives program
startup from the first step). Our spans carry no checkpoint directory: every save and
restore is treated as one kind (mgm keeps ``local`` and ``gs://`` apart). Events are ordered
by time; at equal times in the order the recorder writes them: job start, ends of spans,
step starts, starts of spans (and checkpoint statistics), ends of zero-length spans, job end.

**Differences from mgm that are not about the timeline:**

- *now*: mgm measures a job without a ``job_end_time`` up to the wall-clock time of the
  query; we use ``now_ns``, by default the end of the job's last attempt (the timeline's
  end), so that a finished-but-killed job gives a stable number.
- Times are exact integer ns here; mgm uses float epoch seconds (~0.2 µs resolution) and
  microsecond datetimes for the total time, so results agree to about 1e-6 s.
- ``step_deviation_s`` of an interval result is computed on the interval's step events
  (mgm's ``get_job_goodput_interval`` computes no step deviation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..elastic import slice_efficiency
from ..memo import AccountingMemo, cached
from ..timeline import (
    JobSpans,
)
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
    keyed_events,
    pairs,
)

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["BADPUT_TYPES", "ELASTIC_TYPES", "MGM_VERSION", "MgmResult", "account_mgm",
           "account_mgm_windows",
           "compute_ideal_step_time", "render_mgm"]

#: The ml-goodput-measurement release whose definitions this module reproduces.
MGM_VERSION = "0.2.3"
#: mgm's ``BadputType`` names, in enum order, that :attr:`MgmResult.badput_s` holds
#: (``CUSTOM_BADPUT_EVENTS`` is per type in :attr:`MgmResult.custom_badput_s`).
BADPUT_TYPES = (
    "TPU_INITIALIZATION",
    "TRAINING_PREP",
    "PROGRAM_STARTUP",
    "DATA_LOADING_SYNC",
    "DATA_LOADING_ASYNC",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "OTHER",
)
#: The badput types of mgm's ``ElasticGoodputCalculator`` (``goodput_elastic.py``), in the
#: order its breakdown adds them; in :attr:`MgmResult.badput_s` for elastic results only.
ELASTIC_TYPES = ("ELASTIC_SLICE_DOWN", "ELASTIC_SCALE_UP", "ELASTIC_REINITIALIZATION")
#: Key order of mgm's ``_get_job_badput_breakdown`` (percentages).
_BREAKDOWN_ORDER = (
    "TPU_INITIALIZATION",
    "TRAINING_PREP",
    "DATA_LOADING_SYNC",
    "DATA_LOADING_ASYNC",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "PROGRAM_STARTUP",
    "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "CUSTOM_BADPUT_EVENTS",
    "OTHER",
)

_NS = 1_000_000_000
_EPS_S = 1e-9

@dataclass(frozen=True)
class MgmResult:
    """mgm 0.2.3's answer for one job (or one interval of it).

    Durations are float seconds; ``goodput`` is a fraction in [0, 1] (mgm reports percent:
    :attr:`goodput_percent`). ``badput_s`` holds every name of :data:`BADPUT_TYPES` after
    mgm's sanitising (a value < 0 or > total becomes 0), ``OTHER`` included;
    ``DATA_LOADING_ASYNC`` is reported but is not badput (it is left out of ``OTHER``).
    ``custom_badput_s``: seconds per upper-cased custom badput type. ``badput_percent``:
    mgm's breakdown (``_get_job_badput_breakdown``): percent of the total per name, with
    ``CUSTOM_BADPUT_EVENTS`` a nested ``{type: percent}``; a value is 0 unless
    ``0 < seconds < total``. ``max_productive_step``/``last_recorded_step`` as mgm (0 when
    there are no steps); ``disruptions``: number of repeated step numbers.
    ``ideal_step_time_s``: given, or mgm's ``compute_ideal_step_time`` (None when every
    step time is under 1 s or there is no step time); ``step_deviation_s``: step number ->
    ``|step time - ideal|`` in seconds (empty without an ideal step time). ``interval``:
    None for the whole job, else the effective ``(start_ns, end_ns)`` (ns since the epoch)
    the interval total was measured over.

    Elastic results (mgm's ``ElasticGoodputCalculator``; ``elastic``) also hold
    :data:`ELASTIC_TYPES` in ``badput_s`` and, after ``OTHER``, in ``badput_percent``.
    ``badput_keys``: the names mgm's own dict of seconds holds (its
    ``get_job_goodput_details()["badput_time"]``: a bucket that never came up is not a
    key there), ``OTHER`` and ``CUSTOM_BADPUT_EVENTS`` included. ``slice_efficiency``:
    ``(stepping, available)`` fractions (mgm's ``stepping_slice_efficiency`` and
    ``available_slice_efficiency``; None without slice-count records or for non-elastic
    results). ``excluded_time_s``: mgm's ``total_excluded_time`` of an exclusion query
    (:func:`~.mgm_exclusion.account_mgm_excluding`; 0 otherwise).
    """

    job: str
    total_time_s: float
    productive_time_s: float
    goodput: float
    badput_s: dict[str, float]
    custom_badput_s: dict[str, float]
    badput_percent: dict[str, float | dict[str, float]]
    max_productive_step: int
    last_recorded_step: int
    disruptions: int
    ideal_step_time_s: float | None
    step_deviation_s: dict[int, float]
    interval: tuple[int, int] | None = None
    elastic: bool = False
    badput_keys: tuple[str, ...] = ()
    slice_efficiency: tuple[float, float] | None = None
    excluded_time_s: float = 0.0

    @property
    def goodput_percent(self) -> float:
        """Goodput in percent (0..100), the unit mgm's ``get_job_goodput`` returns."""
        return self.goodput * 100

    def to_json_dict(self) -> dict:
        """A JSON-ready dict (step numbers of ``step_deviation_s`` become strings)."""
        return {
            "definitions": f"ml-goodput-measurement {MGM_VERSION}",
            "job": self.job,
            "interval": None if self.interval is None else {
                "start_unix_ns": self.interval[0], "end_unix_ns": self.interval[1]},
            "total_time_s": self.total_time_s,
            "productive_time_s": self.productive_time_s,
            "goodput": self.goodput,
            "goodput_percent": self.goodput_percent,
            "badput_s": dict(self.badput_s),
            "custom_badput_s": dict(self.custom_badput_s),
            "badput_percent": {k: dict(v) if isinstance(v, dict) else v
                               for k, v in self.badput_percent.items()},
            "max_productive_step": self.max_productive_step,
            "last_recorded_step": self.last_recorded_step,
            "disruptions": self.disruptions,
            "ideal_step_time_s": self.ideal_step_time_s,
            "step_deviation_s": dict(zip(map(str, self.step_deviation_s),
                                         self.step_deviation_s.values(), strict=True)),
            "elastic": self.elastic,
            "slice_efficiency": None if self.slice_efficiency is None else {
                "stepping": self.slice_efficiency[0],
                "available": self.slice_efficiency[1]},
            "excluded_time_s": self.excluded_time_s,
        }


# --- mgm's calculator ------------------------------------------------------------------


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
    o = np.argsort(p, kind="stable")
    ps, pc = p[o], c[o]
    if np.all(pc[:-1] <= ps[1:]):  # deltas in time order, not overlapping: at most one each
        j = np.searchsorted(ps, cs, side="right") - 1
        jj = np.clip(j, 0, None)
        ok = (j >= 0) & (ce <= pc[jj]) & (cs >= ps[jj])
        return o[jj[ok]], np.flatnonzero(ok)
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
        if seg is None:
            return
        present.add("WASTED_PROGRESS_FROM_DISRUPTION")
        if seg.counted:
            present.update(("CUSTOM_BADPUT_EVENTS", "PROGRAM_STARTUP"))
        productive_s += seg.productive_s
        wasted_ns += seg.wasted_ns
        startup_s += seg.startup_s
        for v, ns in seg.custom_ns.items():
            custom_ns[v] = custom_ns.get(v, 0) + ns

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
    dl = de - ds
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
    order = np.argsort(pos, kind="stable")
    run = np.searchsorted(repeats, pos[order], side="left")
    dur = dur[order]
    first = np.ones(len(run), bool)
    first[1:] = run[1:] != run[:-1]
    last = np.ones(len(run), bool)
    last[:-1] = run[1:] != run[:-1]
    closed = last & (run < len(repeats))
    return int(dur[first].sum()) + int(dur[closed].sum())


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


def _finish(job: str, ev: Events, total_ns: int, ideal_step_time_s, interval,
            elastic: bool = False, slices=None, memo=None, key=None) -> MgmResult:
    """Validity checks, sanitising, OTHER and percentages as mgm 0.2.3 ``get_job_goodput``
    / ``_compute_job_goodput_interval_metrics`` do (``elastic``: with the rules and the
    breakdown of ``ElasticGoodputCalculator``; ``slices``: its slice efficiencies).
    ``memo``: the replay of ``ev`` and its step deviation kept under ``key``, what ``ev``
    depends on."""
    if total_ns == 0:
        raise ValueError(f"job {job!r}: total job time is zero, mgm cannot compute goodput")
    total = total_ns / _NS
    core = cached(memo, ("mgm_core", key, elastic), lambda: _calculate(ev, elastic))
    # Our inputs are integer ns: a difference under 1 ns is float rounding of an equality
    # (mgm's own float noise may go either way there; we take it as equal).
    if core.productive_s < -_EPS_S or core.productive_s > total + _EPS_S:
        raise ValueError(
            f"job {job!r}: mgm's productive training time {core.productive_s:.6f} s is not "
            f"within the total {total:.6f} s (mgm: 'Productive training time is invalid')")
    # _sanitize_unproductive_times: values < 0 or > total are set to 0.
    unprod = {k: v if 0.0 <= v <= total else 0.0 for k, v in core.unproductive.items()}
    custom = {k: v if 0.0 <= v <= total else 0.0 for k, v in core.custom.items()}
    # _compute_other_unproductive_time: everything but DATA_LOADING_ASYNC is badput.
    known = sum(v for k, v in unprod.items() if k != "DATA_LOADING_ASYNC") + sum(
        custom.values())
    unprod["OTHER"] = max(0.0, total - core.productive_s - known)
    badput_s = {k: unprod[k] for k in BADPUT_TYPES + (ELASTIC_TYPES if elastic else ())}

    def pct(v: float) -> float:  # _get_job_badput_breakdown: 0 unless 0 < v < total
        return v / total * 100 if 0 < v < total else 0.0

    percent: dict[str, float | dict[str, float]] = {}
    for name in _BREAKDOWN_ORDER + (ELASTIC_TYPES if elastic else ()):
        percent[name] = ({k: pct(v) for k, v in custom.items()}
                         if name == "CUSTOM_BADPUT_EVENTS" else pct(badput_s[name]))
    ideal, deviation = cached(memo, ("mgm_deviation", key, ideal_step_time_s),
                              lambda: _deviation(ev, ideal_step_time_s))
    return MgmResult(
        job=job,
        total_time_s=total,
        productive_time_s=core.productive_s,
        goodput=core.productive_s / total,
        badput_s=badput_s,
        custom_badput_s=custom,
        badput_percent=percent,
        max_productive_step=core.max_productive_step,
        last_recorded_step=core.last_step,
        disruptions=core.disruptions,
        ideal_step_time_s=None if ideal is None else float(ideal),
        step_deviation_s=deviation,
        interval=interval,
        elastic=elastic,
        badput_keys=tuple(k for k in BADPUT_TYPES[:-1] + ("CUSTOM_BADPUT_EVENTS",)
                          + (ELASTIC_TYPES if elastic else ()) if k in core.present)
        + ("OTHER",),
        slice_efficiency=slices,
    )


def account_mgm(
    job: JobSpans,
    *,
    interval_ns: tuple[int, int] | None = None,
    now_ns: int | None = None,
    ideal_step_time_s: float | None = None,
    elastic: bool | None = None,
    memo: AccountingMemo | None = None,
) -> MgmResult:
    """What ml-goodput-measurement 0.2.3's ``GoodputCalculator`` returns for ``job``.

    Whole job (``get_job_goodput`` + ``get_step_deviation``): total time from the first
    ``job_start_time`` to the last ``job_end_time`` of the stream, or to *now* when there is
    none (``_get_total_job_time``). Interval (``get_job_goodput_interval``): only events
    with time in ``(start, end]``; total = ``min(end, last event time) - max(start, first
    event time)`` (``_get_total_job_time_from_interval``); the same rules on that subset.

    Args:
        job: one job's spans (``read_run_dir(path).jobs[name]``).
        interval_ns: ``(start, end)`` in ns since the epoch, or None for the whole job.
        now_ns: *now* in ns since the epoch, for a running last attempt
            (:func:`~goodput_processor.timeline.build_attempts`) and as the end of a job
            without ``job_end_time``; default: the end of the last attempt (mgm uses the
            wall-clock time of the query).
        ideal_step_time_s: mgm's ``configured_ideal_step_time`` in seconds; None: mgm's
            :func:`compute_ideal_step_time` of the step times.
        elastic: answer as mgm's ``ElasticGoodputCalculator`` (``goodput_elastic.py``:
            elastic wait and reinitialisation badput, slice efficiency) or as its base
            ``GoodputCalculator``, which leaves elastic entries out (their time is OTHER);
            None (default): elastic when the job has elastic spans or slice counts.
        memo: results of earlier calls on the same job, whose rows have only grown at the
            end since (:mod:`goodput_processor.memo`; a live job's, read by a spool tailer
            or ``goodput serve``): each attempt's events, the event stream, mgm's replay of
            it and the step deviation are taken from it when what they depend on is
            unchanged, so a call with nothing new only recomputes what depends on *now*.
            The result equals the one without a memo. Results share what the memo keeps
            (``step_deviation_s``): treat them as read-only. The call ends the memo's
            round (:meth:`~goodput_processor.memo.AccountingMemo.end_round`).

    Returns:
        An :class:`MgmResult`. Its ``slice_efficiency`` is mgm's for ``get_job_goodput_
        details`` (the whole job: from the first job start over the total time) or
        ``get_interval_metric_details`` (an interval: records within it, over the
        requested interval).

    Raises:
        ValueError: ``ideal_step_time_s`` is not a finite number > 0; the job has no
            attempt or its total time is zero; mgm's productive time is < 0 or above the
            total (mgm raises "Productive training time is invalid", e.g. when a clean end of
            an earlier attempt is the job's last ``job_end_time`` but later attempts ran
            on); for an interval: ``start >= end``, no event in ``(start, end]``, or the
            effective interval is empty.
    """
    if ideal_step_time_s is not None and not (
        math.isfinite(ideal_step_time_s) and ideal_step_time_s > 0
    ):
        raise ValueError(f"ideal step time must be a finite number > 0, got {ideal_step_time_s}")
    if memo is None:
        return _account(job, interval_ns, now_ns, ideal_step_time_s, elastic, None)
    try:
        return _account(job, interval_ns, now_ns, ideal_step_time_s, elastic, memo)
    finally:
        memo.end_round()


def account_mgm_windows(job: JobSpans, windows, *, ideal_step_time_s: float | None = None,
                        memo: AccountingMemo | None = None):
    """The whole job and each interval of ``windows`` (``(start_ns, end_ns)`` pairs) by
    :func:`account_mgm`, in one round of ``memo`` (what the calls share is computed once,
    and a later call with nothing new finds each of them).

    Returns:
        ``(whole job result, [interval result, or None where mgm refuses the interval]``).

    Raises:
        ValueError: as :func:`account_mgm` for the whole job.
    """
    one = None if memo is None else _Round(memo)
    try:
        whole = account_mgm(job, ideal_step_time_s=ideal_step_time_s, memo=one)
        parts = []
        for w in windows:
            try:
                parts.append(account_mgm(job, interval_ns=w, memo=one))
            except ValueError:
                parts.append(None)
        return whole, parts
    finally:
        if memo is not None:
            memo.end_round()


class _Round:
    """An :class:`AccountingMemo` for calls within one round: their ends of round are left
    out (the caller ends it)."""

    def __init__(self, memo: AccountingMemo) -> None:
        self.get = memo.get

    def end_round(self) -> None:
        pass


def _elastic_kinds(ev: Events) -> bool:
    return bool(np.isin(ev.kind, (E_WAIT_START, E_WAIT_END, E_REINIT_START,
                                  E_REINIT_END)).any())


def _job_bounds(ev: Events) -> tuple[int | None, int | None]:
    """The first job start and the last job end of ``ev`` (ns; None when there is none)."""
    js = ev.t[ev.kind == E_JOB_START]
    je = ev.t[ev.kind == E_JOB_END]
    return (int(js[0]) if len(js) else None), (int(je[-1]) if len(je) else None)


def _account(job: JobSpans, interval_ns, now_ns, ideal_step_time_s, elastic,
             memo: AccountingMemo | None) -> MgmResult:
    """:func:`account_mgm` (its arguments checked; ``memo``'s round not ended). With a memo,
    what depends only on the event stream is kept under the stream's key (an interval's
    events are a slice of the stream, which is in time order)."""
    ev, last_end, slices, key = keyed_events(job, now_ns, memo)
    if elastic is None:
        elastic = bool(len(slices)) or cached(memo, ("mgm_elastic", key),
                                              lambda: _elastic_kinds(ev))
    if interval_ns is None:
        first, last = cached(memo, ("mgm_bounds", key), lambda: _job_bounds(ev))
        if first is None:
            raise ValueError(f"job {job.name!r} has no spans: mgm cannot compute goodput")
        if last is not None:
            end = last
        else:
            end = int(now_ns) if now_ns is not None else int(last_end)
        eff = None
        if elastic:
            e = slice_efficiency(slices, first, end, mgm=True)
            eff = None if e is None else (e.stepping, e.available)
        return _finish(job.name, ev, end - first, ideal_step_time_s, None, elastic, eff,
                       memo, key)

    start, end = (int(x) for x in interval_ns)
    if start >= end:
        raise ValueError(f"interval start {start} ns is not before its end {end} ns")
    # the stream is in time order: the events in (start, end] are a slice of it
    i, j = (int(x) for x in np.searchsorted(ev.t, (start, end), side="right"))
    sub = Events(ev.t[i:j], ev.kind[i:j], ev.val[i:j], ev.dur[i:j], ev.types, ev.wait_types)
    if not len(sub.t):
        raise ValueError(
            f"job {job.name!r}: no mgm events within the interval ({start}, {end}] ns")
    lo, hi = max(start, int(sub.t[0])), min(end, int(sub.t[-1]))
    if lo >= hi:
        raise ValueError(
            f"job {job.name!r}: the events within the interval ({start}, {end}] ns span no "
            "time (mgm: 'Start time is on or after end time')")
    eff = None
    if elastic:
        inside = slices[(slices[:, 0] > start) & (slices[:, 0] <= end)]
        e = slice_efficiency(inside, start, end, mgm=True)
        eff = None if e is None else (e.stepping, e.available)
    return _finish(job.name, sub, hi - lo, ideal_step_time_s, (lo, hi), elastic, eff, memo,
                   (key, i, j))


# --- table ---------------------------------------------------------------------------


def render_mgm(results, console: Console | None = None) -> None:
    """Print each :class:`MgmResult` as a table (in the style of ``report.render_table``)
    to ``console`` (a ``rich.console.Console``; default stdout); see :mod:`.mgm_render`."""
    from .mgm_render import render

    render(results, console)
