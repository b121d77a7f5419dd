"""The examples of docs/definitions.md, built as real spool files: every figure in its
tables is asserted here, under the three definitions."""

from __future__ import annotations

import pytest
from otlp_fixtures import Timeline

from goodput_processor import account, read_run_dir
from goodput_processor.definitions.mgm import account_mgm
from goodput_processor.definitions.resiliency import account_resiliency

FAR_FUTURE = 2**62
MIN = 60


def load(tmp_path, *timelines):
    for t in timelines:
        t.write(tmp_path)
    return read_run_dir(tmp_path).jobs["job"]


def approx_dict(d, scale=1.0):
    return {k: pytest.approx(v * scale, abs=1e-6) for k, v in d.items()}


def example_1():
    """Seconds: the incumbent's README loop with an eval inside step 5."""
    t = Timeline(attempt=0)
    t.job_start(0).span("accelerator_init", 1, 2).span("training_prep", 2, 4)
    t.span("data_loading", 4, 5)
    starts = [5, 10, 12, 14, 16, 18, 23, 25, 27, 29, 31]
    for n in range(10):
        t.step(n, starts[n], starts[n + 1])
    t.custom("eval_step", 20, 23).job_end(31)
    return (t,)


def test_example_1(tmp_path):
    job = load(tmp_path, *example_1())
    ours = account(job, now_ns=FAR_FUTURE)
    assert ours.total_time_s == 31 and ours.goodput == pytest.approx(20 / 31)
    assert f"{ours.goodput * 100:.2f}" == "64.52"
    assert {k: v for k, v in ours.badput_s.items() if v} == approx_dict({
        "accelerator_init": 1, "training_prep": 2, "data_loading": 1,
        "training_slowdown": 3, "custom:eval_step": 3, "process_startup": 1})
    mgm = account_mgm(job, now_ns=FAR_FUTURE)
    assert mgm.total_time_s == pytest.approx(31)
    assert mgm.productive_time_s == pytest.approx(20)
    assert {k: v for k, v in mgm.badput_s.items() if v} == approx_dict({
        "TPU_INITIALIZATION": 1, "TRAINING_PREP": 2, "DATA_LOADING_SYNC": 1,
        "PROGRAM_STARTUP": 3, "OTHER": 1})
    assert mgm.custom_badput_s == approx_dict({"EVAL_STEP": 3})
    res = account_resiliency(job, 2.0, now_ns=FAR_FUTURE)
    assert res.goodput == 0 and res.max_saved_step is None


def example_2():
    """Minutes: the resiliency primer (docs/accounting.md's checked example)."""
    a0 = Timeline(attempt=0, unit=MIN)
    a0.job_start(0).restore(0, 5, step=25)
    a0.steps(26, 50, start=5, step_time=2)
    a0.save(55, 60, step=50)
    a0.steps(51, 70, start=60, step_time=2)  # killed at 100
    a1 = Timeline(attempt=1, unit=MIN)
    a1.job_start(115).restore(115, 120, step=50)
    a1.steps(51, 75, start=120, step_time=3)
    a1.save(195, 200, step=75).job_end(200)
    return a0, a1


def test_example_2(tmp_path):
    job = load(tmp_path, *example_2())
    ours = account(job, ideal_step_time_s=2 * MIN, now_ns=FAR_FUTURE)
    assert ours.goodput == 0.5 and ours.productive_time_s == 100 * MIN
    assert {k: v for k, v in ours.badput_s.items() if v} == approx_dict({
        "checkpoint_save": 10, "checkpoint_restore": 10, "wasted_progress": 40,
        "infrastructure_recovery": 15, "training_slowdown": 25}, MIN)
    mgm = account_mgm(job, now_ns=FAR_FUTURE)
    assert mgm.goodput == pytest.approx(0.625)
    assert mgm.productive_time_s == pytest.approx(125 * MIN)
    assert {k: v for k, v in mgm.badput_s.items() if v} == approx_dict({
        "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME": 10, "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME": 10,
        "WASTED_PROGRESS_FROM_DISRUPTION": 38,
        "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 17}, MIN)
    assert mgm.disruptions == 1
    res = account_resiliency(job, 2 * MIN, now_ns=FAR_FUTURE)
    assert (res.min_loaded_step, res.max_saved_step, res.goodput) == (25, 75, 0.5)


def example_3():
    """Minutes: preempted right after a checkpoint of the last step; resumes at step 11."""
    a0 = Timeline(attempt=0, unit=MIN)
    a0.job_start(0).steps(1, 10, start=0, step_time=1).save(10, 11, step=10)
    a0.job_end(11, reason="sigterm")
    a1 = Timeline(attempt=1, unit=MIN)
    a1.job_start(20).restore(20, 21, step=10).steps(11, 20, start=21, step_time=1).job_end(31)
    return a0, a1


def test_example_3(tmp_path):
    job = load(tmp_path, *example_3())
    ours = account(job, now_ns=FAR_FUTURE)
    assert ours.productive_time_s == 20 * MIN and f"{ours.goodput * 100:.2f}" == "64.52"
    assert ours.disruptions == 1
    assert {k: v for k, v in ours.badput_s.items() if v} == approx_dict({
        "checkpoint_save": 1, "checkpoint_restore": 1, "infrastructure_recovery": 9}, MIN)
    assert sum(ours.buckets_ns.values()) == ours.total_ns
    mgm = account_mgm(job, now_ns=FAR_FUTURE)
    assert mgm.productive_time_s == pytest.approx(30 * MIN)
    assert f"{mgm.goodput * 100:.2f}" == "96.77"
    assert mgm.disruptions == 0
    assert mgm.badput_s["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == 0
    assert mgm.badput_s["OTHER"] == 0  # would be -1 min: clamped
    flat = sum(v for k, v in mgm.badput_s.items() if k != "DATA_LOADING_ASYNC")
    assert mgm.productive_time_s + flat == pytest.approx(32 * MIN)  # > the 31 min total


def test_cli_definitions(tmp_path, capsys):
    """``goodput report --definitions``: JSON and tables for each, usage errors."""
    import json

    from goodput_processor.cli import main

    for t in example_2():
        t.write(tmp_path)
    assert main(["report", str(tmp_path), "--definitions", "mgm", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "goodput.definitions/1" and doc["definitions"] == "mgm"
    assert doc["jobs"][0]["goodput"] == pytest.approx(0.625)
    args = ["report", str(tmp_path), "--definitions", "resiliency"]
    assert main(args + ["--ideal-step-time", "120", "--format", "json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert (job["goodput"], job["min_loaded_step"], job["max_saved_step"]) == (0.5, 25, 75)
    assert main(args + ["--ideal-step-time", "120"]) == 0
    out = capsys.readouterr().out
    assert "50.00 %" in out and "max saved step" in out
    assert main(["report", str(tmp_path), "--definitions", "mgm"]) == 0
    assert "62.50" in capsys.readouterr().out
    assert main(args) == 2
    assert "needs --ideal-step-time" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--definitions", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    # a log mgm's own rules cannot compute: a SIGTERM end, then a killed attempt
    bad = tmp_path / "bad"
    Timeline(attempt=0).job_start(0).steps(1, 5, 0, 1).job_end(5, reason="sigterm").write(bad)
    Timeline(attempt=1).job_start(10).steps(3, 9, 10, 1).write(bad)
    assert main(["report", str(bad), "--definitions", "mgm", "--format", "json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["job"] == "job" and "invalid" in job["error"].lower()
    assert main(["report", str(bad), "--definitions", "mgm"]) == 0
    assert "no mgm result" in capsys.readouterr().out
