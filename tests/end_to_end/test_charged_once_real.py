"""Acceptance (issue 36, part 2): a real job killed twice before its first checkpoint, then
the same run directory with a second run of the job: the per-host badput plus the
unattributed part equal the job's badput to the nanosecond, and no two recovery phases
overlap.

Real OS processes (``tests/restart_child.py``, the recorder and its spool), SIGKILLed once
the run directory shows two of their steps (0.2 s steps: the first checkpoint, at step 10,
is two seconds away), restarted from scratch; the report is the real reader and accounting.
About 20 s.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from charged_once import check_charged_once

from goodput_processor import read_run_dir
from goodput_processor.html.segments import bucket_segments
from goodput_processor.read.rows import C_KIND, K_STEP

CHILD = Path(__file__).resolve().parents[1] / "restart_child.py"
JOB = "twice"


def _steps_seen(run: Path) -> int:
    try:
        jobs = read_run_dir(run).jobs
    except Exception:  # noqa: BLE001 - nothing written yet
        return 0
    return sum(int((p.data[:, C_KIND] == K_STEP).sum()) for j in jobs.values()
               for p in j.processes.values())


def _killed_before_checkpoint(run: Path) -> None:
    """One attempt: start the child, SIGKILL it once two more steps are on disk."""
    before = _steps_seen(run)
    p = subprocess.Popen([sys.executable, str(CHILD), JOB, str(run), "--step-seconds", "0.2",
                          "--max-seconds", "60"], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _steps_seen(run) < before + 2:
            assert p.poll() is None and time.monotonic() < deadline, "child ended early"
            time.sleep(0.1)
    finally:
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate(timeout=30)
    assert "checkpoint" not in out  # killed before its first checkpoint


def _to_the_end(run: Path) -> None:
    out = subprocess.run([sys.executable, str(CHILD), JOB, str(run), "--steps", "12"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "checkpoint 10" in out


def _report(run: Path):
    (job,) = read_run_dir(run).jobs.values()
    segs = bucket_segments(job)
    check_charged_once(segs)  # windows disjoint, phases inside, hosts + rest == badput
    return segs.result


def _phase_intervals(r) -> list[tuple[int, int]]:
    """Each recovery's phases as intervals on the timeline (ns): detection, termination,
    rescheduling and startup are laid end to end from the failed attempt's end back and the
    next one's start on; the rest fill the window to its end."""
    out = []
    by = {a.attempt: a for a in r.attempts}
    for rec in r.recovery:
        a, nxt = by[rec.attempt], by[rec.next_attempt]
        ns = {k: round((v or 0) * 1e9) for k, v in rec.phases.items()}
        t = a.end_ns - ns["termination"] - ns["detection"]
        for k, start in (("detection", t), ("termination", t + ns["detection"])):
            out.append((start, start + ns[k]))
        out.append((a.end_ns, nxt.start_ns))
        out.append((nxt.start_ns, rec.window_ns[1]))  # startup .. the window's end
    return out


def test_killed_twice_before_the_first_checkpoint_then_a_second_run(tmp_path):
    run = tmp_path / "run"
    _killed_before_checkpoint(run)
    _killed_before_checkpoint(run)
    _to_the_end(run)
    r = _report(run)
    assert len(r.attempts) == 3 and len(r.recovery) == 2
    assert [a.steps_kept for a in r.attempts] == [0, 0, 12]
    c = r.badput_charged
    hosts = sum(h.badput_ns for h in (*r.host_badput, *r.host_badput_inferred))
    assert hosts + c["unattributed_ns"] == r.total_ns - r.buckets_ns["productive"]
    assert hosts <= r.total_ns
    # the second run of the job in the same run directory
    _killed_before_checkpoint(run)
    _to_the_end(run)
    r = _report(run)
    assert len(r.attempts) == 5 and len(r.recovery) == 4
    c = r.badput_charged
    hosts = sum(h.badput_ns for h in (*r.host_badput, *r.host_badput_inferred))
    assert hosts + c["unattributed_ns"] == c["total_badput_ns"] == (
        r.total_ns - r.buckets_ns["productive"])
    assert hosts <= r.total_ns
    ivals = sorted(iv for iv in _phase_intervals(r) if iv[1] > iv[0])
    assert all(b[0] >= a[1] for a, b in zip(ivals, ivals[1:], strict=False)), ivals
