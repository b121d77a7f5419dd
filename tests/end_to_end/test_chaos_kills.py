"""Chaos (CI sample): the real training example killed by SIGKILL, SIGTERM and an exception.

A small seeded sample of ``benchmarks/chaos_kills.py`` (the full run is 100 trials):
four trials (each kind mid-training, and a SIGKILL during start-up), each a real PyTorch
process (``examples/pytorch_digits/
train.py``) disrupted at a seeded random point, restarted from its last checkpoint and
finished; then ``goodput report --format json`` is run as a real process and compared
with what the driver saw. See ``docs/reliability.md`` for the tolerance.

Takes about 50 s (eight Python processes importing torch).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from instr_util import load_benchmark

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "sklearn"))
    or sys.platform == "win32",
    reason="needs torch and scikit-learn (pip install goodput-otel[examples]) and POSIX signals",
)

# Seeded plan: an exception in step 26, SIGKILL in step 25, SIGTERM in step 22 and a
# SIGKILL 1.3 s after launch (during start-up, before any step).
SEED = 20261135
N_TRIALS = 4


chaos = load_benchmark("chaos_kills")
CFG = chaos.Config(steps=30, ckpt_every=10, eval_every=15, step_sleep=0.03, flush_interval=0.5)


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> list:
    """The seeded trials, run to the end (failures recorded, not raised)."""
    workdir = tmp_path_factory.mktemp("chaos")
    planned = chaos.plan_trials(N_TRIALS, SEED, CFG)
    return [chaos.run_trial(t, CFG, workdir) for t in planned]


def test_plan_is_seeded_and_covers_every_kind() -> None:
    """Same seed, same plan; three trials cover the three kinds; faults after a checkpoint."""
    a = chaos.plan_trials(9, SEED, CFG)
    b = chaos.plan_trials(9, SEED, CFG)
    assert [(t.kind, t.fault_step, t.delay_steps, t.restart_delay) for t in a] == [
        (t.kind, t.fault_step, t.delay_steps, t.restart_delay) for t in b
    ]
    assert sorted(t.kind for t in a[:3]) == sorted(chaos.KINDS)
    for t in a:
        if t.startup_delay is None:  # mid-training: after the first checkpoint
            assert CFG.ckpt_every < t.fault_step < CFG.steps
        else:  # during start-up: a signal, no step
            assert t.kind != "exception" and t.fault_step == 0
    assert chaos.plan_trials(9, SEED + 1, CFG) != a


def test_every_trial_passes_its_checks(trials: list) -> None:
    """Report runs, end reason, flushed steps present, buckets, errors within tolerance."""
    assert {t.kind for t in trials} == set(chaos.KINDS)
    assert [t.startup_delay is not None for t in trials] == [False, False, False, True]
    failed = {t.kind: t.failures for t in trials if t.failures}
    assert not failed, "\n" + chaos.summarize(trials, CFG)


def test_end_reasons(trials: list) -> None:
    """SIGKILL and SIGTERM leave no marker (killed: no handler delays the signal); the
    exception writes its own."""
    expected = {"sigkill": "killed", "sigterm": "killed", "exception": "exception"}
    assert [t.end_reason for t in trials] == [expected[t.kind] for t in trials]


def test_flushed_steps_are_there(trials: list) -> None:
    """Everything flushed before the fault is in the report's first attempt."""
    for t in trials:
        assert t.steps_required is not None and t.steps_recorded is not None
        assert t.steps_recorded >= t.steps_required, t
        if t.kind == "exception":
            # The end marker flushes everything: every step the driver saw is there.
            assert t.steps_recorded >= t.kill_step_seen, t
        # Nothing invented: no more steps than the one in flight at the fault (a kill up
        # to 1.5 step times after step fault_step - 1 ended lands in step fault_step + 1).
        assert t.steps_recorded <= t.fault_step + (t.kind != "exception"), t


def test_wasted_and_recovery_match_truth(trials: list) -> None:
    """Within flush interval + slack (SIGKILL, SIGTERM) or the slack (exception)."""
    for t in trials:
        tol = CFG.tol_marked if t.kind == "exception" else CFG.tol_killed
        assert t.truth_recovery_s >= t.restart_delay
        if t.startup_delay is None:
            assert t.truth_wasted_s > 0
        else:  # killed before any step: nothing to throw away
            assert t.truth_wasted_s == 0 and t.report_wasted_s == 0 and t.steps_recorded == 0
        assert t.report_wasted_s == pytest.approx(t.truth_wasted_s, abs=tol), t
        assert t.report_recovery_s == pytest.approx(t.truth_recovery_s, abs=tol), t
        # A killed attempt ends at its last sign of life: never after the kill.
        if t.kind != "exception":
            assert t.report_end <= t.truth_end + CFG.slack, t
