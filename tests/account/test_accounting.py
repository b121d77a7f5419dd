"""Accounting rules of docs/accounting.md, checked on real spool files."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from otlp_fixtures import T0_NS, Timeline
from timeline_cases import timelines, worked_example

from goodput import schema
from goodput_processor import account, account_interval, read_run_dir, report_run_dir

NS = 1_000_000_000
FAR_FUTURE = T0_NS + 10**6 * NS  # "now" long after every fixture: nothing is running


def run(tmp_path, *timelines, ideal=None, now_ns=FAR_FUTURE):
    for tl in timelines:
        tl.write(tmp_path)
    (result,) = report_run_dir(tmp_path, ideal_step_time_s=ideal, now_ns=now_ns)
    return result


def assert_consistent(r):
    assert sum(r.buckets_ns.values()) == r.total_ns
    assert all(v >= 0 for v in r.buckets_ns.values()), r.buckets_ns
    assert set(schema.BADPUT_BUCKETS) <= set(r.badput_s)


def test_worked_example_exact(tmp_path):
    r = run(tmp_path, *worked_example(), ideal=120)
    assert r.total_ns == 12000 * NS and r.total_time_s == 12000
    assert r.buckets_ns == {
        "productive": 6000 * NS,
        "process_startup": 0,
        "accelerator_init": 0,
        "training_prep": 0,
        "program_startup": 0,
        "data_loading": 0,
        "checkpoint_save": 600 * NS,
        "checkpoint_restore": 600 * NS,
        "wasted_progress": 2400 * NS,
        "infrastructure_recovery": 900 * NS,
        "training_slowdown": 1500 * NS,
        "other": 0,
    }
    assert r.productive_time_s == 6000 and r.goodput == 0.5
    assert list(r.badput_s) == list(schema.BADPUT_BUCKETS)
    assert r.badput_s["wasted_progress"] == 2400 and r.badput_s["training_slowdown"] == 1500
    assert r.disruptions == 1 and r.max_productive_step == 75
    assert r.ideal_step_time_s == 120 and r.ideal_step_time_source == "given"
    assert [(a.end_reason, a.resume_step, a.steps_kept, a.steps_wasted) for a in r.attempts] == [
        ("killed", 25, 25, 20),
        ("exit", 50, 25, 0),
    ]
    assert r.step_time.count == 50 and r.step_time.anomalous_steps == 25
    assert r.step_time.max_s == 180 and r.step_time.p50_s == 150
    steps = r.steps
    assert steps.step.tolist() == list(range(26, 51)) + list(range(51, 76))
    assert steps.deviation_s.tolist() == [0.0] * 25 + [60.0] * 25
    assert steps.anomalous.tolist() == [False] * 25 + [True] * 25
    assert_consistent(r)


def test_aggregated_step_spans(tmp_path):
    """Spans covering several steps (``goodput.step.count``, as imported from resiliency logs):
    the worked example with each training stretch as one span gives the same buckets."""
    a0 = Timeline(attempt=0, unit=60)
    a0.job_start(0).restore(0, 5, step=25)
    a0.step(50, 5, 55, count=25).save(55, 60, step=50)
    a0.step(70, 60, 100, count=20)  # then killed
    a1 = Timeline(attempt=1, unit=60)
    a1.job_start(115).restore(115, 120, step=50)
    a1.step(75, 120, 195, count=25).save(195, 200, step=75).job_end(200)
    r = run(tmp_path, a0, a1, ideal=120)
    assert r.buckets_ns == run(tmp_path / "single", *worked_example(), ideal=120).buckets_ns
    assert r.goodput == 0.5 and r.badput_s["training_slowdown"] == 1500
    assert [(a.resume_step, a.steps_kept, a.steps_wasted) for a in r.attempts] == [
        (25, 25, 20), (50, 25, 0)]
    assert r.step_time.count == 50 and r.step_time.anomalous_steps == 25
    assert r.steps.count.tolist() == [25, 25]
    assert r.steps.time_s.tolist() == [120.0, 180.0]  # per step
    assert r.steps.deviation_s.tolist() == [0.0, 60.0]
    # without a step-0 restore, the resume step comes from the first span: 50 - 25
    first = Timeline(attempt=0, unit=60).job_start(0).step(50, 0, 50, count=25).job_end(50)
    assert run(tmp_path / "resume", first).attempts[0].resume_step == 25
    assert_consistent(r)


def test_worked_example_estimated_ideal(tmp_path):
    r = run(tmp_path, *worked_example())
    assert r.ideal_step_time_source == "estimated" and r.ideal_step_time_s == 150  # median
    assert r.badput_s["training_slowdown"] == 25 * 30  # 25 steps of 180 s, 30 s over 150
    assert r.productive_time_s == 12000 - 600 - 600 - 2400 - 900 - 750
    assert_consistent(r)


def _variable_steps(tl, times_s, start=0.0):
    t = start
    for n, dt in enumerate(times_s, 1):
        tl.step(n, t, t + dt)
        t += dt
    return t


def test_jitter_is_not_slowdown(tmp_path):
    rng = np.random.default_rng(1234)
    tl = Timeline().job_start(0)
    end = _variable_steps(tl, 1.0 * (1 + rng.uniform(-0.05, 0.05, 2000)))
    tl.job_end(end)
    r = run(tmp_path, tl)
    assert r.ideal_step_time_source == "estimated"
    assert r.ideal_step_time_s == pytest.approx(1.0, rel=0.01)
    assert r.badput_s["training_slowdown"] < 0.01 * r.total_time_s
    assert r.goodput > 0.99
    assert_consistent(r)


def test_slow_steps_are_slowdown(tmp_path):
    rng = np.random.default_rng(7)
    times = 1.0 * (1 + rng.uniform(-0.01, 0.01, 2000))
    slow = rng.choice(2000, size=200, replace=False)
    times[slow] *= 3
    tl = Timeline().job_start(0)
    tl.job_end(_variable_steps(tl, times))
    r = run(tmp_path, tl)
    excess = float(np.sum(times[slow] - np.median(times)))
    assert r.badput_s["training_slowdown"] == pytest.approx(excess, rel=0.02)
    assert r.step_time.anomalous_steps == 200
    assert set(np.flatnonzero(r.steps.anomalous)) == set(slow.tolist())
    assert_consistent(r)


def test_sub_second_steps(tmp_path):
    tl = Timeline(unit=0.001).job_start(0)  # milliseconds
    tl.steps(1, 1000, start=0, step_time=3)
    tl.job_end(3000)
    r = run(tmp_path, tl, ideal=0.003)
    assert r.total_ns == 3 * NS and r.buckets_ns["productive"] == 3 * NS and r.goodput == 1
    assert r.step_time.count == 1000 and r.step_time.p50_s == pytest.approx(0.003)
    est = account(read_run_dir(tmp_path).jobs["job"], now_ns=FAR_FUTURE)
    assert est.ideal_step_time_s == pytest.approx(0.003) and est.goodput == 1


def test_nested_data_loading_is_charged_to_data_loading(tmp_path):
    tl = Timeline().job_start(0)
    for n in range(10):
        tl.step(n, n, n + 1).span(schema.DATA_LOADING, n, n + 0.25)
    tl.job_end(10)
    r = run(tmp_path, tl, ideal=0.75)
    assert r.badput_s["data_loading"] == pytest.approx(2.5)
    assert r.productive_time_s == pytest.approx(7.5) and r.badput_s["training_slowdown"] == 0
    assert r.steps.time_s.tolist() == pytest.approx([0.75] * 10)
    assert_consistent(r)


def test_async_save_is_not_badput(tmp_path):
    tl = Timeline().job_start(0)
    tl.steps(1, 10, start=0, step_time=1)
    tl.save(2, 6, step=2, blocking=False)  # background write overlapping steps 3..6
    tl.span(schema.DATA_LOADING, 7, 7.5, {schema.ATTR_BLOCKING: False})
    tl.job_end(10)
    r = run(tmp_path, tl, ideal=1)
    assert r.badput_s["checkpoint_save"] == 0 and r.badput_s["data_loading"] == 0
    assert r.productive_time_s == 10 and r.goodput == 1
    assert r.async_work_s == {"checkpoint_save": 4.0, "data_loading": 0.5}


def test_custom_badput_types(tmp_path):
    tl = Timeline().job_start(0)
    tl.steps(1, 4, start=0, step_time=1)
    tl.custom("sdc_check", 4, 6).custom("eval", 5, 8)  # overlap 5..6 goes to "eval"
    tl.custom("eval", 8, 9, blocking=False)
    tl.steps(5, 6, start=9, step_time=1)
    tl.job_end(11)
    r = run(tmp_path, tl, ideal=1)
    assert r.badput_s["custom:eval"] == 3 and r.badput_s["custom:sdc_check"] == 1
    assert r.async_work_s == {"custom:eval": 1.0}
    keys = list(r.badput_s)
    assert keys.index("training_slowdown") < keys.index("custom:eval") < keys.index("other")
    assert keys.index("custom:eval") < keys.index("custom:sdc_check")
    assert r.productive_time_s == 6 and r.badput_s["other"] == 1
    assert_consistent(r)


def test_phases_and_other(tmp_path):
    tl = Timeline().job_start(0)
    tl.span(schema.ACCELERATOR_INIT, 0, 2).span(schema.TRAINING_PREP, 2, 5)
    tl.span(schema.PROGRAM_STARTUP, 5, 6).span(schema.TRAINING_PREP, 1, 3)  # overlaps init
    tl.steps(1, 3, start=7, step_time=1).job_end(12)  # 6..7 and 10..12 uncovered
    r = run(tmp_path, tl, ideal=1)
    assert r.badput_s["accelerator_init"] == 2 and r.badput_s["training_prep"] == 3
    assert r.badput_s["program_startup"] == 1 and r.badput_s["other"] == 3
    assert r.productive_time_s == 3 and r.total_time_s == 12
    assert_consistent(r)


def test_running_attempt_ends_now(tmp_path):
    tl = Timeline().job_start(0, interval_ms=1000)
    tl.steps(1, 100, start=0, step_time=1)
    tl.write(tmp_path)
    job = read_run_dir(tmp_path).jobs["job"]
    running = account(job, ideal_step_time_s=1, now_ns=tl.ns(102))  # seen 2 s ago: alive
    assert running.attempts[0].end_reason == "running"
    assert running.total_time_s == 102 and running.badput_s["other"] == 2
    killed = account(job, ideal_step_time_s=1, now_ns=tl.ns(104))  # 4 s > 3 intervals
    assert killed.attempts[0].end_reason == "killed" and killed.total_time_s == 100


def test_killed_attempt_with_only_heartbeats(tmp_path):
    a0 = Timeline(attempt=0)
    for i in range(10):
        a0.heartbeat(i, i + 1, errors=i // 5, dropped=3 if i == 9 else None)
    a1 = Timeline(attempt=1).job_start(20)
    a1.steps(1, 10, start=20, step_time=1).job_end(30, errors=1)
    r = run(tmp_path, a0, a1, ideal=1)
    first = r.attempts[0]
    assert (first.end_reason, first.duration_s, first.resume_step) == ("killed", 10, None)
    # nothing but heartbeats: the attempt never got past its start-up
    assert r.badput_s["process_startup"] == 10 and r.badput_s["infrastructure_recovery"] == 10
    assert r.badput_s["wasted_progress"] == 0 and r.productive_time_s == 10
    assert r.total_time_s == 30 and r.disruptions == 1
    assert (r.recorder_errors, r.recorder_dropped) == (2, 3)
    assert_consistent(r)


def test_multi_process_attempt(tmp_path):
    # No process 0: process 1 is primary. Process 2 starts earlier and lives longer.
    p1 = Timeline(process=1, count=3).job_start(1)
    p1.steps(1, 10, start=2, step_time=1).job_end(12)
    p2 = Timeline(process=2, count=3).job_start(0)
    p2.steps(1, 10, start=2, step_time=2)  # a slower host: ignored for accounting
    p2.job_end(25, reason="sigterm")
    r = run(tmp_path, p1, p2, ideal=1)
    (a,) = r.attempts
    assert (a.primary_process, a.processes, a.declared_processes) == (1, 2, 3)
    assert a.hosts == ("host1", "host2") and a.end_reason == "sigterm"
    assert r.total_time_s == 25 and r.productive_time_s == 10
    # 0-2: before the primary's first step (process start-up); 12-25: after the primary's
    # end while process 2 lived on
    assert r.badput_s["process_startup"] == 2 and r.badput_s["other"] == 13
    assert r.badput_s["training_slowdown"] == 0


def test_overlapping_attempts_are_cut(tmp_path):
    a0 = Timeline(attempt=0).job_start(0)
    a0.steps(1, 10, start=0, step_time=1)  # killed, but a zombie keeps stepping to 10
    a1 = Timeline(attempt=1).job_start(8).restore(8, 9, step=5)
    a1.steps(6, 10, start=9, step_time=1).job_end(14)
    r = run(tmp_path, a0, a1, ideal=1)
    assert r.attempts[0].cut and r.attempts[0].duration_s == 8
    assert r.badput_s["wasted_progress"] == 3  # steps 6..8 (5..8 s), thrown away
    assert r.productive_time_s == 5 + 5 and r.badput_s["infrastructure_recovery"] == 0
    assert r.max_productive_step == 10
    assert_consistent(r)


def test_no_kept_steps_wastes_from_first_step(tmp_path):
    a0 = Timeline(attempt=0).job_start(0).span(schema.TRAINING_PREP, 0, 2)
    a0.steps(11, 15, start=2, step_time=1).span(schema.DATA_LOADING, 7, 8)
    a1 = Timeline(attempt=1).job_start(10).restore(10, 11, step=10)
    a1.steps(11, 12, start=11, step_time=1).job_end(13)
    r = run(tmp_path, a0, a1, ideal=1)
    assert r.badput_s["training_prep"] == 2 and r.badput_s["wasted_progress"] == 6
    assert r.attempts[0].steps_kept == 0 and r.attempts[0].steps_wasted == 5
    assert_consistent(r)


def test_bad_ideal_step_time(tmp_path):
    tl = Timeline().job_start(0).job_end(1)
    tl.write(tmp_path)
    job = read_run_dir(tmp_path).jobs["job"]
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ideal step time"):
            account(job, ideal_step_time_s=bad)


@settings(max_examples=60, deadline=None)
@given(tls=timelines(), ideal=st.sampled_from([None, 0.5, 2.0]))
def test_buckets_always_sum_to_total(tmp_path_factory, tls, ideal):
    d = tmp_path_factory.mktemp("prop")
    r = run(d, *tls, ideal=ideal)
    assert_consistent(r)
    assert r.total_ns == r.attempts[-1].end_ns - r.attempts[0].start_ns
    assert 0 <= r.goodput <= 1


def test_account_interval(tmp_path):
    """An interval's buckets are the cumulative buckets restricted to it (minutes 50-130 of
    the worked example: 5 min of steps, the 5 min save, 40 min wasted, 15 min recovery,
    5 min restore, 10 min of 3-min steps of which 1/3 is slowdown)."""
    for t in worked_example():
        t.write(tmp_path)
    job = read_run_dir(tmp_path).jobs["job"]
    t0 = worked_example()[0].ns(0)
    result, iv = account_interval(job, t0 + 50 * 60 * NS, t0 + 130 * 60 * NS, 120,
                                  now_ns=FAR_FUTURE)
    assert result.buckets_ns == account(job, 120, now_ns=FAR_FUTURE).buckets_ns
    assert iv.total_ns == 80 * 60 * NS and sum(iv.buckets_ns.values()) == iv.total_ns
    assert {k: v / (60 * NS) for k, v in iv.buckets_ns.items() if v} == pytest.approx({
        "productive": 5 + 20 / 3, "checkpoint_save": 5, "wasted_progress": 40,
        "infrastructure_recovery": 15, "checkpoint_restore": 5, "training_slowdown": 10 / 3})
    whole = account_interval(job, 0, 2**62, 120, now_ns=FAR_FUTURE)[1]
    assert whole.total_ns == result.total_ns
    assert all(abs(whole.buckets_ns[k] - v) <= 1 for k, v in result.buckets_ns.items())
    with pytest.raises(ValueError, match="does not overlap"):
        account_interval(job, 0, t0 - NS, now_ns=FAR_FUTURE)


def test_mfu_from_run_attributes(tmp_path):
    """MFU = flops/step x kept steps / (productive s x peak x devices); useful = goodput x MFU."""
    attrs = {schema.RES_RUN_NAME: "sweep-1", schema.RES_FLOPS_PER_STEP: 4 * 10**12,
           schema.RES_PEAK_FLOPS: 10**12, schema.RES_DEVICE_COUNT: 8}
    t = Timeline(**attrs).job_start(0).span("training_prep", 0, 10)
    t.steps(1, 90, start=10, step_time=1).job_end(100)
    r = run(tmp_path, t)
    # 90 steps x 4 TFLOP in 90 productive s on 8 x 1 TFLOP/s = 0.5; goodput 0.9
    assert r.mfu == pytest.approx(0.5) and r.useful_compute == pytest.approx(0.45)
    assert r.run[schema.RES_RUN_NAME] == "sweep-1"
    plain = run(tmp_path / "plain", Timeline().job_start(0).steps(1, 5, 0, 1).job_end(5))
    assert plain.mfu is None and plain.useful_compute is None and plain.run == {}
    from goodput_processor import to_json_dict

    doc = to_json_dict([r])["jobs"][0]
    assert doc["mfu"] == pytest.approx(0.5) and doc["run"][schema.RES_DEVICE_COUNT] == 8
