"""Session fixtures: expensive real setups that several test modules only read.

Each is made once per ``pytest`` session (real processes, the real ``goodput import``) and
handed to every module that asks; the tests read what it made and write nothing into it
but the reader's own cache (``.goodput-cache``), as any report does.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def crash_restart_truth(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The driver's ground truth of one real SIGKILL-and-restart PyTorch run
    (``tests/crash_run.py``); the spool is under ``truth["run_dir"]``. Skips without torch
    and scikit-learn; AssertionError if the driver fails."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "sklearn")):
        pytest.skip("the example needs torch and scikit-learn (pip install goodput-otel[examples])")
    import crash_run

    return crash_run.run(tmp_path_factory.mktemp("crash-restart"))


@pytest.fixture(scope="session")
def resiliency_112(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of issue 36's own case: a ``resiliency`` event log of 112 nodes and
    68 launches (``benchmarks/resiliency_logs.py --nodes 112 --attempts 68 --seed 1``)
    through the real ``goodput import`` (one job, ``llm-112``)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    import resiliency_logs

    from goodput_processor.cli import main

    tmp = tmp_path_factory.mktemp("res112")
    resiliency_logs.write_log(tmp / "log.jsonl", resiliency_logs.generate(
        1, resiliency_logs.Config(nodes=112, attempts=68)))
    assert main(["import", str(tmp / "log.jsonl"), "--to", str(tmp / "runs")]) == 0
    return tmp / "runs" / "llm-112"
