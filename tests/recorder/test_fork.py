"""A forked child never writes into its parent's spool (issue 38, "Fork-safe recorder").

Each case is a real training script in its own OS process: it configures the recorder,
records ten steps, and part way through makes a child by ``os.fork`` (exiting normally,
so its interpreter runs the exit hooks it inherited), by ``multiprocessing``'s ``fork``
and ``forkserver`` start methods, or as ``torch.utils.data.DataLoader`` workers. The
parent's report must equal the one of the same script without a child; a child's records,
if it keeps any, must be a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from goodput_processor.account.accounting import account
from goodput_processor.read.reader import read_run_dir

SCRIPT = textwrap.dedent("""
    import multiprocessing, os, sys, time
    import goodput

    def child_records(run_dir=None):
        for i in range(1000, 1003):
            with goodput.step(i):
                time.sleep(0.01)

    def child_configures(run_dir):
        goodput.configure("forkjob", run_dir=run_dir, flush_interval_s=0.05)
        child_records()
        goodput.shutdown()

    def main(mode, run_dir):
        goodput.configure("forkjob", run_dir=run_dir, flush_interval_s=0.05)
        children = []
        for i in range(10):
            if i == 4 and mode == "bare":
                pid = os.fork()
                if pid == 0:
                    time.sleep(0.05)
                    sys.exit(0)  # a normal exit: the exit hooks run
                children.append(pid)
            elif i == 4 and mode == "bare_records":
                pid = os.fork()
                if pid == 0:
                    child_records()
                    goodput.flush()
                    sys.exit(0)
                children.append(pid)
            elif i == 4 and mode == "bare_configures":
                pid = os.fork()
                if pid == 0:
                    child_configures(run_dir)
                    sys.exit(0)
                children.append(pid)
            elif i == 4 and mode in ("mp_fork", "forkserver"):
                ctx = multiprocessing.get_context("fork" if mode == "mp_fork" else "forkserver")
                p = ctx.Process(target=child_records if mode == "mp_fork" else child_configures,
                                args=(run_dir,))
                p.start()
                p.join()
                assert p.exitcode == 0, p.exitcode
            if i == 2 and mode == "dataloader":
                import torch
                from torch.utils.data import DataLoader, TensorDataset
                loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2,
                                    multiprocessing_context="fork")
                assert sum(int(b[0].sum()) for b in loader) == sum(range(64))
            with goodput.step(i):
                time.sleep(0.02)
        for pid in children:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        print("PARENT", os.getpid())

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
""")


def _run(tmp_path, mode: str):
    run_dir = tmp_path / mode
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("GOODPUT_RUN_DIR", None)
    proc = subprocess.run([sys.executable, str(script), mode, str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = int(proc.stdout.split("PARENT")[1].split()[0])
    return run_dir, parent, proc.stderr


def _summary(job) -> dict:
    r = account(job)
    return {"attempts": [(a.attempt, a.end_reason, a.processes) for a in r.attempts],
            "kept": r.step_time.count, "max_step": r.max_productive_step,
            "skipped": {k: v for k, v in r.skipped.items() if v}, "processes": len(job.processes)}


def _files_of(run_dir, pid: int) -> list[str]:
    return sorted(p.name for p in run_dir.rglob("spans-*") if f"-{pid}-" in p.name)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    run_dir, parent, _ = _run(tmp_path_factory.mktemp("fork"), "none")
    return _summary(read_run_dir(run_dir).jobs["forkjob"])


def test_baseline_is_one_clean_attempt(baseline):
    assert baseline == {"attempts": [(0, "exit", 1)], "kept": 10, "max_step": 9,
                        "skipped": {}, "processes": 1}


@pytest.mark.parametrize("mode", ["bare", "bare_records", "mp_fork", "dataloader"])
def test_a_forked_child_leaves_the_parents_report_unchanged(tmp_path, baseline, mode):
    run_dir, parent, stderr = _run(tmp_path, mode)
    job = read_run_dir(run_dir).jobs["forkjob"]
    assert _summary(job) == baseline
    others = [p.name for p in run_dir.rglob("spans-*") if f"-{parent}-" not in p.name]
    assert others == []  # no child wrote a file of its own
    said = stderr.count("records nothing through the recorder it inherited")
    assert said == (1 if mode in ("bare_records", "mp_fork") else 0)


@pytest.mark.parametrize("mode", ["bare_configures", "forkserver"])
def test_a_child_that_configures_records_as_a_process_of_its_own(tmp_path, mode):
    run_dir, parent, stderr = _run(tmp_path, mode)
    spans = read_run_dir(run_dir)
    job = spans.jobs["forkjob"]
    pids = {p.pid for p in job.processes.values()}
    assert parent in pids and len(pids) == 2  # the parent and the child, apart
    assert _files_of(run_dir, parent)
    child = next(p for p in job.processes.values() if p.pid != parent)
    mine = next(p for p in job.processes.values() if p.pid == parent)
    from goodput_processor.read.rows import C_IVAL, C_KIND, K_STEP

    steps = sorted({int(v) for k, v in zip(mine.data[:, C_KIND], mine.data[:, C_IVAL],
                                          strict=True) if k == K_STEP})
    assert steps == list(range(10))  # the parent's own steps (and open records of them)
    child_steps = sorted({int(v) for k, v in zip(child.data[:, C_KIND], child.data[:, C_IVAL],
                                                strict=True) if k == K_STEP})
    assert child_steps == [1000, 1001, 1002]
    assert job.skipped.get("duplicate", 0) == 0
    assert not any(job.skipped.values())
