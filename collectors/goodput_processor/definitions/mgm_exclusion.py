"""ml-goodput-measurement 0.2.3's goodput with exclusion intervals (``--definitions mgm
--exclude START,END``).

mgm's ``GoodputCalculator.get_job_goodput_with_exclusions`` (``goodput_exclusion.py``,
``GoodputExclusion._get_exclusion_adjusted_metrics`` and ``_process_segment_with_
exclusions``) is not its ``get_job_goodput`` with time taken out: it is a second, separate
walk over the log with rules of its own. :func:`account_mgm_excluding` applies them to the
same event stream as :func:`~.mgm.account_mgm`, quirks included:

- every time difference it measures (each step delta, each phase pair, each infrastructure
  recovery, the last step up to the job end) loses its overlap with the exclusion
  intervals (merged first, ``exclusion_utils.normalize_intervals``), and that overlap is
  added to the *excluded time*, even where two measured differences overlap each other;
  the total is the job's total time minus that excluded time, not minus the intervals;
- custom badput inside a step counts by its overlap with the step delta (not only when it
  lies fully inside, as in ``get_job_goodput``); a step delta loses its custom badput and
  its excluded time (at least 0);
- program startup is the first step's excess over the mean of the segment's other counted
  deltas (the first step's own time when there is none);
- the data loading counted as synchronous is the first one after the start and after each
  repeated step number (without ``get_job_goodput``'s extra one at each repeat);
- checkpoint save and restore time is not computed (and not taken out of productive time);
  there is no "productive time is invalid" check, and a total of 0 gives goodput 0 with an
  empty breakdown;
- the max productive step is the largest over the segments (not only the last one);
- step deviations are signed (step time - ideal step time), over the adjusted step times.

Times are integer ns here (mgm: float seconds); results agree to about 1e-6 s.
"""

from __future__ import annotations

import math

from ..read.rows import JobSpans
from .mgm_events import (
    E_CUSTOM_END,
    E_CUSTOM_START,
    E_DL_END,
    E_DL_START,
    E_JOB_END,
    E_JOB_START,
    E_PREP_END,
    E_PREP_START,
    E_STEP,
    E_TPU_END,
    E_TPU_START,
    events,
    pairs,
)
from .mgm_result import (
    _BREAKDOWN_ORDER,
    _NS,
    BADPUT_TYPES,
    ELASTIC_TYPES,
    MgmResult,
)
from .mgm_steps import compute_ideal_step_time

__all__ = ["account_mgm_excluding", "normalize_exclusions"]


def normalize_exclusions(intervals_ns) -> list[tuple[int, int]]:
    """mgm's ``exclusion_utils.normalize_intervals`` on ns pairs: pairs whose start is not
    before their end are dropped (mgm logs a warning and skips them), the rest sorted and
    merged where they overlap or touch."""
    valid = sorted((int(a), int(b)) for a, b in intervals_ns if int(a) < int(b))
    out: list[list[int]] = []
    for a, b in valid:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(start: int, end: int, exclusions) -> int:
    """``exclusion_utils.get_exclusion_overlap``: total overlap of [start, end] with them."""
    total = 0
    for a, b in exclusions:
        lo, hi = max(start, a), min(end, b)
        if lo < hi:
            total += hi - lo
    return total


def _segment(items, bound: int, custom, excl):
    """``_process_segment_with_exclusions`` -> (productive ns, {name: ns | {type: ns}},
    max productive step, excluded ns, {step: adjusted ns})."""
    min_step = min(n for n, _ in items)
    total = first = wasted = excluded = 0
    breakdown: dict[str, int] = {}
    times: dict[int, int] = {}
    counted = max_step = 0
    for (pn, pt), (cn, ct) in zip(items, items[1:]):  # noqa: B905 - pairs of neighbours
        raw = ct - pt
        ex = _overlap(pt, ct, excl)
        excluded += ex
        if cn <= bound:
            if cn - 1 != pn:
                continue
            sync = 0
            for s, e, typ in custom:
                ov = _overlap(pt, ct, [(s, e)])
                sync += ov
                breakdown[typ] = breakdown.get(typ, 0) + ov
            adj = max(0, raw - sync - ex)
            total += adj
            times[pn] = adj
            if pn == min_step:
                first = adj
            counted += 1
            max_step = pn
        else:
            wasted += max(0, raw - ex)
    if not counted:
        return 0, {"WASTED_PROGRESS_FROM_DISRUPTION": wasted}, 0, excluded, {}
    others = sum(t for n, t in times.items() if n != min_step)
    avg = others / (counted - 1) if counted > 1 else first
    startup = max(0.0, first - avg)
    if min_step in times:
        times[min_step] = min(first, avg)
    unprod = {"PROGRAM_STARTUP": startup, "WASTED_PROGRESS_FROM_DISRUPTION": wasted,
              "CUSTOM_BADPUT_EVENTS": breakdown}
    return total - startup, unprod, max_step, excluded, times


def _accumulate(seg: dict, total: dict) -> None:
    """``_accumulate_unproductive_time``: add a segment's values (custom types nested)."""
    for k, v in seg.items():
        if isinstance(v, dict):
            into = total.setdefault(k, {})
            for t, x in v.items():
                into[t] = into.get(t, 0) + x
        else:
            total[k] = total.get(k, 0) + v


def account_mgm_excluding(
    job: JobSpans,
    exclusions_ns,
    *,
    now_ns: int | None = None,
    ideal_step_time_s: float | None = None,
    elastic: bool = False,
) -> MgmResult:
    """What mgm 0.2.3's ``get_job_goodput_with_exclusions(exclusion_intervals, True,
    configured_ideal_step_time)`` returns for ``job`` (module docstring for the rules).

    Args:
        job: one job's spans.
        exclusions_ns: ``(start_ns, end_ns)`` pairs, ns since the epoch.
        now_ns: *now*, as for :func:`~.mgm.account_mgm` (the end of a job without
            ``job_end_time``).
        ideal_step_time_s: mgm's ``configured_ideal_step_time`` (seconds) or None.
        elastic: as ``ElasticGoodputCalculator``: its breakdown's three elastic keys (0:
            the exclusion walk does not compute elastic badput).

    Returns:
        An :class:`~.mgm.MgmResult`: ``total_time_s`` is the adjusted total,
        ``excluded_time_s`` mgm's ``total_excluded_time``, ``badput_percent`` mgm's
        breakdown (empty when the adjusted total is 0, where goodput is 0),
        ``step_deviation_s`` signed deviations of the adjusted step times.

    Raises:
        ValueError: ``ideal_step_time_s`` is not a finite number > 0; the job has no
            attempt (mgm: total job time 0).
    """
    if ideal_step_time_s is not None and not (
        math.isfinite(ideal_step_time_s) and ideal_step_time_s > 0
    ):
        raise ValueError(f"ideal step time must be a finite number > 0, got {ideal_step_time_s}")
    excl = normalize_exclusions(exclusions_ns)
    ev, last_end, _ = events(job, now_ns)
    js = ev.t[ev.kind == E_JOB_START]
    if not len(js):
        raise ValueError(f"job {job.name!r} has no spans: mgm cannot compute goodput")
    cs, ce, cv, _ = pairs(ev, E_CUSTOM_START, E_CUSTOM_END, by_val=True)
    custom = [(s, e, ev.types[v]) for s, e, v in zip(cs.tolist(), ce.tolist(), cv.tolist(),
                                                     strict=True) if s < e]
    prod = excluded = 0
    unprod: dict = {}
    times: dict[int, int] = {}
    steps: dict[int, int] = {}
    job_start = job_end = tpu_s = prep_s = dl_s = None
    tpu = prep = dl_total = 0
    sync = True
    disruptions = max_step = last_step = 0

    def add_segment(bound):
        nonlocal prod, excluded, max_step
        p, u, m, x, t = _segment(list(steps.items()), bound, custom, excl)
        prod += p
        excluded += x
        _accumulate(u, unprod)
        max_step = max(max_step, m)
        times.update(t)

    for t, k, v in zip(ev.t.tolist(), ev.kind.tolist(), ev.val.tolist(), strict=True):
        if k == E_JOB_START:
            job_start = t
        elif k == E_JOB_END:
            job_end = t
        elif k == E_STEP:
            if v in steps:
                disruptions += 1
                last_time = steps[next(reversed(steps))]
                add_segment(v)
                if job_start and last_time and job_start > last_time:
                    ex = _overlap(last_time, job_start, excl)
                    key = "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"
                    unprod[key] = unprod.get(key, 0) + max(0, job_start - last_time - ex)
                    excluded += ex
                steps = {}
                sync = True
            steps[v] = t
        elif k == E_TPU_START:
            tpu_s = t
        elif k == E_TPU_END and tpu_s:
            ex = _overlap(tpu_s, t, excl)
            tpu += max(0, t - tpu_s - ex)
            excluded += ex
            tpu_s = None
        elif k == E_PREP_START:
            prep_s = t
        elif k == E_PREP_END and prep_s:
            ex = _overlap(prep_s, t, excl)
            prep += max(0, t - prep_s - ex)
            excluded += ex
            prep_s = None
        elif k == E_DL_START:
            dl_s = t
        elif k == E_DL_END and dl_s:
            ex = _overlap(dl_s, t, excl)
            adj = max(0, t - dl_s - ex)
            dl_total += adj
            excluded += ex
            if sync:
                unprod["DATA_LOADING_SYNC"] = unprod.get("DATA_LOADING_SYNC", 0) + adj
                sync = False
            dl_s = None
    if steps:
        last_step = max(steps)
        add_segment(last_step)
        if job_end:
            ex = _overlap(steps[last_step], job_end, excl)
            prod += max(0, job_end - steps[last_step] - ex)
            excluded += ex
            max_step = last_step
    unprod["TPU_INITIALIZATION"] = tpu
    unprod["TRAINING_PREP"] = prep
    unprod["DATA_LOADING_ASYNC"] = dl_total - unprod.get("DATA_LOADING_SYNC", 0)

    end = job_end if job_end is not None else (now_ns if now_ns is not None else last_end)
    total_ns = max(0, int(end) - int(js[0]) - excluded)
    total = total_ns / _NS
    had_custom = "CUSTOM_BADPUT_EVENTS" in unprod
    custom_s = {t: x / _NS for t, x in unprod.pop("CUSTOM_BADPUT_EVENTS", {}).items()}
    seconds = {k: v / _NS for k, v in unprod.items()}
    names = BADPUT_TYPES + (ELASTIC_TYPES if elastic else ())
    keys = tuple(k for k in names if k in seconds) + (
        ("CUSTOM_BADPUT_EVENTS",) if had_custom else ())
    if not total_ns:
        return MgmResult(
            job=job.name, total_time_s=0.0, productive_time_s=prod / _NS, goodput=0.0,
            badput_s=dict.fromkeys(names, 0.0), custom_badput_s={}, badput_percent={},
            max_productive_step=max_step, last_recorded_step=last_step,
            disruptions=disruptions, ideal_step_time_s=None, step_deviation_s={},
            elastic=elastic, badput_keys=keys, excluded_time_s=excluded / _NS)
    # _sanitize_unproductive_times against the adjusted total, then OTHER
    seconds = {k: v if 0.0 <= v <= total else 0.0 for k, v in seconds.items()}
    custom_s = {k: v if 0.0 <= v <= total else 0.0 for k, v in custom_s.items()}
    known = sum(v for k, v in seconds.items() if k != "DATA_LOADING_ASYNC") + sum(
        custom_s.values())
    productive = prod / _NS
    seconds["OTHER"] = max(0.0, total - productive - known)
    badput_s = {k: seconds.get(k, 0.0) for k in names}

    def pct(v: float) -> float:
        return v / total * 100 if 0 < v < total else 0.0

    percent: dict = {}
    for name in _BREAKDOWN_ORDER + (ELASTIC_TYPES if elastic else ()):
        percent[name] = ({k: pct(v) for k, v in custom_s.items()}
                         if name == "CUSTOM_BADPUT_EVENTS" else pct(badput_s[name]))
    adjusted = {n: x / _NS for n, x in times.items()}
    ideal = ideal_step_time_s or compute_ideal_step_time(adjusted.values())
    return MgmResult(
        job=job.name, total_time_s=total, productive_time_s=productive,
        goodput=productive / total, badput_s=badput_s, custom_badput_s=custom_s,
        badput_percent=percent, max_productive_step=max_step, last_recorded_step=last_step,
        disruptions=disruptions, ideal_step_time_s=None if ideal is None else float(ideal),
        step_deviation_s={} if ideal is None else {n: x - ideal for n, x in adjusted.items()},
        elastic=elastic, badput_keys=keys + ("OTHER",), excluded_time_s=excluded / _NS)
