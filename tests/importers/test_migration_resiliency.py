"""Acceptance: a realistic multi-node ``resiliency`` event log imports, deduplicates per node,
and reports the same goodput as the resiliency calculator plus this project's full breakdown.

The log is what ``resiliency.goodput_measure`` writes for a 300-node job with four attempts:
every node's launcher logs ``job_started``/``job_terminated`` with its ``node_rank`` (some
twice), rank 0 logs ``checkpoint_loaded``/``checkpoint_saved``, the user's tooling logs
``user_scheduled`` and ``user_terminated``; the lines arrive shuffled (many writers).

``test_generated_logs`` imports logs of ``benchmarks/resiliency_logs.py``: 100+ nodes whose
restarts are mostly pod kills that log no ``job_terminated``, with nodes missing from
launches, launches that die before loading, duplicate and shuffled lines; every bucket must
match the generator's truth.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from goodput_processor import report_run_dir
from goodput_processor.cli import main
from goodput_processor.definitions import report as definitions_report
from goodput_processor.importers import import_logs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import resiliency_logs  # noqa: E402  (benchmarks/: the generator, also a command)

NODES, ATTEMPTS, REF_S = 300, 4, 1.5
SAVE_EVERY, STEP_TIME = 100, (1.5, 1.5, 1.8, 1.5)  # seconds per step, per attempt
EVENT_ORDER = {"user_scheduled": 0, "job_started": 1, "checkpoint_loaded": 2,
               "checkpoint_saved": 3, "user_terminated": 4, "job_terminated": 5}


def build_log(seed=7):
    """-> (rows, truth): the event lines and the generator's true times (seconds)."""
    rng = random.Random(seed)
    rows, truth = [], {"restore": 0.0, "recovery": 0.0, "wasted": 0.0, "prep": 0.0,
                       "other": 0.0, "startup": 0.0, "stretch": 0.0, "slowdown": 0.0,
                       "dups": 0}
    t0 = datetime(2025, 9, 27, 4, 0, 0)

    def ev(t, kind, **kw):
        rows.append({"timestamp": (t0 + timedelta(seconds=t)).isoformat(),
                     "job_name": "llm-300", "event_type": kind, **kw})

    ev(0.0, "user_scheduled")
    t, step, prev_end = 42.0, 0, None  # 42 s in the queue, until the first node starts
    for a in range(ATTEMPTS):
        starts = [t + rng.uniform(0, 8) for _ in range(NODES)]
        for n, s in enumerate(starts):
            ev(s, "job_started", node_rank=n)
            if rng.random() < 0.1:  # a launcher that logs its start twice
                ev(s + rng.uniform(0.1, 3), "job_started", node_rank=n)
                truth["dups"] += 1
        a_start = min(starts)
        if prev_end is None:
            truth["scheduling"] = a_start
        else:
            truth["recovery"] += a_start - prev_end
        # before rank 0 starts: start-up (in the first attempt the scheduling span came
        # first, so there it is time no span covers)
        truth["startup" if a else "other"] += starts[0] - a_start
        loaded_at = starts[0] + rng.uniform(20, 40)
        ev(loaded_at, "checkpoint_loaded", step=step)
        truth["prep" if step == 0 else "restore"] += loaded_at - starts[0]
        t = loaded_at
        saves = 6 if a < ATTEMPTS - 1 else 8
        for _ in range(saves):
            stretch = SAVE_EVERY * STEP_TIME[a] + rng.uniform(0, 2)  # save time included
            t += stretch
            step += SAVE_EVERY
            ev(t, "checkpoint_saved", step=step)
            if STEP_TIME[a] > REF_S * 1.05:  # beyond the 5 % noise floor: slowdown
                truth["slowdown"] += stretch - SAVE_EVERY * REF_S
        last_save = t
        if a < ATTEMPTS - 1:  # crash: 70 more steps done, thrown away
            t += 70 * STEP_TIME[a]
        else:
            ev(t + 1, "user_terminated")
        ends = []
        for n in range(NODES):
            e = t + rng.uniform(1, 6)
            ev(e, "job_terminated", node_rank=n)
            ends.append(e)
            if rng.random() < 0.05:  # logged twice: the node's end is the last one
                e += rng.uniform(0.1, 1)
                ev(e, "job_terminated", node_rank=n)
                ends.append(e)
                truth["dups"] += 1
        prev_end = max(ends)
        truth["stretch"] += last_save - loaded_at
        if a < ATTEMPTS - 1:
            truth["wasted"] += prev_end - last_save
        else:
            truth["other"] += prev_end - last_save
        t = prev_end + rng.uniform(60, 180)  # the infrastructure restarts the job
    rng.shuffle(rows)
    return rows, truth


def calculator_goodput(rows, reference_step_time):
    """The resiliency calculator's goodput, from its documented formula (README primer and
    ``calculator.py``): events sorted by (timestamp, event order); total runtime = last event
    - first event; effective time = (max saved step - min loaded step) x reference step time."""
    events = sorted(rows, key=lambda e: (e["timestamp"], EVENT_ORDER[e["event_type"]]))
    total = (datetime.fromisoformat(events[-1]["timestamp"])
             - datetime.fromisoformat(events[0]["timestamp"])).total_seconds()
    loaded = min(e["step"] for e in events if e["event_type"] == "checkpoint_loaded")
    saved = max(e["step"] for e in events if e["event_type"] == "checkpoint_saved")
    return 100 * (saved - loaded) * reference_step_time / total, total


def test_multi_node_resiliency_log(tmp_path, capsys):
    rows, truth = build_log()
    log = tmp_path / "llm-300-goodput.log"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = import_logs([log], tmp_path / "runs")
    assert not summary.problems
    assert summary.duplicates == truth["dups"] > 0  # dropped per node, and counted
    job = summary.jobs["llm-300"]
    assert (job.attempts, job.processes) == (ATTEMPTS, NODES)

    # --definitions resiliency: the calculator's number
    expected_pct, total = calculator_goodput(rows, REF_S)
    (res,) = definitions_report(tmp_path / "runs" / "llm-300", "resiliency",
                                ideal_step_time_s=REF_S)
    assert res.goodput_percent == pytest.approx(expected_pct, rel=1e-9)
    assert res.total_time_s == pytest.approx(total, abs=1e-6)
    assert (res.min_loaded_step, res.max_saved_step) == (0, 3 * 600 + 800)
    assert res.job_started_count == ATTEMPTS
    assert main(["report", str(tmp_path / "runs" / "llm-300"), "--definitions", "resiliency",
                 "--ideal-step-time", str(REF_S)]) == 0
    assert f"{expected_pct:.2f} %" in capsys.readouterr().out

    # this project's full breakdown of the same log
    (r,) = report_run_dir(tmp_path / "runs" / "llm-300", ideal_step_time_s=REF_S)
    s = r.badput_s
    assert r.total_time_s == pytest.approx(total, abs=1e-6)
    assert sum(r.buckets_ns.values()) == r.total_ns
    assert s["custom:scheduling"] == pytest.approx(truth["scheduling"], abs=1e-5)
    assert s["infrastructure_recovery"] == pytest.approx(truth["recovery"], abs=1e-5)
    # the log has no restore duration: a node's start -> checkpoint_loaded (step > 0) is
    # start-up and restore together, its own bucket; the restore span is zero-length
    assert s["custom:startup_and_restore"] == pytest.approx(truth["restore"], abs=1e-5)
    assert s["checkpoint_restore"] == 0
    assert s["training_prep"] == pytest.approx(truth["prep"], abs=1e-5)
    assert s["wasted_progress"] == pytest.approx(truth["wasted"], abs=1e-5)
    assert r.productive_time_s + s["training_slowdown"] == pytest.approx(truth["stretch"],
                                                                         abs=1e-5)
    assert s["other"] == pytest.approx(truth["other"], abs=1e-5)
    assert s["process_startup"] == pytest.approx(truth["startup"], abs=1e-5)
    # the slow attempt (1.8 s per step against 1.5) is slowdown, the others are within 5 %
    assert s["training_slowdown"] == pytest.approx(truth["slowdown"], abs=1e-5)
    assert truth["slowdown"] > 6 * 100 * 0.3
    assert [a.resume_step for a in r.attempts] == [0, 600, 1200, 1800]
    assert [(a.steps_kept, a.steps_wasted) for a in r.attempts] == [(600, 0)] * 3 + [(800, 0)]
    assert [(a.processes, a.declared_processes) for a in r.attempts] == [(NODES, NODES)] * 4


@pytest.mark.parametrize("seed, config", [
    (1, resiliency_logs.Config(nodes=112, attempts=10)),
    (2, resiliency_logs.Config(nodes=104, attempts=10)),
    (3, resiliency_logs.Config(nodes=120, attempts=10, p_dead=0.3, p_old_checkpoint=0.3)),
    # few nodes, often missing: the first start of a wave is often a node absent before
    (4, resiliency_logs.Config(nodes=5, attempts=14, p_missing=0.9, start_spread_s=(2, 8))),
], ids=["112-nodes", "104-nodes", "120-nodes-more-deaths", "5-nodes-missing"])
def test_generated_logs(tmp_path, seed, config):
    """Restarts found from evidence: every bucket within 1 s of the generator's truth, the
    right number of attempts, and --definitions resiliency equal to the calculator."""
    gen = resiliency_logs.generate(seed, config)
    log = tmp_path / "job.log"
    resiliency_logs.write_log(log, gen)
    assert gen.killed > (gen.attempts - 1) / 2  # most restarts: no job_terminated at all
    summary = import_logs([log], tmp_path / "runs")
    assert not summary.problems and summary.duplicates == gen.duplicates > 0
    job = summary.jobs[config.job]
    assert (job.attempts, job.processes) == (gen.attempts, gen.nodes)

    (r,) = report_run_dir(job.run_dir, ideal_step_time_s=config.ref_step_s)
    got = {"productive": r.productive_time_s, **r.badput_s}
    assert len(r.attempts) == gen.attempts
    assert [a.resume_step for a in r.attempts] == gen.resume_steps
    for bucket in sorted(set(got) | set(gen.truth)):
        assert got.get(bucket, 0) == pytest.approx(gen.truth.get(bucket, 0), abs=1), bucket
    assert got["checkpoint_restore"] == 0  # the log has no restore duration

    expected_pct, total = calculator_goodput(gen.rows, config.ref_step_s)
    (res,) = definitions_report(job.run_dir, "resiliency", ideal_step_time_s=config.ref_step_s)
    assert res.total_time_s == pytest.approx(total, abs=1e-6)
    assert res.goodput_percent == pytest.approx(expected_pct, rel=1e-9)
    assert (res.min_loaded_step, res.max_saved_step) == (gen.min_loaded_step,
                                                         gen.max_saved_step)
