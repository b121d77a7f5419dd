"""One real SIGKILL-and-restart PyTorch run of ``examples/crash_restart.py``, shared.

``tests/end_to_end/test_example_crash_restart.py`` (the report's JSON against the driver's
truth) and
``tests/html/test_html_report.py`` (the HTML report of the same run in Chromium) only read the
run: ``tests/conftest.py`` runs it once per session (:func:`run`) instead of once per
module. The driver trains the digits MLP of ``examples/pytorch_digits/train.py``, SIGKILLs
it ``KILL_AT_STEP - CKPT_EVERY`` steps after its first checkpoint, restarts it after
``RESTART_DELAY_S`` (it resumes from that checkpoint) and writes what it measured
(``ground_truth.json``: seconds and steps). Takes about 15-20 s (two Python processes
importing torch, 175 steps, a restart delay).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "examples" / "crash_restart.py"
JOB = "digits-crash"

FLUSH_INTERVAL_S = 0.5
# Nothing is written after a SIGKILL, but the spool tail (goodput.tail) holds every
# record made before it, so the killed attempt ends at its last recorded step start,
# not at its last flush: the flush interval no longer widens the tolerance
# (benchmarks/kill_tail.py: within 0.044 s over 10 kills). 0.5 s covers a child
# start-up delayed on a busy machine and the gap between a checkpoint file's mtime
# (the last write) and the end of its save span.
TOLERANCE_S = 0.5

STEPS = 130
CKPT_EVERY = 60
# Killed at step 105, 45 steps after the checkpoint of step 60: about 1.9 s of
# wasted progress at ~42 ms a step, well above TOLERANCE_S, so a report that
# missed the wasted progress altogether would fail; 15 steps before the next
# checkpoint, for a kill that lands late on a busy machine.
KILL_AT_STEP = 105
STEP_SLEEP_S = 0.04
# Twice TOLERANCE_S: a report that missed the recovery altogether would fail.
RESTART_DELAY_S = 1.0


def env() -> dict[str, str]:
    """The children's environment: this checkout's ``src`` and ``collectors`` first."""
    out = dict(os.environ)
    paths = [str(REPO / "src"), str(REPO / "collectors")]
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


def run(workdir: Path) -> dict:
    """Run the driver in ``workdir``; returns its ground truth (``run_dir`` in it).

    Raises AssertionError if the driver fails (its output in the message)."""
    truth_file = workdir / "truth.json"
    cmd = [
        sys.executable,
        str(DRIVER),
        "--workdir", str(workdir),
        "--truth-file", str(truth_file),
        "--job-name", JOB,
        "--steps", str(STEPS),
        "--ckpt-every", str(CKPT_EVERY),
        "--eval-every", "40",
        "--log-every", "5",
        "--step-sleep", str(STEP_SLEEP_S),
        "--min-checkpoints", "1",
        "--kill-at-step", str(KILL_AT_STEP),
        "--restart-delay", str(RESTART_DELAY_S),
        "--flush-interval", str(FLUSH_INTERVAL_S),
        "--timeout", "150",
    ]  # fmt: skip
    res = subprocess.run(
        cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=180, check=False
    )
    assert res.returncode == 0, f"driver failed:\n{res.stdout}\n{res.stderr}"
    return json.loads(truth_file.read_text())
