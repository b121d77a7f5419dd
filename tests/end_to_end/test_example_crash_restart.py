"""End to end: SIGKILL a real PyTorch training job, restart it, check the report.

Runs ``examples/crash_restart.py`` as a real OS process (``tests/crash_run.py``, once per
session, shared with ``tests/html/test_html_report.py``): it trains the digits MLP of
``examples/pytorch_digits/train.py``, kills it with SIGKILL after a checkpoint, restarts
it (the restart resumes from the last checkpoint) and writes what it measured itself
(``ground_truth.json``). The test then runs ``goodput report --format json`` on the run
directory and compares.

Takes about 15-20 s (two Python processes importing torch, 175 steps, a restart delay).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from crash_run import KILL_AT_STEP, REPO, RESTART_DELAY_S, STEPS, TOLERANCE_S, env

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "sklearn")),
    reason="the example needs torch and scikit-learn (pip install goodput-otel[examples])",
)


@pytest.fixture(scope="module")
def crash_run(crash_restart_truth: dict) -> tuple[dict, dict]:
    """The shared run's ground truth and the job's entry of its JSON report."""
    truth = crash_restart_truth
    rep = subprocess.run(
        [sys.executable, "-m", "goodput_processor.cli", "report", truth["run_dir"]]
        + ["--format", "json"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rep.returncode == 0, f"goodput report failed:\n{rep.stdout}\n{rep.stderr}"
    report = json.loads(rep.stdout)
    assert report["schema"] == "goodput.report/1"
    jobs = [j for j in report["jobs"] if j["job"] == "digits-crash"]
    assert len(jobs) == 1, report
    return truth, jobs[0]


def test_driver_killed_and_resumed(crash_run: tuple[dict, dict]) -> None:
    """The scenario happened as planned: killed past step 60, restarted from step 60."""
    truth, _ = crash_run
    assert truth["last_checkpoint_step"] == 60
    assert truth["kill_step"] >= KILL_AT_STEP
    # Large enough that a report with no wasted progress at all would fail.
    assert truth["wasted_progress_s"] > TOLERANCE_S + 0.5
    assert truth["infrastructure_recovery_s"] >= RESTART_DELAY_S


def test_two_attempts_one_disruption(crash_run: tuple[dict, dict]) -> None:
    """One restart: two attempts, one disruption."""
    _, job = crash_run
    assert len(job["attempts"]) == 2
    assert job["disruptions"] == 1


def test_wasted_progress_matches_truth(crash_run: tuple[dict, dict]) -> None:
    """Wasted progress = kill - end of the last checkpoint save, within TOLERANCE_S."""
    truth, job = crash_run
    got = job["badput_s"]["wasted_progress"]
    assert got == pytest.approx(truth["wasted_progress_s"], abs=TOLERANCE_S)


def test_infrastructure_recovery_matches_truth(crash_run: tuple[dict, dict]) -> None:
    """Infrastructure recovery = restart - kill, within TOLERANCE_S."""
    truth, job = crash_run
    got = job["badput_s"]["infrastructure_recovery"]
    assert got == pytest.approx(truth["infrastructure_recovery_s"], abs=TOLERANCE_S)


def test_buckets_sum_to_total(crash_run: tuple[dict, dict]) -> None:
    """Productive time plus every badput bucket is the total time."""
    truth, job = crash_run
    total = job["total_time_s"]
    assert job["productive_time_s"] + sum(job["badput_s"].values()) == pytest.approx(
        total, abs=1e-6
    )
    # From the first process start to the clean end of the second attempt: a
    # little less than what the driver saw from launch to exit.
    # (+20 ms: the process start time read from /proc has a 10 ms resolution.)
    assert 0 < total <= truth["total_time_upper_s"] + 0.02
    assert job["goodput"] == pytest.approx(job["productive_time_s"] / total, abs=1e-6)


def test_phases_are_accounted(crash_run: tuple[dict, dict]) -> None:
    """Training, saves, the restore and the evaluations all show up."""
    _, job = crash_run
    badput = job["badput_s"]
    assert job["productive_time_s"] > 0
    assert badput["checkpoint_save"] > 0
    assert badput["checkpoint_restore"] > 0
    assert badput["custom:eval"] > 0


def test_max_productive_step_is_final_step(crash_run: tuple[dict, dict]) -> None:
    """The second attempt trained to the end and its steps are kept."""
    _, job = crash_run
    assert job["max_productive_step"] == STEPS
