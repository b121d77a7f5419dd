"""``--definitions mgm``: ml-goodput-measurement 0.2.3's numbers on our timeline.

Part 1: hand-computed scenarios (the arithmetic is in the comments). Part 2: the real
``ml_goodput_measurement`` 0.2.3 calculator as an oracle, fed the log entries of the same
scenario that our spans describe.
"""

from __future__ import annotations

import io
import json
import random

import pytest
from mgm_oracle import (
    MemoryLogs,
    Scenario,
    assert_interval,
    assert_whole_job,
    random_scenario,
)
from otlp_fixtures import T0_NS, Timeline

from goodput_processor import read_run_dir
from goodput_processor.definitions.mgm import (
    BADPUT_TYPES,
    MgmResult,
    account_mgm,
    compute_ideal_step_time,
    render_mgm,
)

NS = 1_000_000_000
FAR_FUTURE = T0_NS + 10**6 * NS


def load(tmp_path, *timelines):
    for tl in timelines:
        tl.write(tmp_path)
    (job,) = read_run_dir(tmp_path).jobs.values()
    return job


def nonzero(d: dict) -> dict:
    return {k: v for k, v in d.items() if v}


def approx(d: dict) -> dict:
    return {k: pytest.approx(v, abs=1e-9) for k, v in d.items()}


def at(t: float) -> int:
    """Absolute ns of ``t`` seconds after the fixtures' time origin."""
    return T0_NS + round(t * NS)


# --- part 1: hand-computed ---------------------------------------------------------------


def clean_run():
    """tpu 1-2, prep 3-5, data loading 6-8, steps 0..4 starting 9, 17, 20, 23, 26 (the
    first one 5 s longer than the others: compilation), an async data loading of 0.5 s at
    the start of steps 1-3, a program_startup span (not an mgm event), job end 29."""
    t = Timeline()
    t.job_start(0).span("accelerator_init", 1, 2).span("training_prep", 3, 5)
    t.span("data_loading", 6, 8).span("program_startup", 9, 14)
    starts = [9, 17, 20, 23, 26, 29]
    for n in range(5):
        t.step(n, starts[n], starts[n + 1])
        if 1 <= n <= 3:
            t.span("data_loading", starts[n], starts[n] + 0.5)
    return t.job_end(29)


def test_clean_run(tmp_path):
    r = account_mgm(load(tmp_path, clean_run()))
    assert isinstance(r, MgmResult) and r.job == "job" and r.interval is None
    # deltas 0->1 = 8 (first step), 1->2 = 2->3 = 3->4 = 3: mean of the others 3, so the
    # first step's extra 8 - 3 = 5 s is PROGRAM_STARTUP; productive 17 - 5 = 12, plus the
    # last step up to the job end (29 - 26 = 3) = 15.
    assert r.total_time_s == 29 and r.productive_time_s == pytest.approx(15)
    assert r.goodput == pytest.approx(15 / 29) and r.goodput_percent == pytest.approx(1500 / 29)
    # DATA_LOADING_SYNC: the first data loading (6-8); the 3 x 0.5 s in steps are ASYNC.
    # OTHER = 29 - 15 - (1 + 2 + 2 + 5) = 4 (the gaps 0-1, 2-3, 5-6, 8-9); ASYNC not in it.
    assert list(r.badput_s) == list(BADPUT_TYPES)
    assert nonzero(r.badput_s) == approx({
        "TPU_INITIALIZATION": 1, "TRAINING_PREP": 2, "PROGRAM_STARTUP": 5,
        "DATA_LOADING_SYNC": 2, "DATA_LOADING_ASYNC": 1.5, "OTHER": 4})
    assert r.custom_badput_s == {}
    assert r.badput_percent["PROGRAM_STARTUP"] == pytest.approx(500 / 29)
    assert r.badput_percent["DATA_LOADING_ASYNC"] == pytest.approx(150 / 29)
    assert r.badput_percent["CUSTOM_BADPUT_EVENTS"] == {}
    assert list(r.badput_percent) == [
        "TPU_INITIALIZATION", "TRAINING_PREP", "DATA_LOADING_SYNC", "DATA_LOADING_ASYNC",
        "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
        "PROGRAM_STARTUP", "WASTED_PROGRESS_FROM_DISRUPTION",
        "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", "CUSTOM_BADPUT_EVENTS", "OTHER"]
    # The job ended: the last step counts, so the max productive step is the last one.
    assert (r.max_productive_step, r.last_recorded_step, r.disruptions) == (4, 4, 0)
    # Step times {0: 8, 1: 3, 2: 3, 3: 3}: median 3, MAD 0, so 8 is dropped: ideal 3.
    assert r.ideal_step_time_s == pytest.approx(3)
    assert r.step_deviation_s == approx({0: 5, 1: 0, 2: 0, 3: 0})
    # A given ideal step time is used as it is.
    r2 = account_mgm(load(tmp_path, clean_run()), ideal_step_time_s=2.5)
    assert r2.ideal_step_time_s == 2.5
    assert r2.step_deviation_s == approx({0: 5.5, 1: 0.5, 2: 0.5, 3: 0.5})
    with pytest.raises(ValueError, match="ideal step time"):
        account_mgm(load(tmp_path, clean_run()), ideal_step_time_s=0)


def disruption_run():
    """Attempt 0: data loading 0-2, steps 0..5 at 2, 7, 10, 13, 16, 19 (step 0 2 s longer),
    an async data loading 13-13.5 in step 3; killed after step 5 (22). Attempt 1: start 30,
    data loading 31-33, restart from step 3: steps 3..6 at 35, 41, 44, 47 (step 3 3 s
    longer), data loading 41-41.5 in step 4, job end 50."""
    a0 = Timeline(attempt=0)
    a0.job_start(0).span("data_loading", 0, 2)
    s0 = [2, 7, 10, 13, 16, 19, 22]
    for n in range(6):
        a0.step(n, s0[n], s0[n + 1])
    a0.span("data_loading", 13, 13.5)
    a1 = Timeline(attempt=1)
    a1.job_start(30).span("data_loading", 31, 33)
    s1 = [35, 41, 44, 47, 50]
    for i, n in enumerate(range(3, 7)):
        a1.step(n, s1[i], s1[i + 1])
    a1.span("data_loading", 41, 41.5).job_end(50)
    return a0, a1


def test_disruption_and_restart(tmp_path):
    r = account_mgm(load(tmp_path, *disruption_run()))
    # Step 3 is recorded again: one disruption. Segment 1 (bound 3): 0->1 = 5 (first),
    # 1->2 = 3, 2->3 = 3 count; 3->4 and 4->5 (3 + 3 = 6) are WASTED_PROGRESS. Startup
    # 5 - 3 = 2, productive 11 - 2 = 9.
    # INFRASTRUCTURE_RECOVERY = latest job start (30) - start of the last step recorded
    # before the repeat (step 5 at 19) = 11.
    # Segment 2: 3->4 = 6 (first), 4->5 = 3, 5->6 = 3: startup 3, productive 9; plus the
    # last step to the job end 50 - 47 = 3. Productive 9 + 9 + 3 = 21.
    # DATA_LOADING_SYNC: the first one (2) + at the repeat the last one before it (31-33:
    # 2) + the first one after it (41-41.5: 0.5) = 4.5; of 5 s in all, 0.5 s is ASYNC.
    # OTHER = 50 - 21 - (4.5 + 2 + 3 + 6 + 11) = 2.5.
    assert r.total_time_s == 50 and r.productive_time_s == pytest.approx(21)
    assert nonzero(r.badput_s) == approx({
        "PROGRAM_STARTUP": 5, "DATA_LOADING_SYNC": 4.5, "DATA_LOADING_ASYNC": 0.5,
        "WASTED_PROGRESS_FROM_DISRUPTION": 6, "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 11,
        "OTHER": 2.5})
    assert (r.max_productive_step, r.last_recorded_step, r.disruptions) == (6, 6, 1)
    # Step times over all step starts, consecutive numbers only, later ones overwrite:
    # {0: 5, 1: 3, 2: 3, 3: 6 (35->41 overwrites 13->16), 4: 3, 5: 3}; ideal 3 (6 and 5
    # are above median + 3 MAD = 3).
    assert r.ideal_step_time_s == pytest.approx(3)
    assert r.step_deviation_s == approx({0: 2, 1: 0, 2: 0, 3: 3, 4: 0, 5: 0})


def test_data_loading_counted_twice(tmp_path):
    """One data loading at the start and none at the restart: mgm adds it to
    DATA_LOADING_SYNC a second time at the repeated step, ASYNC goes negative (-2) and is
    sanitised to 0."""
    a0 = Timeline(attempt=0).job_start(0).span("data_loading", 0, 2)
    a0.steps(0, 3, start=2, step_time=3)  # starts 2, 5, 8, 11; killed at 14
    a1 = Timeline(attempt=1).job_start(20)
    a1.steps(2, 4, start=21, step_time=3).job_end(30)  # starts 21, 24, 27
    r = account_mgm(load(tmp_path, a0, a1))
    assert r.badput_s["DATA_LOADING_SYNC"] == pytest.approx(4)
    assert r.badput_s["DATA_LOADING_ASYNC"] == 0
    # segment 1: 0->1, 1->2 = 3 each (6); 2->3 wasted 3; recovery 20 - 11 = 9.
    # segment 2: 2->3, 3->4 = 3 each; last step 30 - 27 = 3: productive 6 + 6 + 3 = 15.
    assert r.productive_time_s == pytest.approx(15)
    assert r.badput_s["WASTED_PROGRESS_FROM_DISRUPTION"] == pytest.approx(3)
    assert r.badput_s["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == pytest.approx(9)
    # OTHER = 30 - 15 - (4 + 3 + 9) = -1 -> 0
    assert r.badput_s["OTHER"] == 0


def test_restart_from_step_zero(tmp_path):
    """A repeat of step 0: mgm drops the segment before it (neither productive nor wasted
    progress: it ends up in OTHER); infrastructure recovery is still counted."""
    a0 = Timeline(attempt=0).job_start(0).steps(0, 3, start=1, step_time=3)  # 1,4,7,10 -> 13
    a1 = Timeline(attempt=1).job_start(20).steps(0, 2, start=21, step_time=3).job_end(30)
    r = account_mgm(load(tmp_path, a0, a1))
    # segment 2: 0->1, 1->2 = 3 each, last step 30 - 27 = 3: productive 9.
    assert r.productive_time_s == pytest.approx(9) and r.disruptions == 1
    assert r.badput_s["WASTED_PROGRESS_FROM_DISRUPTION"] == 0
    assert r.badput_s["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == pytest.approx(20 - 10)
    assert r.badput_s["OTHER"] == pytest.approx(30 - 9 - 10)


def custom_run():
    """Steps 0..4 at 1, 4, 9, 12, 16, job end 20. eval_step 6-8 inside 1->2, sdc_check
    13-14 inside 3->4, an eval_step 8.5-9.5 across the step-2 boundary and one 18-19 in the
    last step."""
    t = Timeline().job_start(0)
    starts = [1, 4, 9, 12, 16, 20]
    for n in range(5):
        t.step(n, starts[n], starts[n + 1])
    t.custom("eval_step", 6, 8).custom("eval_step", 8.5, 9.5).custom("sdc_check", 13, 14)
    t.custom("eval_step", 18, 19)
    t.custom("eval_step", 2, 3, blocking=False)  # asynchronous: not an mgm event
    return t.job_end(20)


def test_custom_badput_inside_steps(tmp_path):
    r = account_mgm(load(tmp_path, custom_run()))
    # deltas 0->1 = 3, 1->2 = 5 - 2 (eval 6-8) = 3, 2->3 = 3, 3->4 = 4 - 1 (sdc 13-14) = 3:
    # 12, no startup; last step 20 - 16 = 4 (its eval is not taken out): productive 16.
    # The eval across the step boundary lies inside no delta: productive too.
    assert r.productive_time_s == pytest.approx(16)
    assert r.custom_badput_s == approx({"EVAL_STEP": 2, "SDC_CHECK": 1})
    assert r.badput_percent["CUSTOM_BADPUT_EVENTS"] == approx({"EVAL_STEP": 10, "SDC_CHECK": 5})
    assert nonzero(r.badput_s) == approx({"OTHER": 20 - 16 - 3})
    # Step times are raw {0: 3, 1: 5, 2: 3, 3: 4}: median 3.5, MAD 0.5 -> all kept, ideal
    # = mean 3.75.
    assert r.ideal_step_time_s == pytest.approx(3.75)
    assert r.step_deviation_s == approx({0: 0.75, 1: 1.25, 2: 0.75, 3: 0.25})


def checkpoint_run():
    """Attempt 0: steps 1..4 at 1, 4, 9, 12; save of step 2 at 7-9, blocking part of the
    save of step 4 at 15-17, killed. Attempt 1: start 20, restore of step 2 20-23, steps
    3..5 at 23, 26, 33; save of step 4 again 29-33 (4 s), an async save 33-35, job end 36."""
    a0 = Timeline(attempt=0).job_start(0)
    a0.step(1, 1, 4).step(2, 4, 7).save(7, 9, step=2).step(3, 9, 12).step(4, 12, 15)
    a0.save(15, 17, step=4)
    a1 = Timeline(attempt=1).job_start(20).restore(20, 23, step=2)
    a1.step(3, 23, 26).step(4, 26, 29).save(29, 33, step=4).step(5, 33, 36)
    a1.save(33, 35, step=5, blocking=False).job_end(36)
    return a0, a1


def test_checkpoint_save_and_restore(tmp_path):
    r = account_mgm(load(tmp_path, *checkpoint_run()))
    # Segment 1 (repeat of step 3): 1->2 = 3 (first), 2->3 = 5 (holds the save): mean of
    # the others 5 > 3, no startup; productive 8; 3->4 = 3 wasted. Recovery 20 - 12 = 8.
    # Segment 2: 3->4 = 3, 4->5 = 7; last step 36 - 33 = 3: 13. Sum 21 minus the saves:
    # step 2: 2, step 4: mean(2, 4) = 3 -> 5 s. Productive 16.
    # Restore: step 2: 3. OTHER = 36 - 16 - (5 + 3 + 3 + 8) = 1.
    assert r.productive_time_s == pytest.approx(16)
    assert nonzero(r.badput_s) == approx({
        "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME": 5, "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME": 3,
        "WASTED_PROGRESS_FROM_DISRUPTION": 3, "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 8,
        "OTHER": 1})
    assert (r.max_productive_step, r.last_recorded_step, r.disruptions) == (5, 5, 1)


def crashed_run():
    """Steps 0..3 at 1, 4, 7, 10, killed at 13 (the end of step 3)."""
    return Timeline().job_start(0).steps(0, 3, start=1, step_time=3)


def test_crashed_last_attempt(tmp_path):
    job = load(tmp_path, crashed_run())
    # No job end: total runs to now (default: the end of the last attempt, 13). The last
    # step is not productive: 0->1, 1->2, 2->3 = 9; max productive step 2.
    r = account_mgm(job)
    assert r.total_time_s == 13 and r.productive_time_s == pytest.approx(9)
    assert r.badput_s["OTHER"] == pytest.approx(4)
    assert (r.max_productive_step, r.last_recorded_step) == (2, 3)
    r = account_mgm(job, now_ns=at(20))  # mgm's "query time"
    assert r.total_time_s == 20 and r.badput_s["OTHER"] == pytest.approx(11)
    # The same run with a job end: the last step counts up to it.
    ended = account_mgm(load(tmp_path / "ended", crashed_run().job_end(13)))
    assert ended.productive_time_s == pytest.approx(12) and ended.max_productive_step == 3


def test_clean_end_of_an_earlier_attempt_is_the_job_end(tmp_path):
    """Attempt 0 ends cleanly (SIGTERM), attempt 1 is killed: mgm's total ends at attempt
    0's job end and the last step is charged up to it (13 - 30 < 0): productive time is
    invalid, and mgm raises."""
    a0 = Timeline(attempt=0).job_start(0).steps(0, 3, start=1, step_time=3).job_end(13, "sigterm")
    a1 = Timeline(attempt=1).job_start(20).steps(2, 5, start=21, step_time=3)
    with pytest.raises(ValueError, match="productive training time"):
        account_mgm(load(tmp_path, a0, a1))


def test_interval(tmp_path):
    job = load(tmp_path, clean_run())
    # Events in (10, 24]: step starts 17, 20, 23 and the data loadings 17-17.5, 20-20.5,
    # 23-23.5. Total = min(24, 23.5) - max(10, 17) = 6.5. Steps 1->2, 2->3 = 3 each, no
    # job end: productive 6. DATA_LOADING_SYNC: the first data loading (0.5); ASYNC 1.
    r = account_mgm(job, interval_ns=(at(10), at(24)))
    assert r.interval == (at(17), at(23.5))
    assert r.total_time_s == pytest.approx(6.5) and r.productive_time_s == pytest.approx(6)
    assert nonzero(r.badput_s) == approx({"DATA_LOADING_SYNC": 0.5, "DATA_LOADING_ASYNC": 1})
    assert (r.max_productive_step, r.last_recorded_step, r.disruptions) == (2, 3, 0)
    # The start is exclusive: (20, 100] loses step 2 and the start of its data loading
    # (20); the end at 20.5 has no start and is ignored. First event 20.5, last the job
    # end 29: total 8.5. Steps 3 (23), 4 (26): 3->4 = 3 + the last step up to the job end
    # 29 - 26 = 3: productive 6. SYNC: the data loading 23-23.5. OTHER = 8.5 - 6.5 = 2.
    r = account_mgm(job, interval_ns=(at(20), at(100)))
    assert r.interval == (at(20.5), at(29)) and r.total_time_s == pytest.approx(8.5)
    assert r.productive_time_s == pytest.approx(6)
    assert nonzero(r.badput_s) == approx({"DATA_LOADING_SYNC": 0.5, "OTHER": 2})
    assert (r.max_productive_step, r.last_recorded_step) == (4, 4)
    # The whole job as an interval: the same numbers as the whole-job query.
    whole = account_mgm(job)
    r = account_mgm(job, interval_ns=(at(-1), at(29)))
    assert r.total_time_s == whole.total_time_s and r.badput_s == approx(whole.badput_s)
    with pytest.raises(ValueError, match=rf"\({at(100)}, {at(200)}\]"):
        account_mgm(job, interval_ns=(at(100), at(200)))
    with pytest.raises(ValueError, match="not before"):
        account_mgm(job, interval_ns=(at(20), at(20)))
    with pytest.raises(ValueError, match="span no time"):  # one event only: step 1 at 17
        account_mgm(job, interval_ns=(at(16.9), at(17)))


def test_sub_second_steps(tmp_path):
    t = Timeline().job_start(0).steps(0, 9, start=1, step_time=0.5).job_end(6)
    job = load(tmp_path, t)
    r = account_mgm(job)
    assert r.productive_time_s == pytest.approx(5) and r.total_time_s == 6
    # every step time is under 1 s: mgm has no ideal step time and no deviation
    assert r.ideal_step_time_s is None and r.step_deviation_s == {}
    assert compute_ideal_step_time([0.5] * 9) is None
    r = account_mgm(job, ideal_step_time_s=0.4)
    assert r.step_deviation_s == approx(dict.fromkeys(range(9), 0.1))


def test_lost_restart_counts_downtime_as_productive(tmp_path):
    """The restart resumes at the last step + 1 (its checkpoint held every step): no step
    number repeats, so mgm sees no disruption and counts the crash, the downtime and the
    restore as one long productive step 4 -> 5."""
    a0 = Timeline(attempt=0).job_start(0).steps(0, 4, start=1, step_time=3)  # killed at 16
    a1 = Timeline(attempt=1).job_start(30).restore(30, 32, step=4)
    a1.steps(5, 7, start=33, step_time=3).job_end(42)
    r = account_mgm(load(tmp_path, a0, a1))
    # deltas 3,3,3,3 then 4->5 = 33 - 13 = 20, then 3, 3: 38; the first step (3) is below
    # the mean of the others, no startup. Last step 42 - 39 = 3: productive 41 of 42 s.
    assert r.disruptions == 0
    assert r.productive_time_s == pytest.approx(41) and r.goodput == pytest.approx(41 / 42)
    assert r.badput_s["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == 0
    assert r.badput_s["WASTED_PROGRESS_FROM_DISRUPTION"] == 0
    # the restore is counted too: productive + badput exceed the total; OTHER clamps at 0
    assert r.badput_s["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] == pytest.approx(2)
    assert r.badput_s["OTHER"] == 0
    # the downtime shows up only as a step-time deviation of step 4
    assert r.step_deviation_s[4] == pytest.approx(20 - r.ideal_step_time_s)


def test_multi_process_uses_the_primary_process(tmp_path):
    """Process 1's spans are not mgm events (mgm logs on worker 0 only); the attempt still
    starts at the earliest job start of its processes."""
    p0 = Timeline(process=0, count=2).job_start(1).steps(0, 3, start=2, step_time=2).job_end(10)
    p1 = Timeline(process=1, count=2).job_start(0).span("data_loading", 0, 1)
    p1.custom("eval_step", 4.5, 5.5).steps(10, 13, start=2, step_time=2)
    r = account_mgm(load(tmp_path, p0, p1))
    assert r.total_time_s == 10 and r.productive_time_s == pytest.approx(8)
    assert r.custom_badput_s == {} and r.badput_s["DATA_LOADING_SYNC"] == 0
    assert r.last_recorded_step == 3


def test_no_spans_and_zero_total(tmp_path):
    job = load(tmp_path, Timeline().job_start(0).steps(0, 1, start=1, step_time=1))
    job.processes.clear()
    with pytest.raises(ValueError, match="no spans"):
        account_mgm(job)
    with pytest.raises(ValueError, match="total job time is zero"):
        account_mgm(load(tmp_path / "z", Timeline().job_start(5).job_end(5)))


def test_json_and_table(tmp_path):
    r = account_mgm(load(tmp_path, custom_run()))
    d = r.to_json_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["definitions"] == "ml-goodput-measurement 0.2.3"
    assert d["goodput_percent"] == pytest.approx(80) and d["interval"] is None
    assert d["step_deviation_s"]["1"] == pytest.approx(1.25)
    assert d["badput_percent"]["CUSTOM_BADPUT_EVENTS"]["EVAL_STEP"] == pytest.approx(10)
    from rich.console import Console

    buf = io.StringIO()
    ri = account_mgm(load(tmp_path / "i", clean_run()), interval_ns=(at(10), at(24)))
    render_mgm([r, ri], Console(file=buf, width=120, highlight=False))
    out = buf.getvalue()
    assert "ml-goodput-measurement 0.2.3 definitions" in out and "docs/definitions.md" in out
    assert "CUSTOM_BADPUT_EVENTS/EVAL_STEP" in out and "DATA_LOADING_ASYNC (not badput)" in out
    assert "goodput 80.00 %" in out and "interval" in out


# --- part 2: the real ml-goodput-measurement 0.2.3 as an oracle ------------------------


@pytest.fixture
def mgm_calculator(tmp_path):
    """``make(entries)`` -> a real mgm 0.2.3 ``GoodputCalculator`` over ``entries``."""
    goodput = pytest.importorskip("ml_goodput_measurement.src.goodput")
    count = iter(range(10**6))

    def make(entries):
        logs = MemoryLogs(entries, goodput.get_timestamp_from_log_entry)
        cache = tmp_path / f"mgm-cache-{next(count)}"
        return goodput.GoodputCalculator("job", "log", cloud_logger=logs, cache_dir=str(cache))

    return make


def assert_same_job(job, make, entries, ideal=None) -> bool:
    """Whole job: both raise ValueError (-> False) or both give the same numbers."""
    calc = make(entries)
    try:
        result = calc.get_job_goodput(True, ideal)
    except ValueError:
        with pytest.raises(ValueError):
            account_mgm(job, ideal_step_time_s=ideal)
        return False
    assert_whole_job(account_mgm(job, ideal_step_time_s=ideal), calc, result, ideal)
    return True


def oracle_check(sc: Scenario, tmp_path, make, ideal=None, intervals=()):
    """Whole job and each interval ``(start_ns, end_ns)``: ours == mgm's. Returns which
    queries mgm could answer (the others raised ValueError on both sides)."""
    job = load(tmp_path, *sc.timelines)
    whole = assert_same_job(job, make, sc.entries, ideal)
    return whole, [assert_interval(job, make, sc.entries, a, b) for a, b in intervals]


def sc_clean() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    sc.tpu(1, 2)
    sc.prep(3, 5)
    sc.dl(6, 8)
    starts = [9, 17, 20, 23, 26, 29]
    for n in range(5):
        sc.step(n, starts[n], starts[n + 1])
        if 1 <= n <= 3:
            sc.dl(starts[n], starts[n] + 0.5)
    sc.end(29)
    return sc


def sc_disruption() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    sc.dl(0, 2)
    s0 = [2, 7, 10, 13, 16, 19, 22]
    for n in range(6):
        sc.step(n, s0[n], s0[n + 1])
        if n == 3:
            sc.dl(13, 13.5)
    sc.attempt(30)
    sc.dl(31, 33)
    s1 = [35, 41, 44, 47, 50]
    for i, n in enumerate(range(3, 7)):
        sc.step(n, s1[i], s1[i + 1])
        if n == 4:
            sc.dl(41, 41.5)
    sc.end(50)
    return sc


def sc_custom() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    starts = [1, 4, 9, 12, 16, 20]
    inside = {1: [("eval_step", 6, 8), ("eval_step", 8.5, 9.5)], 3: [("sdc_check", 13, 14)],
              4: [("eval_step", 18, 19)]}
    for n in range(5):
        sc.step(n, starts[n], starts[n + 1])
        for kind, s, e in inside.get(n, ()):
            sc.custom(kind, s, e)
    sc.end(20)
    return sc


def sc_checkpoints() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    sc.step(1, 1, 4)
    sc.step(2, 4, 7)
    sc.save(2, 7, 9)
    sc.step(3, 9, 12)
    sc.step(4, 12, 15)
    sc.save(4, 15, 17)
    sc.attempt(20)
    sc.restore(2, 20, 23)
    sc.step(3, 23, 26)
    sc.step(4, 26, 29)
    sc.save(4, 29, 33)
    sc.step(5, 33, 36)
    sc.save(5, 33, 35, blocking=False)
    sc.end(36)
    return sc


def sc_lost_restart() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    for n in range(5):
        sc.step(n, 1 + 3 * n, 4 + 3 * n)
    sc.attempt(30)
    sc.restore(4, 30, 32)
    for i, n in enumerate(range(5, 8)):
        sc.step(n, 33 + 3 * i, 36 + 3 * i)
    sc.end(42)
    return sc


def sc_earlier_clean_end() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    for n in range(4):
        sc.step(n, 1 + 3 * n, 4 + 3 * n)
    sc.end(13, "sigterm")
    sc.attempt(20)
    for i, n in enumerate(range(2, 6)):
        sc.step(n, 21 + 3 * i, 24 + 3 * i)
    return sc


def sc_restart_from_zero() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    for n in range(4):
        sc.step(n, 1 + 3 * n, 4 + 3 * n)
    sc.attempt(20)
    for n in range(3):
        sc.step(n, 21 + 3 * n, 24 + 3 * n)
    sc.end(30)
    return sc


def sc_data_loading_twice() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    sc.dl(0, 2)
    for n in range(4):
        sc.step(n, 2 + 3 * n, 5 + 3 * n)
    sc.attempt(20)
    for i, n in enumerate(range(2, 5)):
        sc.step(n, 21 + 3 * i, 24 + 3 * i)
    sc.end(30)
    return sc


def sc_sub_second() -> Scenario:
    sc = Scenario()
    sc.attempt(0)
    for n in range(10):
        sc.step(n, 1 + 0.5 * n, 1.5 + 0.5 * n)
    sc.end(6)
    return sc


HAND = {
    "clean": (sc_clean, [(10, 24), (20, 100), (-1, 29), (8, 17), (28, 40)]),
    "disruption": (sc_disruption, [(0, 36), (12, 42), (20, 34), (31, 60)]),
    "custom": (sc_custom, [(5, 15), (0, 9), (13, 20)]),
    "checkpoints": (sc_checkpoints, [(6, 30), (16, 40), (0, 10)]),
    "lost_restart": (sc_lost_restart, [(10, 35), (0, 42)]),
    "earlier_clean_end": (sc_earlier_clean_end, [(0, 20), (5, 40)]),
    "restart_from_zero": (sc_restart_from_zero, [(0, 15), (2, 30)]),
    "data_loading_twice": (sc_data_loading_twice, [(1, 30), (0, 25)]),
    "sub_second": (sc_sub_second, [(0, 3), (2, 6)]),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_oracle_hand_scenarios(name, tmp_path, mgm_calculator):
    build, intervals = HAND[name]
    sc = build()
    whole, parts = oracle_check(sc, tmp_path, mgm_calculator,
                                intervals=[(at(a), at(b)) for a, b in intervals])
    # mgm answers the whole job but where the last job end is an earlier attempt's (it
    # raises, and so do we); some intervals raise on both sides too, e.g. (6, 30] of
    # "checkpoints": 3 s of steps minus 5 s of saves is a negative productive time.
    assert whole == (name != "earlier_clean_end") and any(parts)
    oracle_check(sc, tmp_path / "ideal", mgm_calculator, ideal=2.75)


def test_oracle_agrees_with_the_hand_computed_numbers(tmp_path):
    """The Scenario versions of the hand-computed runs give the same spans' numbers."""
    pairs = [(sc_clean, (clean_run(),)), (sc_disruption, disruption_run()),
             (sc_custom, (custom_run(),)), (sc_checkpoints, checkpoint_run())]
    for i, (build, timelines) in enumerate(pairs):
        a = account_mgm(load(tmp_path / f"a{i}", *build().timelines))
        b = account_mgm(load(tmp_path / f"b{i}", *timelines))
        assert a.productive_time_s == pytest.approx(b.productive_time_s)
        assert a.badput_s == approx(b.badput_s) and a.custom_badput_s == approx(b.custom_badput_s)


@pytest.mark.parametrize("seed", range(12))
def test_oracle_random(seed, tmp_path, mgm_calculator):
    sc = random_scenario(seed)
    end_us = (max(s[2] for tl in sc.timelines for s in tl.spans) - T0_NS) // 1000
    rng = random.Random(1000 + seed)
    intervals = []
    for _ in range(6):
        a = rng.randint(-2_000_000, end_us)
        intervals.append((T0_NS + a * 1000, T0_NS + (a + rng.randint(1, end_us)) * 1000))
    ideal = 1.5 if seed % 3 == 0 else None
    whole, parts = oracle_check(sc, tmp_path, mgm_calculator, ideal=ideal, intervals=intervals)
    assert whole or any(parts)  # mgm answered something (comparisons were made)


def test_oracle_random_exercises_the_quirks():
    """The random scenarios do hit restarts, custom badput inside steps, saves, restores
    and clean ends of earlier attempts (so that the oracle tests above mean something)."""
    keys = set()
    for seed in range(12):
        sc = random_scenario(seed)
        steps = [e["step_count"] for e in sc.entries if "step_count" in e]
        if len(steps) != len(set(steps)):
            keys.add("repeat")
        for e in sc.entries:
            keys.update(k for k in ("custom_badput_event_start_time", "event_type",
                                    "job_end_time") if k in e)
            if e.get("event_type") == "restore":
                keys.add("restore")
        if sum("job_start_time" in e for e in sc.entries) > 1:
            keys.add("restart")
    assert {"repeat", "custom_badput_event_start_time", "event_type", "restore",
            "restart"} <= keys


def test_end_to_end_import(tmp_path, mgm_calculator):
    """mgm log entries -> ``goodput import --from mgm`` -> spans -> account_mgm equals the
    real calculator on the same entries."""
    importers = pytest.importorskip("goodput_processor.importers")
    for i, sc in enumerate([sc_clean(), sc_disruption(), sc_custom(), sc_checkpoints(),
                            sc_lost_restart(), random_scenario(3), random_scenario(7)]):
        log = tmp_path / f"in{i}" / "job_timeline.jsonl"
        log.parent.mkdir()
        log.write_text("".join(json.dumps(e) + "\n" for e in sc.entries))
        summary = importers.import_logs([log], tmp_path / f"out{i}", source="mgm")
        job = read_run_dir(summary.jobs["job"].run_dir).jobs["job"]
        assert assert_same_job(job, mgm_calculator, sc.entries)
