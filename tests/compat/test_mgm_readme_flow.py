"""``goodput.mgm`` on the ml-goodput-measurement README's flow, as a user who changed one
import runs it: the calculator, the monitor's TensorBoard scalars and ``goodput report
--definitions mgm`` give one number for the job, the incumbent's, with the incumbent's
keys.

The flow runs in a real process (``mgm_readme_child.py``): recorder calls at real times,
``goodput.mgm``'s ``GoodputMonitor`` uploading every second, and the same calls, at the
same times, through ml-goodput-measurement 0.2.3's own recorder (its log is the oracle).
Compared, for a job that records its end (the monitor's final upload after it) and for a
job killed in step 5 (a monitor started afterwards, whose stop makes one upload; the job
is measured up to its last sign of life on every surface):

- ``GoodputCalculator(...).get_job_goodput(include_badput_breakdown=True)`` with its
  default definitions; ``get_job_goodput_details()``;
- the last point of every TensorBoard tag the monitor wrote;
- ``goodput report --definitions mgm --format json``;
- mgm 0.2.3's calculator over its own entries (its clock at the same end).

Goodput and every badput percentage agree within 0.01 points across the three surfaces
and the incumbent; the breakdown's keys (and the TensorBoard tags) are exactly 0.2.3's.
"""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

mgm = pytest.importorskip("ml_goodput_measurement.src.goodput")
pytest.importorskip("tensorboard")

from mgm_oracle import MemoryLogs  # noqa: E402
from test_mgm_scenarios import _Clock  # noqa: E402

from goodput.mgm import goodput as ours  # noqa: E402
from goodput.mgm import monitoring  # noqa: E402
from goodput_processor import cli  # noqa: E402

CHILD = Path(__file__).resolve().parents[1] / "mgm_readme_child.py"
JOB = "readme-job"
POINTS = 0.01  # percentage points
UTC = datetime.timezone.utc


def _run_child(tmp_path: Path, mode: str) -> tuple[Path, Path, list[dict]]:
    run, tb, entries = tmp_path / "run", tmp_path / "tb", tmp_path / "entries.jsonl"
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith(("GOODPUT_", "OTEL_", "RANK", "WORLD_SIZE"))}
    p = subprocess.Popen([sys.executable, str(CHILD), str(run), str(tb), str(entries), mode],
                         stdout=subprocess.PIPE, text=True, env=env)
    try:
        if mode == "kill":
            assert p.stdout.readline().strip() == "READY"
            time.sleep(0.5)  # a few flush intervals: what it recorded is on disk
            p.send_signal(signal.SIGKILL)
            assert p.wait(30) == -signal.SIGKILL
            # silent for more than 3 flush intervals: killed, not running (a job seen alive
            # that recently is measured up to each query's own *now*)
            time.sleep(1.0)
        else:
            assert p.wait(120) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return run, tb, [json.loads(line) for line in entries.read_text().splitlines()]


def _scalars(tb: Path) -> dict[str, float]:
    """The last point of each scalar tag under ``tb/goodput``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tb / "goodput"), size_guidance={"scalars": 0})
    ea.Reload()
    return {t: ea.Scalars(t)[-1].value for t in ea.Tags()["scalars"]}


def _tags(breakdown: dict) -> dict[str, float]:
    """The incumbent monitor's tags for a breakdown (``monitoring.py`` 0.2.3)."""
    out = {}
    for k, v in breakdown.items():
        name = getattr(k, "name", k).lower()
        if isinstance(v, dict):
            out.update({f"badput/{name}/{sub.lower()}": x for sub, x in v.items()})
        else:
            out[f"badput/{name}"] = v
    return out


def _report(run: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["report", str(run), "--definitions", "mgm", "--format", "json",
                     "--no-cache"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)["jobs"]
    return doc


def _incumbent(entries, end: datetime.datetime, tmp_path, monkeypatch):
    """mgm 0.2.3's ``get_job_goodput(True)`` over its entries, its clock at ``end``."""
    clock = _Clock()
    monkeypatch.setattr(mgm, "datetime", clock.module)
    clock.at = end
    calc = mgm.GoodputCalculator(JOB, "log", MemoryLogs(entries, mgm.get_timestamp_from_log_entry),
                                 cache_dir=str(tmp_path / "mgm-cache"))
    return calc.get_job_goodput(include_badput_breakdown=True)


def _agree(a: dict[str, float], b: dict[str, float], what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: {sorted(a)} != {sorted(b)}"
    for k, v in b.items():
        assert abs(a[k] - v) <= POINTS, f"{what} {k}: {a[k]} vs {v}"


@pytest.mark.parametrize("mode", ["end", "kill"])
def test_calculator_monitor_and_report_agree_with_the_incumbent(mode, tmp_path, capsys,
                                                                monkeypatch):
    run, tb, entries = _run_child(tmp_path, mode)
    if mode == "kill":  # a monitor afterwards: its stop makes one upload, as of now
        monitoring.GoodputMonitor(JOB, f"goodput_{JOB}", str(tb), 30, monitoring_enabled=True,
                                  include_badput_breakdown=True,
                                  run_dir=run).stop_goodput_uploader()
    calc = ours.GoodputCalculator(job_name=JOB, logger_name=f"goodput_{JOB}", run_dir=run)
    good, breakdown, last_step = calc.get_job_goodput(include_badput_breakdown=True)
    details = calc.get_job_goodput_details()
    doc = _report(run, capsys)
    scalars = _scalars(tb)

    # the job's end, the same on every surface: its job end, or its last sign of life
    start = min(mgm.get_timestamp_from_log_entry(e) for e in entries)
    end = start + datetime.timedelta(seconds=doc["total_time_s"])
    assert details["total_elapsed_time"] == pytest.approx(doc["total_time_s"], abs=1e-6)
    theirs_good, theirs_breakdown, theirs_last = _incumbent(entries, end, tmp_path,
                                                            monkeypatch)

    # the keys: exactly 0.2.3's (enum members by name, custom types nested)
    assert {k.name for k in breakdown} == {k.name for k in theirs_breakdown}
    assert ours.BadputType.TRAINING_SLOWDOWN not in breakdown
    assert set(details["badput_time"]) <= set(breakdown)
    # one number on every surface, the incumbent's
    assert abs(good - theirs_good) <= POINTS
    assert abs(scalars.pop("goodput/goodput") - good) <= POINTS
    assert abs(doc["goodput_percent"] - good) <= POINTS
    mine = _tags(breakdown)
    _agree(mine, _tags(theirs_breakdown), "calculator vs incumbent")
    _agree(scalars, mine, "TensorBoard vs calculator")
    _agree(_tags(doc["badput_percent"]), mine, "report vs calculator")
    assert last_step == theirs_last == doc["max_productive_step"]
    assert last_step == (9 if mode == "end" else 4)

    # this project's model is one argument away, with its own key
    native = ours.GoodputCalculator(JOB, run_dir=run, definitions="goodput")
    assert ours.BadputType.TRAINING_SLOWDOWN in native.get_job_goodput(True)[1]


def test_the_final_upload_counts_what_the_recorder_still_holds(tmp_path):
    """The recorder writes its spool every 30 s here; stopping the monitor right after the
    steps uploads them all the same: the final upload first writes the recorder's spool."""
    import goodput

    t0 = datetime.datetime.now(UTC) - datetime.timedelta(seconds=60)
    run = tmp_path / "run"
    rec = ours.GoodputRecorder(JOB, f"goodput_{JOB}", logging_enabled=True, run_dir=run,
                               flush_interval_s=30)
    try:
        rec.record_job_start_time(t0)  # (written at once)
        for step in range(4):
            rec.record_step_start_time(step, t0 + datetime.timedelta(seconds=1 + 2 * step))
        monitor = monitoring.GoodputMonitor(JOB, f"goodput_{JOB}", str(tmp_path / "tb"), 30,
                                            monitoring_enabled=True, run_dir=run)
        monitor.stop_goodput_uploader()
        assert monitor.errors == 0
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        ea = EventAccumulator(str(tmp_path / "tb" / "goodput"))
        ea.Reload()
        (point,) = ea.Scalars("goodput/goodput")
        assert point.step == 2  # steps 0-2 ended; step 3 runs (no job end)
    finally:
        goodput.shutdown()
