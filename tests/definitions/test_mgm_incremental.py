"""``--definitions mgm`` on a live job, poll after poll, with a memo, equals it afresh.

The random jobs and arrival orders of ``tests/model/test_incremental.py`` (restarts, redone
steps, open phases, late spans of a dead attempt, duplicates arriving again), fed batch by
batch: after every batch :func:`~goodput_processor.definitions.mgm.account_mgm` with the
memo the previous polls filled and without any must give equal results, every field (and
the same refusal when mgm refuses), for the whole job and for intervals of it. The drop-in
calculator (``definitions="mgm"``) polled while a spool grows must answer as a new one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_polls import arrivals, store_snapshot
from random_jobs import MS, T0

from goodput_processor.definitions import mgm_resume
from goodput_processor.definitions.mgm import account_mgm
from goodput_processor.definitions.mgm_calc import _calculate
from goodput_processor.definitions.mgm_events import events
from goodput_processor.definitions.mgm_steps import Deviation, _step_time_arrays
from goodput_processor.model.memo import AccountingMemo
from goodput_processor.read.rows import (
    C_END,
    C_START,
    K_CHECKPOINT_SAVE,
    K_CUSTOM_BADPUT,
    K_DATA_LOADING,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
)

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _answer(job, **kw):
    """The result as comparable values (dict orders included), or mgm's refusal."""
    try:
        r = account_mgm(job, **kw)
    except ValueError as e:
        return "refused", str(e)
    fields = {k: getattr(r, k) for k in r.__dataclass_fields__}
    orders = {k: list(v.items()) for k, v in fields.items() if isinstance(v, Mapping)}
    # (NaN-free: == on floats is exact)
    assert all(not isinstance(v, float) or math.isfinite(v) for v in fields.values())
    return r, fields, orders, r.to_json_dict()


def _same(a, b) -> None:
    assert a == b  # (the result, each field, the order of each dict, its JSON)


@contextlib.contextmanager
def _settle(ns: int | None):
    """The replay settled ``ns`` before the last attempt's latest event (None: as is)."""
    saved = mgm_resume.SETTLE_NS
    if ns is not None:
        mgm_resume.SETTLE_NS = ns
    try:
        yield
    finally:
        mgm_resume.SETTLE_NS = saved


@SETTINGS
@given(case=arrivals(), ideal=st.sampled_from([None, 0.01]), running=st.booleans(),
       windows=st.lists(st.tuples(st.integers(0, 999), st.integers(1, 1000)), max_size=2),
       settle=st.sampled_from([None, 0, 2 * MS, 50 * MS]))
def test_mgm_with_a_memo_equals_mgm_afresh_after_every_batch(case, ideal, running, windows,
                                                             settle):
    with _settle(settle):
        _memo_equals_afresh(case, ideal, running, windows)


def _memo_equals_afresh(case, ideal, running, windows) -> None:
    job, batches = case
    memo = AccountingMemo()
    seen: dict = {}
    for batch in batches:
        for key, i in batch:
            seen.setdefault(key, []).append(i)
        snap = store_snapshot(job, seen)
        rows = [p.data for p in snap.processes.values() if len(p.data)]
        first = min(int(d[:, C_START].min()) for d in rows)
        last = max(int(d[:, C_END].max()) for d in rows)
        now = last + (MS if running else 10**12)
        for now_ns in (now, now + MS):  # a later poll with nothing new
            kw = {"now_ns": now_ns, "ideal_step_time_s": ideal}
            _same(_answer(snap, memo=memo, **kw), _answer(snap, **kw))
        for a, b in windows:  # intervals: per mille of the job's span
            lo = first - MS + (last - first + 2 * MS) * min(a, b) // 1000
            hi = first - MS + (last - first + 2 * MS) * max(a, b) // 1000
            kw = {"now_ns": now, "interval_ns": (lo, hi), "ideal_step_time_s": ideal}
            _same(_answer(snap, memo=memo, **kw), _answer(snap, **kw))
        assert len(memo) < 20 * (len(snap.processes) + 4)  # one poll's worth, at most


def _core_state(c):
    return c, {k: list(v.items()) for k, v in vars(c).items() if isinstance(v, dict)}


@SETTINGS
@given(case=arrivals(), running=st.booleans(), data=st.data())
def test_the_replay_carried_over_a_stream_cut_anywhere_equals_the_whole_replay(
        case, running, data):
    """:func:`~goodput_processor.definitions.mgm_resume.advance` over consecutive parts of
    a stream, then ``core``, equals ``_calculate`` of the whole stream (not elastic)."""
    job, _ = case
    rows = [p.data for p in job.processes.values() if len(p.data)]
    now = max(int(d[:, C_END].max()) for d in rows) + (MS if running else 10**12)
    ev = events(job, now)[0]
    n = len(ev.t)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4)))
    st_ = mgm_resume.Replay()
    for a, b in zip([0, *cuts], [*cuts, n], strict=True):
        st_ = mgm_resume.advance(st_, mgm_resume._cut(ev, a, b))
    assert st_.n == n
    assert _core_state(mgm_resume.core(st_, ev.types)) == _core_state(_calculate(ev))
    keys, times = _step_time_arrays(ev)  # mgm's step times, from the state
    assert keys.tolist() == st_.st_keys.tolist()
    assert times.tolist() == (st_.st_ns / 10**9).tolist()


def test_a_growing_attempt_is_replayed_from_its_settled_point():
    """One attempt growing step by step (a data loading before each step, a checkpoint
    every 7 steps, a custom badput every 11, a redone step): after the first poll each
    poll resumes the replay (only the last events are replayed again) and equals a fresh
    one."""
    n = 120
    job = JobSpans("grow")
    rows = []
    t = T0
    for k in range(n):
        step = k if k != 60 else 55  # a redone step: a disruption in the resumed part
        rows.append((t, t + 100 * MS, K_DATA_LOADING, NONE))
        t += 100 * MS
        rows.append((t, t + 1500 * MS, K_STEP, step))
        t += 1500 * MS
        if k % 7 == 3:
            rows.append((t, t + 300 * MS, K_CHECKPOINT_SAVE, step))
            t += 300 * MS
        if k % 11 == 5:
            rows.append((t, t + 200 * MS, K_CUSTOM_BADPUT, NONE))
            t += 200 * MS
    d = np.zeros((len(rows), NCOLS), np.int64)
    d[:, :4] = rows
    d[:, 4], d[:, 6], d[:, 7] = NONE, -1, 0
    d[:, 8] = np.arange(len(rows))
    resumed = []
    real = mgm_resume._resume

    def spy(*a):
        r = real(*a)
        resumed.append(r is not None)
        return r

    mgm_resume._resume = spy
    memo = AccountingMemo()
    try:
        with _settle(3000 * MS):
            for k in range(10, len(rows) + 1, 9):
                job.processes[(0, 0, "")] = ProcessSpans("grow", 0, 0, data=d[:k])
                now = int(d[k - 1, 1]) + MS
                _same(_answer(job, now_ns=now, memo=memo), _answer(job, now_ns=now))
    finally:
        mgm_resume._resume = real
    assert resumed[0] is False and all(resumed[1:]) and len(resumed) > 5


def test_nothing_new_reuses_the_replay_and_a_new_step_does_not_change_old_attempts():
    """Two attempts, the second growing: the first attempt's events come from the memo;
    with nothing new, the stream's replay and step deviation do too."""
    n = 300
    job = JobSpans("grow")
    for attempt in range(2):
        t0 = T0 + attempt * 10**13
        starts = t0 + np.arange(n) * 1500 * MS  # 1.5 s steps: mgm's ideal step time
        d = np.zeros((n, NCOLS), np.int64)
        d[:, 0], d[:, 1], d[:, 2] = starts, starts + 1500 * MS, 8  # steps
        d[:, 3], d[:, 4], d[:, 6], d[:, 7] = np.arange(n), -(2**63), -1, attempt
        d[:, 8] = np.arange(n) + attempt * n
        job.processes[(attempt, 0, "")] = ProcessSpans("grow", attempt, 0, data=d)
    full = job.processes[(1, 0, "")].data
    memo = AccountingMemo()
    for k in (100, 200, 300):
        job.processes[(1, 0, "")].data = full[:k]
        now = int(full[k - 1, 1]) + MS
        got = account_mgm(job, now_ns=now, memo=memo)
        assert got == account_mgm(job, now_ns=now)
        assert got.ideal_step_time_s == 1.5 and len(got.step_deviation_s) == n - 1  # (redone)
        misses = memo.misses
        again = account_mgm(job, now_ns=now + MS, memo=memo)
        assert again == account_mgm(job, now_ns=now + MS)
        assert memo.misses == misses  # nothing new: nothing computed again
        assert again.step_deviation_s is got.step_deviation_s


def test_the_drop_in_calculator_polled_as_its_spool_grows_answers_as_a_new_one(tmp_path):
    """``GoodputCalculator(definitions="mgm")`` tails its spool and keeps a memo: after a
    second attempt is appended, each query equals a new calculator's on the same spool."""
    from incumbent_loop import record_run, sec

    import goodput
    from goodput_processor.compat import GoodputCalculator

    def queries(calc):
        return (calc.get_job_goodput(include_badput_breakdown=True),
                calc.get_job_goodput_details(),
                calc.get_job_goodput_interval(sec(0), sec(104)))

    run = tmp_path / "run"
    record_run(run, steps=4)
    calc = GoodputCalculator("mgm-run", run_dir=run, definitions="mgm")
    assert queries(calc) == queries(GoodputCalculator("mgm-run", run_dir=run,
                                                      definitions="mgm"))
    rec = goodput.GoodputRecorder(job_name="mgm-run", logging_enabled=True, run_dir=run,
                                  handle_signals=False)
    rec.record_job_start_time(sec(100))
    for k, t in ((4, 101), (5, 103)):
        rec.record_step_start_time(k, sec(t))
    rec.record_job_end_time(sec(105))
    goodput.shutdown()
    for _ in range(2):  # the new attempt, then nothing new
        assert queries(calc) == queries(GoodputCalculator("mgm-run", run_dir=run,
                                                          definitions="mgm"))
    assert calc._mgm_memo is not None and calc._mgm_memo.hits


@SETTINGS
@given(case=arrivals(), running=st.booleans(),
       sizes=st.lists(st.integers(1, 2000), min_size=1, max_size=3),
       edges=st.lists(st.tuples(st.integers(0, 10**6), st.integers(-1, 1)), max_size=2))
def test_the_monitors_windows_with_a_memo_equal_them_afresh(case, running, sizes, edges):
    """``account_mgm_windows`` (the monitor's mgm series: the whole job and rolling
    windows ending at *now*, ``sizes`` in ms; also windows from an event's time, or 1 ns
    either side, to *now*), polled after every batch and again with nothing new at a later
    *now*, with its memo and without."""
    from goodput_processor.definitions.mgm import account_mgm_windows

    job, batches = case
    memo = AccountingMemo()
    seen: dict = {}

    def answer(snap, now, memo=None):
        t = events(snap, now)[0].t
        wins = [(now - k * MS, now) for k in sizes] + [
            (int(t[k % len(t)]) + d, now) for k, d in edges if len(t)]
        try:
            whole, parts = account_mgm_windows(snap, wins, memo=memo)
        except ValueError as e:
            return "refused", str(e)
        return [None if r is None else (r, r.to_json_dict()) for r in (whole, *parts)]

    for batch in batches:
        for key, i in batch:
            seen.setdefault(key, []).append(i)
        snap = store_snapshot(job, seen)
        last = max(int(p.data[:, C_END].max()) for p in snap.processes.values()
                   if len(p.data))
        now = last + (MS if running else 10**12)
        for at in (now, now + 3 * MS):  # the windows move with now
            assert answer(snap, at, memo) == answer(snap, at)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(devs=st.lists(st.floats(-5, 5, allow_nan=False), max_size=400),
       recent=st.integers(0, 120), baseline=st.integers(0, 300),
       mode=st.sampled_from(["cumulative", "interval"]))
def test_the_step_deviation_metric_reads_the_last_steps_only_and_equals_it_from_all(
        devs, recent, baseline, mode):
    """``workload.step_deviation_from_baseline`` of a dict or of mgm's step deviation
    mapping (read from their end) equals it of the same deviations as a read-only mapping
    (every value read), or fails the same."""
    import types

    from goodput_processor.exporters.workload import step_deviation_from_baseline as f

    d = {k: v for k, v in enumerate(devs)}

    def run(m):
        try:
            return f(m, mode, recent, baseline)
        except Exception as e:  # (statistics.median of nothing)
            return type(e)
    got, want = run(d), run(types.MappingProxyType(d))
    assert got == want or (got != got and want != want)
    dev = Deviation(np.arange(len(devs)), np.array(devs, np.float64), 0.25)  # (mgm's)
    got, want = run(dev), run(types.MappingProxyType(dict(dev)))
    assert got == want or (got != got and want != want)
    assert dev == {k: abs(v - 0.25) for k, v in enumerate(devs)} and len(dev) == len(devs)


def test_a_window_over_attempts_with_custom_types_in_another_order():
    """Custom badput types numbered over the attempts in order (``b`` first seen in the
    second attempt, before its ``a``): a window's types read from the attempts' events
    (with a memo) are those of the stream (without)."""
    job = JobSpans("types", strings=["a", "b"])
    for attempt, names in enumerate(([0], [1, 0])):
        t0 = T0 + attempt * 10**12
        rows = []
        for k in range(6):
            t = t0 + k * 2000 * MS
            rows.append((t, t + 1500 * MS, K_STEP, k + 3 * attempt, -1))
            if k in (2, 4):
                name = names[(k // 2 - 1) % len(names)]
                rows.append((t + 200 * MS, t + (400 + 100 * name) * MS, K_CUSTOM_BADPUT,
                             NONE, name))
        d = np.zeros((len(rows), NCOLS), np.int64)
        d[:, [0, 1, 2, 3, 6]] = rows
        d[:, 4], d[:, 7], d[:, 8] = NONE, attempt, np.arange(len(rows)) + 100 * attempt
        job.processes[(attempt, 0, "")] = ProcessSpans("types", attempt, 0, data=d)
    now = T0 + 10**12 + 20 * 2000 * MS
    memo = AccountingMemo()
    for lo in (T0, T0 + 10**12 - 1, T0 + 10**12 + 3000 * MS):
        kw = {"now_ns": now, "interval_ns": (lo, now)}
        got = _answer(job, memo=memo, **kw)
        _same(got, _answer(job, **kw))
        assert got[0].custom_badput_s
