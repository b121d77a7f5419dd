"""MaxText's goodput integration runs unchanged against ``goodput.mgm`` (only its import
changed), on a small real JAX loop on CPU, killed once with SIGKILL and restarted; the
monitor's TensorBoard scalars, read back with ``EventAccumulator``, equal ``goodput report
--definitions mgm``.

The program is ``maxtext_child.py``: MaxText's recorder, monitor, elastic and
``GCPOptions`` calls (``common/goodput.py``, ``utils/elastic_utils.py``) with
``elastic_enabled`` (so ``ElasticGoodputRecorder`` and ``ElasticGoodputMonitor``), Orbax
checkpoints every 5 steps, and a slice that goes down inside step 6 (elastic wait,
reinitialisation, steps repeated from checkpoint 5). The first process is killed after
step 12; the second resumes from checkpoint 10 and ends at step 19. Takes about 15 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")
pytest.importorskip("tensorboard")

from goodput_processor import cli  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")

CHILD = Path(__file__).resolve().parents[1] / "maxtext_child.py"
RUN = "maxtext-run"
KILL_AFTER = 12


def _config(tmp_path) -> dict:
    return {
        "run_name": RUN, "tensorboard_dir": str(tmp_path / "tb"), "monitor_goodput": True,
        "report_performance_metric_for_gcp_monitoring": False,
        "enable_gcp_goodput_metrics": True, "enable_gcp_step_deviation_metrics": True,
        "elastic_enabled": True, "goodput_upload_interval_seconds": 1,
        "monitor_step_time_deviation": True, "step_deviation_interval_seconds": 10,
        "enable_pathways_goodput": False, "enable_goodput_recording": True,
        "checkpoint_dir": str(tmp_path / "ckpt"), "steps": 20, "checkpoint_period": 5,
        "step_sleep": 0.1, "slice_down_at_step": 6, "elastic_wait_s": 0.3,
    }


def _env(tmp_path) -> dict:
    drop = ("GOODPUT_", "OTEL_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "JAX_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(GOODPUT_RUN_DIR=str(tmp_path / "run"), GOODPUT_FLUSH_INTERVAL_S="0.2",
               JAX_PLATFORMS="cpu")
    return env


def _last_points(logdir: Path) -> dict[str, tuple[int, float]]:
    """``tag -> (step, value)`` of each scalar's most recent point (by wall time)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    acc = EventAccumulator(str(logdir), size_guidance={SCALARS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        ev = max(acc.Scalars(tag), key=lambda e: e.wall_time)
        out[tag] = (ev.step, ev.value)
    return out


def test_maxtext_killed_and_restarted(tmp_path, capsys):
    config, env = json.dumps(_config(tmp_path)), _env(tmp_path)
    first = subprocess.Popen([sys.executable, str(CHILD), config], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        lines = []
        for line in first.stdout:
            lines.append(line.strip())
            if line.strip() == f"STEP {KILL_AFTER}":
                first.send_signal(signal.SIGKILL)
                break
        assert first.wait(30) == -signal.SIGKILL, lines
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert "elastic event: slice 3 went down in step 6" in lines
    assert lines.count("STEP 5") == 2  # steps 5 and 6 again after the elastic event
    second = subprocess.run([sys.executable, str(CHILD), config], capture_output=True,
                            text=True, env=env, timeout=120)
    assert second.returncode == 0, second.stderr[-2000:]
    steps = [int(line.split()[1]) for line in second.stdout.splitlines()
             if line.startswith("STEP")]
    assert steps == list(range(10, 20)) and second.stdout.rstrip().endswith("DONE")

    capsys.readouterr()
    assert cli.main(["report", str(tmp_path / "run"), "--definitions", "mgm",
                     "--format", "json"]) == 0
    (mgm,) = json.loads(capsys.readouterr().out)["jobs"]
    assert cli.main(["report", str(tmp_path / "run"), "--format", "json"]) == 0
    (native,) = json.loads(capsys.readouterr().out)["jobs"]

    # the job is what it should be: two attempts (the kill), elastic time, slice counts
    assert [a["end_reason"] for a in native["attempts"]] == ["killed", "explicit"]
    assert native["badput_s"]["elastic_slice_down"] > 0.3 - 0.05
    assert native["badput_s"]["elastic_reinitialization"] > 0
    assert native["badput_s"]["wasted_progress"] > 0  # steps 5-6 of the first try, 10-12
    assert native["slice_efficiency"]["stepping"] < 1
    assert mgm["elastic"] and mgm["disruptions"] == 2  # step 5 and step 10 seen twice
    assert mgm["badput_percent"]["ELASTIC_SLICE_DOWN"] > 0

    logdir = tmp_path / "tb" / "goodput"
    assert len(list(logdir.glob("events.out.tfevents.*"))) >= 2  # both processes wrote
    points = _last_points(logdir)
    expected = {"goodput/goodput": mgm["goodput_percent"]}
    for name, value in mgm["badput_percent"].items():
        if isinstance(value, dict):
            expected.update({f"badput/{name.lower()}/{t.lower()}": v for t, v in value.items()})
        else:
            expected[f"badput/{name.lower()}"] = value
    assert set(points) == set(expected)  # MaxText starts no step-deviation uploader
    for tag, value in expected.items():
        step, got = points[tag]
        assert step == mgm["max_productive_step"] == 19, tag
        assert got == pytest.approx(value, rel=1e-6, abs=1e-6), tag  # float32 in the file
