"""The benchmarks' job shapes (``benchmarks/recorded_job.py``, issue 40): restarts and the
incumbent-like shape, recorded by the real recorder and read back by ``goodput report``.

``own`` keeps the restarts the benchmarks always drew (so earlier figures stay comparable);
``incumbent`` is 1 s steps, a checkpoint every 100 steps, an ``eval`` every 500 and evenly
spaced restarts, each redoing the steps since its last checkpoint.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from goodput_processor.cli import main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import recorded_job  # noqa: E402


def test_own_shape_keeps_its_random_restarts():
    """The own shape's kills are the draw the benchmarks made before shapes existed."""
    rng = random.Random(0)
    assert recorded_job.kill_steps(10_000, 3) == sorted(
        rng.randrange(1_000, 10_000) for _ in range(3))
    assert recorded_job.job_name(10_000) == "10000"  # kept spools keep their names


def test_incumbent_shape_restarts_evenly():
    """200 restarts at 10^6 steps: 201 attempts, one kill about every 5,000 steps, each
    past a checkpoint (steps to redo)."""
    kills = recorded_job.kill_steps(1_000_000, 200, "incumbent")
    assert len(kills) == 200
    assert kills[0] == 1_000_000 // 201 + 50
    assert sum(k % 100 != 0 for k in kills) >= 190  # (most redo steps after a checkpoint)
    gaps = {b - a for a, b in zip(kills, kills[1:], strict=False)}
    assert gaps <= {4975, 4976}
    state = recorded_job.state_of(1_000_000, 200, "incumbent", running=True)
    assert (state["step_s"], state["ckpt_every"], state["eval_every"]) == (1.0, 100, 500)
    assert state["kill_at"][-1] == 1_000_000 and state["steps"] == 1_000_001
    with pytest.raises(ValueError):
        recorded_job.kill_steps(1000, -1)


def test_incumbent_shape_as_recorded_and_reported(tmp_path, capsys):
    """The recorder's spool of 1,200 steps with 2 restarts in the incumbent shape: three
    attempts of 400 kept steps, 50 redone after each kill, 12 saves of 2 s, two 5 s evals,
    1 s steps."""
    run = tmp_path / "run"
    info = recorded_job.write_job(str(run), 1200, restarts=2, shape="incumbent",
                                  env={"PYTHONPATH": str(ROOT / "src")})
    assert info["attempts"] == 3
    assert main(["report", str(run), "--format", "json", "--no-cache"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert [(a["steps_kept"], a["steps_wasted"], a["end_reason"]) for a in job["attempts"]] \
        == [(400, 50, "killed"), (400, 50, "killed"), (400, 0, "exit")]
    assert job["max_productive_step"] == 1200
    assert job["badput_s"]["checkpoint_save"] == pytest.approx(24.0)
    assert job["badput_s"]["custom:eval"] == pytest.approx(10.0)
    assert job["ideal_step_time_s"] == pytest.approx(1.0, rel=0.05)
