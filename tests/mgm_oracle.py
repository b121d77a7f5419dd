"""The real ml-goodput-measurement 0.2.3 as an oracle for ``--definitions mgm``.

:class:`Scenario` describes one training run once and writes it both as the log entries
mgm's recorder and Orbax's checkpoint logger write and as our spans (one
:class:`otlp_fixtures.Timeline` per attempt; seconds after ``T0_NS``, µs resolution);
:func:`random_scenario` draws one from a seed. :class:`MemoryLogs` stands in for mgm's
Cloud Logging client. :func:`assert_whole_job` and :func:`assert_interval` compare our
:class:`~goodput_processor.definitions.mgm.MgmResult` with mgm's answers (relative 1e-6,
plus 1e-5 s absolute). Used by tests/definitions/, tests/compat/ and tests/read/.
"""

from __future__ import annotations

import copy
import datetime
import random

import pytest
from otlp_fixtures import T0_NS, Timeline

from goodput_processor.definitions.mgm import BADPUT_TYPES, MgmResult, account_mgm


class Scenario:
    """One training run described once, written both as the log entries mgm's recorder
    and Orbax's checkpoint logger write (in program order) and as our spans (one
    :class:`Timeline` per attempt). Times are seconds after ``T0_NS`` with µs resolution.
    Call the methods in the order the program runs (a step before what runs inside it).
    """

    def __init__(self, job="job"):
        self.job = job
        self.entries: list[dict] = []
        self.timelines: list[Timeline] = []

    @staticmethod
    def _q(t: float) -> float:
        """``t`` rounded to the µs: spans and entries get exactly the same instants."""
        return round(t * 1e6) / 1e6

    def _ts(self, t: float) -> float:
        """mgm's payload time of ``t``: POSIX seconds."""
        return (T0_NS // 1000 + round(t * 1e6)) / 1e6

    def _log(self, **payload):
        self.entries.append({"job_name": self.job, **payload})

    @property
    def tl(self) -> Timeline:
        return self.timelines[-1]

    def attempt(self, t):
        t = self._q(t)
        self.timelines.append(Timeline(self.job, attempt=len(self.timelines)).job_start(t))
        self._log(job_start_time=self._ts(t))

    def end(self, t, reason="exit"):
        t = self._q(t)
        self.tl.job_end(t, reason)
        self._log(job_end_time=self._ts(t))

    def _pair(self, name, key, s, e, **extra):
        s, e = self._q(s), self._q(e)
        if name == "custom_badput":
            self.tl.custom(extra["custom_badput_event_type"], s, e)
        else:
            self.tl.span(name, s, e)
        self._log(**extra, **{f"{key}_start_time": self._ts(s)})
        self._log(**extra, **{f"{key}_end_time": self._ts(e)})

    def tpu(self, s, e):
        self._pair("accelerator_init", "tpu_init", s, e)

    def prep(self, s, e):
        self._pair("training_prep", "training_prep", s, e)

    def dl(self, s, e):
        self._pair("data_loading", "data_loading", s, e)

    def custom(self, kind, s, e):
        self._pair("custom_badput", "custom_badput_event", s, e, custom_badput_event_type=kind)

    def step(self, n, s, e):
        s, e = self._q(s), self._q(e)
        self.tl.step(n, s, e)
        self._log(step_count=n, step_start_time=self._ts(s))

    def save(self, step, s, e, blocking=True):
        s, e = self._q(s), self._q(e)
        self.tl.save(s, e, step=step, blocking=blocking)
        if blocking:  # Orbax's SaveStepStatistics (field order as Orbax writes them)
            st, d = self._ts(s), self._q(e - s)
            self._log(step=step, event_type="save", directory="/ckpt", reached_preemption=False,
                      preemption_received_at=None, synchronous=True,
                      wait_for_prev_start_time=st, wait_for_prev_duration_secs=0.0,
                      checkpointer_blocking_start_time=st,
                      checkpointer_blocking_duration_secs=d, get_old_steps_start_time=st,
                      get_old_steps_duration_secs=0.0,
                      checkpoint_manager_blocking_start_time=st,
                      checkpoint_manager_blocking_duration_secs=d)

    def restore(self, step, s, e):
        s, e = self._q(s), self._q(e)
        self.tl.restore(s, e, step=step)
        st, d = self._ts(s), self._q(e - s)
        self._log(step=step, event_type="restore", directory="/ckpt",
                  checkpointer_start_time=st, checkpointer_duration_secs=d,
                  checkpoint_manager_start_time=st, checkpoint_manager_duration_secs=d)


class MemoryLogs:
    """An in-memory stand-in for mgm's ``_CloudLogger`` (like the ``MockCloudLogger`` of
    its tests): entries in write order, filtered by their payload time in (start, end]."""

    def __init__(self, entries, get_timestamp):
        self.entries = [(get_timestamp(e), e) for e in entries]

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        out = [(i, ts, e) for i, (ts, e) in enumerate(self.entries)
               if (start_time is None or ts > start_time) and (end_time is None or ts <= end_time)]
        last = (out[-1][1], f"{out[-1][0]:08d}") if out else (None, None)
        return [copy.deepcopy(e) for _, _, e in out], last


# mgm computes with float POSIX seconds (~0.2 µs resolution at today's epoch) and µs
# datetimes; we compute in integer ns. Relative 1e-6, plus 1e-5 s absolute (a sum of some
# tens of such float differences) for values that are near 0 on one side; for percentages
# that absolute error is relative to the total time.
REL, ABS_S = 1e-6, 1e-5


def close(a, b, total_s=None):
    """``a`` (ours) == ``b`` (mgm); seconds, or percent of ``total_s`` seconds."""
    tol = ABS_S if total_s is None else ABS_S / total_s * 100
    return a == pytest.approx(b, rel=REL, abs=tol)


def _names(d: dict) -> dict:
    """``d`` with enum keys by their names."""
    return {getattr(k, "name", k): v for k, v in d.items()}


def assert_whole_job(ours: MgmResult, calc, result, ideal=None):
    """``ours`` equals mgm's ``get_job_goodput(True, ideal)`` ``result`` of ``calc``, its
    seconds (``get_job_goodput_details``) and ``get_step_deviation(ideal)``."""
    goodput_pct, breakdown, max_step = result
    details = calc.get_job_goodput_details()
    badput = _names(details["badput_time"])
    custom = badput.pop("CUSTOM_BADPUT_EVENTS", {})
    assert close(ours.goodput_percent, goodput_pct, ours.total_time_s)
    assert close(ours.total_time_s, details["total_elapsed_time"])
    assert close(ours.productive_time_s, next(iter(details["goodput_time"].values())))
    assert set(badput) <= set(BADPUT_TYPES)
    for name in BADPUT_TYPES:
        assert close(ours.badput_s[name], badput.get(name, 0.0)), name
    assert set(ours.custom_badput_s) == set(custom)
    for k, v in custom.items():
        assert close(ours.custom_badput_s[k], v), k
    assert_breakdown(ours, breakdown)
    assert ours.max_productive_step == max_step
    assert ours.disruptions == details["disruption_count"]
    try:
        deviation = calc.get_step_deviation(ideal)
    except ValueError:  # mgm: no step time or no ideal step time
        assert ours.step_deviation_s == {}
        return
    assert ours.ideal_step_time_s is not None
    assert close(ours.ideal_step_time_s, details["ideal_step_time"])
    assert list(ours.step_deviation_s) == list(deviation)
    for n, v in deviation.items():
        assert close(ours.step_deviation_s[n], v), n


def assert_breakdown(ours: MgmResult, breakdown):
    """Our badput percentages equal mgm's ``breakdown``, key for key, in its order."""
    b = _names(breakdown)
    total = ours.total_time_s
    assert list(b) == list(ours.badput_percent)
    for k, v in b.items():
        if k == "CUSTOM_BADPUT_EVENTS":
            assert set(v) == set(ours.badput_percent[k])
            for t, p in v.items():
                assert close(ours.badput_percent[k][t], p, total), t
        else:
            assert close(ours.badput_percent[k], v, total), k


def dt(ns: int) -> datetime.datetime:
    """The UTC datetime of ``ns`` (POSIX ns, a whole number of µs)."""
    assert ns % 1000 == 0
    return datetime.datetime.fromtimestamp(ns // 1000 / 1e6, datetime.timezone.utc)


def assert_interval(job, make, entries, start_ns, end_ns):
    """Interval ``[start_ns, end_ns]``: both raise ValueError (-> False) or both give the
    same numbers (-> True); ``make(entries)`` gives mgm's calculator."""
    calc = make(entries)
    try:
        pct, breakdown, max_step, total, disruptions = calc.get_job_goodput_interval(
            dt(start_ns), dt(end_ns))
    except ValueError:
        with pytest.raises(ValueError):
            account_mgm(job, interval_ns=(start_ns, end_ns))
        return False
    r = account_mgm(job, interval_ns=(start_ns, end_ns))
    assert close(r.goodput_percent, pct, r.total_time_s)
    assert close(r.total_time_s, total)
    assert_breakdown(r, breakdown)
    assert (r.max_productive_step, r.disruptions) == (max_step, disruptions)
    return True


def random_scenario(seed: int) -> Scenario:
    """A seeded random run: 1-4 attempts, each possibly with accelerator init, training
    prep, a restore, data loading; steps (some sub-second) with data loading and custom
    badput inside, blocking and async saves; restarts resume from the last checkpoint,
    from step 0 or (lost restart) after the last step; earlier attempts are killed or end
    cleanly; the last one ends with a job end."""
    rng = random.Random(seed)

    def d(lo, hi):  # a duration in seconds with µs resolution
        return round(rng.uniform(lo, hi), 6)

    sc = Scenario()
    t, saved, next_step = 0.0, None, rng.choice([0, 1])
    attempts = rng.randint(1, 4)
    for a in range(attempts):
        sc.attempt(t)
        t += d(0, 0.5)
        for method in (sc.tpu, sc.prep):
            if rng.random() < 0.7:
                e = t + d(0.2, 3)
                method(t, e)
                t = e + d(0, 0.3)
        if a:
            r = rng.random()
            if saved is not None and r < 0.7:
                e = t + d(0.5, 3)
                sc.restore(saved, t, e)
                t = e
                next_step = saved + 1
            elif r < 0.85:
                next_step = 0
            # else: a lost restart, resuming after the last step recorded
        if rng.random() < 0.7:
            e = t + d(0.2, 2)
            sc.dl(t, e)
            t = e
        base = d(0.4, 3)
        k_steps = rng.randint(0, 14)
        for k in range(k_steps):
            n = next_step + k
            start = cursor = t
            inner = []
            if rng.random() < 0.3:
                e = cursor + d(0.05, 0.5)
                inner.append(("dl", cursor, e))
                cursor = e
            cursor += base * rng.uniform(0.8, 1.3) + (d(1, 6) if k == 0 else 0)
            if rng.random() < 0.25:
                e = cursor + d(0.1, 2)
                inner.append((rng.choice(["eval_step", "sdc_check", "Eval_Step"]), cursor, e))
                cursor = e
            cursor = sc._q(cursor)
            sc.step(n, start, cursor)
            for kind, s, e in inner:
                if kind == "dl":
                    sc.dl(s, e)
                else:
                    sc.custom(kind, s, e)
            t = cursor
            if rng.random() < 0.2:
                blocking = rng.random() < 0.8
                e = t + d(0.2, 2)
                sc.save(n, t, e, blocking=blocking)
                if blocking:
                    t = e
                    saved = n
        next_step += k_steps
        t += d(0, 0.5)
        if a == attempts - 1:
            sc.end(t)
        else:
            if rng.random() < 0.15:
                sc.end(t, "sigterm")
            t += d(2, 30)
    return sc
